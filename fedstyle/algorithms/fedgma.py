"""FedGMA: gradient-masked averaging (Tenison et al., TMLR'23; baselines notes §4).

A drop-in replacement of the server's averaging; local training is FedAvg's. In round t, with
the sampled clients' updates Delta_i = w_i - w^t and aggregation weights p_i (by size, or equal
with ``aggregation=uniform``), element-wise for every trainable parameter:

    Delta_bar = sum_i p_i Delta_i                            the averaged update
    A         = | sum_i q_i sign(Delta_i) |   in [0, 1]      sign agreement
    m         = 1 where A >= tau, else A                     the soft mask (TMLR version)
    w^{t+1}   = w^t + eta_g * m * Delta_bar                  eta_g = ``server_lr``

with q_i = 1/|S| (``sign_weights=uniform``, default, as FedTHE's and a third implementation) or
q_i = p_i (``size``, declearn's). sign(0) = 0, so a coordinate a client left unchanged lowers the
agreement. tau = 0 is FedAvg (with server lr eta_g). With K clients A takes few values (K = 3:
{1/3, 1}), so any tau in (1/3, 1] scales disagreeing coordinates by exactly 1/3.

Only floating-point trainable parameters are masked; BatchNorm running statistics are averaged
plainly and integer counters rounded, as in FedAvg (``reference_code`` masks every entry, see below).

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fedgma.md.
"""

from __future__ import annotations

import torch

from fedstyle.algorithms.base import Algorithm, weighted_average
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method


def masked_update(base: torch.Tensor, updates: list[torch.Tensor], coefs: list[float], sign_coefs: list[float],
                  tau: float, server_lr: float = 1.0, reference: bool = False) -> torch.Tensor:
    """FedGMA's new value of one parameter from the clients' values (docs/methods/fedgma.md)."""
    base32 = base.to(torch.float32)
    mean_delta = torch.zeros_like(base32)
    agreement = torch.zeros_like(base32)
    for weights, p, q in zip(updates, coefs, sign_coefs):
        delta = weights.to(torch.float32) - base32
        mean_delta.add_(delta, alpha=p)
        agreement.add_(torch.sign(delta), alpha=q)
    agreement.abs_()
    if reference:
        mask = (agreement >= tau).to(torch.float32) * (1.0 + agreement)
    else:
        mask = torch.where(agreement >= tau, torch.ones_like(agreement), agreement)
    return (base32 + server_lr * mask * mean_delta).to(base.dtype)


@register_method
class FedGMA(Algorithm):
    """Gradient-masked averaging (docs/methods/fedgma.md)."""

    name = "fedgma"
    label = "FedGMA"
    summary = "FedAvg whose averaged update is masked by the clients' sign agreement (soft mask, threshold tau)"
    paper = "Tenison et al., Gradient masked averaging for federated learning, TMLR 2023"
    HPARAMS = (
        HParam("tau", 0.4, "mask threshold: coordinates with sign agreement >= tau keep the full update", low=0.0,
               high=1.0),
        HParam("server_lr", 1.0, "server learning rate eta_g applied to the masked update", low=0.0),
        HParam("sign_weights", "uniform", "weights of the clients' signs in the agreement: uniform (1/|S|) or size "
               "(the aggregation weights)", choices=("uniform", "size")),
        HParam("reference_code", False, "the FedDG benchmark's / PARDON fork's rule 1[A >= tau] (1 + A) (a scaled "
               "hard mask) instead of the soft mask"),
    )

    def aggregate(self, server, updates):
        out = weighted_average(updates, uniform=self.hp["aggregation"] == "uniform")  # buffers and counters
        sizes = [1.0 if self.hp["aggregation"] == "uniform" else float(u.num_samples) for u in updates]
        coefs = [s / sum(sizes) for s in sizes]
        sign_coefs = [1.0 / len(updates)] * len(updates) if self.hp["sign_weights"] == "uniform" else coefs
        reference = self.hp["reference_code"]
        keys = [k for k in out if k in server.weights] if reference else self.param_keys  # the codes mask every entry
        for key in keys:
            if not reference and not server.weights[key].is_floating_point():
                continue
            out[key] = masked_update(server.weights[key], [u.weights[key] for u in updates], coefs, sign_coefs,
                                     self.hp["tau"], self.hp["server_lr"], self.hp["reference_code"])
        return out
