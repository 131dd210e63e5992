"""MOON (Li, He, Song, CVPR'21): model-contrastive federated learning.

The model is backbone -> projection head (:class:`fedstyle.models.necks.ProjectionNeck`: pooled
features h (d) -> Linear(d, d) -> ReLU -> Linear(d, out_dim) = z) -> classifier on z; head and
classifier are aggregated like the backbone. On the Digits-DG ConvNet h is the flattened last map
(256 features at 32 x 32). Per mini-batch on client i in round t (the paper's Algorithm 1, as the
authors' code runs it):

    z      = R_w(x)                 the local model being trained (train mode: style ops, batch BN)
    z_glob = R_{w^t}(x)             the global model received this round     (frozen, eval mode)
    z_prev = R_{w_i^prev}(x)        client i's model after its last training (frozen, eval mode)
    l_con  = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
    L      = CE(g(z), y) + mu · l_con                       sim = cosine similarity

i.e. cross-entropy over the logits [sim(z, z_glob), sim(z, z_prev)] / tau with target 0. The server
is FedAvg.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/moon.md.
"""

from __future__ import annotations

import copy
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import ConfigError
from fedstyle.models.necks import ProjectionNeck

_PREV = "moon/prev/"


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """MOON's l_con averaged over the batch: z, z_glob (B, D); z_prev (B, D) or (B, K, D) for K negatives."""
    if z_prev.dim() == 2:
        z_prev = z_prev.unsqueeze(1)
    pos = F.cosine_similarity(z, z_glob, dim=-1).unsqueeze(1)  # (B, 1)
    neg = F.cosine_similarity(z.unsqueeze(1), z_prev, dim=-1)  # (B, K)
    logits = torch.cat([pos, neg], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


class _FrozenCopy:
    """One frozen module per model object (eval mode, no gradients) that stored weights are copied into."""

    def __init__(self, model: nn.Module):
        self.module = copy.deepcopy(model)
        for p in self.module.parameters():
            p.requires_grad_(False)
            p.grad = None
        self.module.eval()
        self.tensors = self.module.state_dict()  # views of the module's storage

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor], prefix: str) -> nn.Module:
        for key, target in self.tensors.items():
            target.copy_(state[prefix + key])
        self.module.eval()
        return self.module


@register_method
class MOON(Algorithm):
    name = "moon"
    family = "FL heterogeneity"
    shares = "weights"
    label = "MOON"
    summary = "FedAvg with a model-contrastive loss: local representation towards the global, away from the previous local"
    paper = "Li, He, Song, Model-contrastive federated learning, CVPR 2021"
    HPARAMS = (
        HParam("mu", 1.0, "weight of the model-contrastive loss l_con (the paper: 5 on CIFAR-10, 1 on CIFAR-100)", low=0.0),
        HParam("tau", 0.5, "temperature of the model-contrastive loss (> 0)"),
        HParam("out_dim", 256, "output width of the projection head (the representation z)", low=1),
    )

    def __init__(self, hparams=None, *, num_classes, num_clients):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        if not self.hp["tau"] > 0:
            raise ConfigError(f"hyperparameter 'tau' of moon must be > 0 (the contrastive temperature; "
                              f"the paper uses 0.5), got {self.hp['tau']}")
        self._frozen: "weakref.WeakKeyDictionary[nn.Module, _FrozenCopy]" = weakref.WeakKeyDictionary()

    def configure_model(self, model):
        model.set_neck(ProjectionNeck(model.backbone, self.hp["out_dim"]))
        super().configure_model(model)

    def previous_model(self, ctx, model) -> nn.Module | None:
        """Client ``ctx.client_id``'s model after its last local training, or None before its first."""
        if not any(k.startswith(_PREV) for k in ctx.state):
            return None
        holder = self._frozen.get(model)
        if holder is None:
            holder = self._frozen[model] = _FrozenCopy(model)
        return holder.load(ctx.state, _PREV)

    def local_train(self, ctx, model, payload):
        previous = None
        if self.hp["mu"] > 0:  # mu = 0: FedAvg with the projection head, no previous model kept
            previous = self.previous_model(ctx, model)
            ctx.log("moon_first_participation", float(previous is None))
        ctx.scratch["moon/previous"] = previous
        return super().local_train(ctx, model, payload)

    def training_loss(self, ctx, model, x, y, payload):
        z = model.features(x)
        ce = F.cross_entropy(model.head(z), y)
        ctx.log("moon_ce", ce)
        previous = ctx.scratch.get("moon/previous")
        if previous is None:
            return ce
        with torch.no_grad(), ctx.timed("moon_frozen_forward"):
            z_glob = ctx.global_model().features(x)
            z_prev = previous.features(x)
        con = model_contrastive_loss(z, z_glob, z_prev, self.hp["tau"])
        ctx.log("moon_con", con)
        return ce + self.hp["mu"] * con

    @torch.no_grad()
    def after_local_train(self, ctx, model):
        if self.hp["mu"] == 0:  # l_con off: no previous model needed
            return
        for key, value in model.state_dict().items():
            ctx.state[_PREV + key] = value.detach().clone()
