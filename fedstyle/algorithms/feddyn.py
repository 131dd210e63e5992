"""FedDyn (Acar et al., ICLR'21): dynamic regularisation that aligns local and global optima.

Client i keeps grad_i (starts at 0). Local loss = task loss − <grad_i, w> + (alpha/2)·||w − w_server||²;
after local training grad_i ← grad_i − alpha·(w_i − w_server). The server keeps h (starts at 0):
h ← h − (alpha/m)·Σ_{i∈S}(w_i − w_server) with m the number of all clients, and
w_server = mean_{i∈S}(w_i) − h/alpha (unweighted mean, Algorithm 1 of the paper). BatchNorm
running statistics are averaged as in FedAvg. FedGCA's class-consistency term (its Eq. 5) is the
same regulariser, so :class:`DynamicRegularizer` is shared.

The authors' code (alpemreacar/FedDyn, utils_methods.py ``train_FedDyn`` and utils_general.py
``train_feddyn_mdl``) computes the same client loss and server step, with two choices the paper does not
state, which ``reference_code=true`` selects:

- ``alpha_scaling=data_size``: client i trains with alpha_i = alpha · n̄ / n_i, n̄ the mean client size
  (utils_methods.py:296-297, 387, "adaptive alpha coef"). Its gradient term accumulates with alpha_i too,
  and the server step is unchanged (it does not depend on alpha there). The clients' sizes reach the server
  in a setup exchange, which sends each client its alpha_i / alpha. In a deployment the mean is over the sites
  that answered the exchange (a site that joins later gets the same broadcast);
- ``clip_grad_norm=10``: every local step clips the gradient's norm at 10 (utils_general.py:8, 224).

The code also writes (alpha/2)·||w||² as SGD weight decay and the rest of the quadratic as a linear term.
Without clipping the gradient is the same; with it, alpha·w joins after the clip (``training_step``; parity:
docs/parity.md).

Its card, with hyperparameters, results and parity: docs/methods/feddyn.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm, apply_reference_code, weighted_average
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import FedstyleError

_GRAD = "feddyn/grad"
#: alpha_i / alpha of this client (``alpha_scaling=data_size``), from the setup exchange
_SCALE = "feddyn/alpha_scale"
#: this call's downloaded weights (one vector) and alpha_i, in ``ctx.scratch`` (per call, never checkpointed)
_ANCHOR, _ALPHA = "feddyn/anchor", "feddyn/alpha"
#: reference_code=true: the public code's choices for the hyperparameters not given explicitly
REFERENCE = {"alpha_scaling": "data_size", "clip_grad_norm": 10.0}


def flatten(tensors) -> torch.Tensor:
    """One vector of all tensors (``reshape``, not torch's ``parameters_to_vector``: it cannot view channels-last weights)."""
    return torch.cat([t.reshape(-1) for t in tensors])


class DynamicRegularizer:
    """FedDyn's client term and server correction, usable by any algorithm."""

    def __init__(self, alpha: float):
        self.alpha = alpha

    def init_client(self, ctx, model) -> None:
        ctx.state[_GRAD] = torch.zeros_like(flatten(model.parameters())).detach()

    def anchor(self, ctx, model) -> torch.Tensor:
        """The downloaded parameters as one vector (w_server of this round)."""
        return flatten([ctx.global_weights[name] for name, _ in model.named_parameters()]).detach()

    def client_alpha(self, ctx, scaled: bool = False) -> float:
        """alpha_i: alpha, times the client's scale from the setup exchange when ``scaled``
        (``alpha_scaling=data_size``; a client without one is an error, never the plain alpha)."""
        if not scaled:
            return self.alpha
        scale = ctx.state.get(_SCALE)
        if scale is None:
            raise FedstyleError(f"FedDyn with alpha_scaling=data_size: client {ctx.client_id} has no scale from the "
                                "setup exchange; the runtime skipped the exchange (a bug), or the client's state was "
                                "lost: start the run again")
        return self.alpha * float(scale)

    def penalty(self, ctx, model, anchor: torch.Tensor, alpha: float | None = None) -> torch.Tensor:
        """-<grad_i, w> + (alpha_i/2)·||w - w_server||², alpha_i = ``alpha`` (default: the regulariser's alpha)."""
        alpha = self.alpha if alpha is None else alpha
        w = flatten(model.parameters())
        grad = ctx.state[_GRAD].to(w.device)
        return -torch.dot(grad, w) + 0.5 * alpha * torch.sum((w - anchor) ** 2)

    @torch.no_grad()
    def update_client(self, ctx, model, anchor: torch.Tensor, alpha: float | None = None) -> None:
        alpha = self.alpha if alpha is None else alpha
        w = flatten(model.parameters())
        ctx.state[_GRAD] = ctx.state[_GRAD].to(w.device) - alpha * (w - anchor)

    @torch.no_grad()
    def aggregate(self, server, updates, param_keys, uniform: bool) -> dict[str, torch.Tensor]:
        out = weighted_average(updates, uniform=uniform)  # buffers; parameters replaced below
        m = server.num_clients
        for key in param_keys:
            old = server.weights[key].float()
            mean = torch.stack([u.weights[key].float() for u in updates]).mean(0)
            drift = torch.stack([u.weights[key].float() - old for u in updates]).sum(0)
            h = server.state.get(f"feddyn/h/{key}", torch.zeros_like(old)) - (self.alpha / m) * drift
            server.state[f"feddyn/h/{key}"] = h
            out[key] = (mean - h / self.alpha).to(server.weights[key].dtype)
        return out


@register_method
class FedDyn(Algorithm):
    name = "feddyn"
    family = "FL heterogeneity"
    shares = "weights"
    label = "FedDyn"
    summary = "federated learning with dynamic regularisation (client gradient correction + server state)"
    paper = "Acar et al., Federated learning based on dynamic regularization, ICLR 2021"
    HPARAMS = (
        HParam("alpha", 0.01, "FedDyn regularisation strength alpha", low=1e-12),
        HParam("alpha_scaling", "none", "none: every client uses alpha (the paper); data_size: client i uses "
               "alpha x mean client size / its size (the authors' code), the sizes sent in a setup exchange",
               choices=("none", "data_size")),
        HParam("clip_grad_norm", 0.0, "clip each local step's gradient norm at this value; 0: no clipping (the "
               "paper); the authors' code clips at 10", low=0.0),
        HParam("reference_code", False, "the authors' code's choices: alpha_scaling=data_size, clip_grad_norm=10"),
    )

    def __init__(self, hparams=None, *, num_classes, num_clients):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        self.regularizer = DynamicRegularizer(self.hp["alpha"])

    @classmethod
    def resolve(cls, given):
        return apply_reference_code(super().resolve(given), given, REFERENCE)

    def uses_phase(self, phase: str) -> bool:
        if phase == "setup":  # the clients' sizes, for alpha_i; none under the paper's single alpha
            return self.hp["alpha_scaling"] == "data_size"
        return super().uses_phase(phase)

    def setup_upload(self, ctx, model):
        return {"num_samples": torch.tensor([float(len(ctx.data))], dtype=torch.float64)}

    def setup_broadcast(self, uploads, server):
        sizes = torch.cat([u["num_samples"] for _, u in sorted(uploads.items())])
        return {"mean_size": sizes.mean()}

    def setup_download(self, ctx, model, broadcast):
        # float32: client state moves to the training device, and Apple's MPS holds no float64
        ctx.state[_SCALE] = (broadcast["mean_size"] / float(len(ctx.data))).to(torch.float32)

    def init_client_state(self, ctx, model):
        self.regularizer.init_client(ctx, model)

    def local_train(self, ctx, model, payload):
        ctx.scratch[_ANCHOR] = self.regularizer.anchor(ctx, model)
        # once per call, not per step: on a GPU, reading the state's scale is a host synchronisation
        ctx.scratch[_ALPHA] = self.regularizer.client_alpha(ctx, scaled=self.hp["alpha_scaling"] == "data_size")
        return super().local_train(ctx, model, payload)

    def training_loss(self, ctx, model, x, y, payload):
        penalty = self.regularizer.penalty(ctx, model, ctx.scratch[_ANCHOR], ctx.scratch[_ALPHA])
        return F.cross_entropy(model(x), y) + penalty

    def training_step(self, ctx, model, optimizer, x, y, payload):
        """With ``clip_grad_norm``, the code's step (utils_general.py:190, 219-225): the quadratic's
        (alpha_i/2)·||w||² is SGD weight decay there, so its gradient alpha_i·w joins after the clip; the loss
        that is clipped is CE + alpha_i·<w, -w_server> - <grad_i, w>. Without clipping the two steps are equal."""
        if not self.hp["clip_grad_norm"]:
            return super().training_step(ctx, model, optimizer, x, y, payload)
        params = [p for p in model.parameters() if p.requires_grad]
        alpha, anchor = ctx.scratch[_ALPHA], ctx.scratch[_ANCHOR]
        w = flatten(model.parameters())
        linear = -torch.dot(ctx.state[_GRAD].to(w.device), w) - alpha * torch.dot(anchor, w)
        loss = F.cross_entropy(model(x), y) + linear
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=self.hp["clip_grad_norm"])
        with torch.no_grad():
            for p in params:
                p.grad.add_(p, alpha=alpha)  # the weight decay's alpha_i, unclipped
            quadratic = 0.5 * alpha * (torch.sum(w.detach() ** 2) + torch.sum(anchor ** 2))
        optimizer.step()
        return (loss.detach() + quadratic).detach()  # the paper's loss: CE + the whole penalty

    def after_local_train(self, ctx, model):
        self.regularizer.update_client(ctx, model, ctx.scratch[_ANCHOR], ctx.scratch[_ALPHA])

    def aggregate(self, server, updates):
        return self.regularizer.aggregate(server, updates, self.param_keys, self.hp["aggregation"] == "uniform")
