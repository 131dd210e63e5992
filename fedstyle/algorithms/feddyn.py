"""FedDyn (Acar et al., ICLR'21): dynamic regularisation that aligns local and global optima.

Client i keeps grad_i (starts at 0). Local loss = task loss − <grad_i, w> + (alpha/2)·||w − w_server||²;
after local training grad_i ← grad_i − alpha·(w_i − w_server). The server keeps h (starts at 0):
h ← h − (alpha/m)·Σ_{i∈S}(w_i − w_server) with m the number of all clients, and
w_server = mean_{i∈S}(w_i) − h/alpha (unweighted mean, Algorithm 1 of the paper). BatchNorm
running statistics are averaged as in FedAvg. FedGCA's class-consistency term (its Eq. 5) is the
same regulariser, so :class:`DynamicRegularizer` is shared.

Its card, with hyperparameters, results and parity: docs/methods/feddyn.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm, weighted_average
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method

_GRAD = "feddyn/grad"


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

    def penalty(self, ctx, model, anchor: torch.Tensor) -> torch.Tensor:
        w = flatten(model.parameters())
        grad = ctx.state[_GRAD].to(w.device)
        return -torch.dot(grad, w) + 0.5 * self.alpha * torch.sum((w - anchor) ** 2)

    @torch.no_grad()
    def update_client(self, ctx, model, anchor: torch.Tensor) -> None:
        w = flatten(model.parameters())
        ctx.state[_GRAD] = ctx.state[_GRAD].to(w.device) - self.alpha * (w - anchor)

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
    label = "FedDyn"
    summary = "federated learning with dynamic regularisation (client gradient correction + server state)"
    paper = "Acar et al., Federated learning based on dynamic regularization, ICLR 2021"
    HPARAMS = (HParam("alpha", 0.01, "FedDyn regularisation strength alpha", low=1e-12),)

    def __init__(self, hparams=None, *, num_classes, num_clients):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        self.regularizer = DynamicRegularizer(self.hp["alpha"])
        self._anchor: torch.Tensor | None = None  # per-call scratch: this round's downloaded weights

    def init_client_state(self, ctx, model):
        self.regularizer.init_client(ctx, model)

    def local_train(self, ctx, model, payload):
        self._anchor = self.regularizer.anchor(ctx, model)
        return super().local_train(ctx, model, payload)

    def training_loss(self, ctx, model, x, y, payload):
        return F.cross_entropy(model(x), y) + self.regularizer.penalty(ctx, model, self._anchor)

    def after_local_train(self, ctx, model):
        self.regularizer.update_client(ctx, model, self._anchor)

    def aggregate(self, server, updates):
        return self.regularizer.aggregate(server, updates, self.param_keys, self.hp["aggregation"] == "uniform")
