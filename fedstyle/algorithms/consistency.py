"""Consistency losses between predictions of the same samples: several views, a local and a global
model (FedGCA's global guided semantic consistency, arXiv:2409.14671, Eq. 2-3).

Inputs are (V, B, ...) stacks: V views (or predictors) of a batch of B samples. Each loss compares
every local member with the mean of the members (the local ones, plus the global model's when
given); sums over the views follow Eq. 2 and 3 (``reduction="sum"``; ``mean`` divides by V), every
term is averaged over the batch. The means carry gradients (as in AugMix's JS loss;
``detach_mean=True`` stops them). Logs clamp their argument at :data:`EPS` (1e-7).

* :func:`prediction_consistency` (L_CP, Eq. 2) over K classes, ``form``:
  ``ce``: Eq. 2 as printed, -Σ_j Σ_k [p_jk log p̄_k + (1 - p_jk) log(1 - p̄_k)];
  ``bkl``: Eq. 2 minus the binary entropy of the local predictions (which only sharpens them), i.e.
  Σ_j Σ_k [p log(p / p̄) + (1 - p) log((1 - p) / (1 - p̄))], zero exactly when every prediction agrees
  (the KL divergence the paper's text names);
  ``js``: RandConv's / AugMix's Jensen-Shannon form Σ_j KL(p_j ‖ p̄) over classes.
* :func:`cam_consistency` (L_CAM, Eq. 3): Σ_j KL(M_j ‖ M̄) of class-activation-map distributions over
  the h x w positions (:func:`cam_distribution`: a softmax of M / temperature).
* :func:`supervised_contrastive`: the supervised contrastive loss (Khosla et al. NeurIPS'20) between the
  representations of one view and of the originals (FedCCRL's representation alignment).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedstyle.errors import ConfigError

#: floor of the probabilities inside logs
EPS = 1e-7


def _xlogx(t: torch.Tensor) -> torch.Tensor:
    """t log t with 0 log 0 = 0 and finite gradients at 0 (softmax outputs underflow to exactly 0 or 1)."""
    return t * t.clamp_min(1e-30).log()


def _combine(per_view: torch.Tensor, reduction: str) -> torch.Tensor:
    """(V, B) per-view, per-sample losses -> mean over the batch, then sum (Eq. 2, 3) or mean over views."""
    per_view = per_view.mean(1)
    return per_view.sum() if reduction == "sum" else per_view.mean()


def _mean_of(local: torch.Tensor, other: torch.Tensor | None, detach: bool) -> torch.Tensor:
    members = local if other is None else torch.cat([local, other])
    mean = members.mean(0)
    return mean.detach() if detach else mean


def prediction_consistency(p_local: torch.Tensor, p_global: torch.Tensor | None = None, form: str = "bkl",
                           reduction: str = "sum", detach_mean: bool = False) -> torch.Tensor:
    """L_CP (Eq. 2) of softmax predictions ``p_local`` (V, B, K) of the local model on V views, with the
    global model's ``p_global`` (V, B, K) in the mean p̄ (or None). Forms: see the module docstring."""
    mean = _mean_of(p_local, p_global, detach_mean)
    log_mean = mean.clamp_min(EPS).log()
    if form == "js":
        per = (_xlogx(p_local) - p_local * log_mean).sum(-1)
    elif form in ("ce", "bkl"):
        log_rest = (1.0 - mean).clamp_min(EPS).log()
        per = -(p_local * log_mean + (1.0 - p_local) * log_rest).sum(-1)
        if form == "bkl":
            per = per + (_xlogx(p_local) + _xlogx(1.0 - p_local)).sum(-1)
    else:
        raise ConfigError(f"unknown cp_form {form!r}; choose bkl, ce or js")
    return _combine(per, reduction)


def cam_distribution(cams: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(N, h, w) class activation maps -> (N, h*w) distributions: softmax over positions of M / temperature."""
    return torch.softmax(cams.flatten(1) / temperature, dim=1)


def cam_consistency(m_local: torch.Tensor, m_global: torch.Tensor | None = None, reduction: str = "sum",
                    detach_mean: bool = False) -> torch.Tensor:
    """L_CAM (Eq. 3): Σ_j KL(M_j ‖ M̄) of CAM distributions ``m_local`` (V, B, h*w), M̄ the mean of the
    local and (if given) the global model's maps ``m_global`` (V, B, h*w)."""
    mean = _mean_of(m_local, m_global, detach_mean)
    per = (_xlogx(m_local) - m_local * mean.clamp_min(EPS).log()).sum(-1)
    return _combine(per, reduction)


def supervised_contrastive(views: torch.Tensor, originals: torch.Tensor, labels: torch.Tensor, temperature: float,
                           include_self: bool = False) -> torch.Tensor:
    """SupCon (Khosla et al. NeurIPS'20, Eq. 2, L_out) over the 2B L2-normalised representations
    z = [views; originals] (each (B, D)) with labels [labels; labels]:

        L = mean_i [ log sum_{a != i} exp(z_i . z_a / tau) - mean_{p in P(i)} z_i . z_p / tau ],

    P(i) the samples other than i with i's label (never empty: i's counterpart in the other half). ``include_self``:
    P(i) also holds i itself (z_i . z_i / tau = 1 / tau), as FedCCRL's code computes it
    (SanphouWang/FedCCRL algorithm/client/fedccrl.py:137-144: the same-label mask keeps the diagonal)."""
    z = F.normalize(torch.cat([views, originals]), dim=1)
    y = torch.cat([labels, labels])
    sim = z @ z.T / temperature
    diagonal = torch.eye(len(y), dtype=torch.bool, device=z.device)
    positives = (y[:, None] == y[None, :]) & (~diagonal if not include_self else torch.ones_like(diagonal))
    log_denominator = torch.logsumexp(sim.masked_fill(diagonal, float("-inf")), dim=1)
    positive_mean = (sim * positives).sum(1) / positives.sum(1)
    return (log_denominator - positive_mean).mean()
