"""Membership inference from shared styles: was this image among the sender's images?

- :func:`nearest_style_score`: styles shared one per image (CCST's per-image style bank, FedDG-GA's
  or StyleDDG's per-image statistics): a member's own style is in the shared set.
- :func:`set_membership_score`: a style summarised over a set (StableFDG's dataset style, a batch
  summary): does the shared mean lean towards the candidate, relative to a reference mean from
  public data of the same kind? The calibration against a reference population is the idea of
  LiRA (Carlini et al., IEEE S&P'22, "Membership Inference Attacks From First Principles"), here
  with the closed form of a mean's pull instead of shadow models (the tracing test of Homer et al.,
  PLoS Genetics 2008, for means of genotype vectors, is the same statistic).
"""

from __future__ import annotations

import torch

from fedstyle.audit.metrics import roc_auc
from fedstyle.errors import ConfigError


def _vectors(x, what: str, dim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != (1 if dim == 1 else 2):
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        want = "(D,)" if dim == 1 else "(N, D)"
        raise ConfigError(f"{what} must be a {want} tensor of style vectors, got {shape}; flatten each style "
                          "to one row")
    if x.numel() == 0:
        raise ConfigError(f"{what} is empty (shape {tuple(x.shape)}); pass at least one style vector")
    if not torch.isfinite(x).all():
        raise ConfigError(f"{what} contains NaN or inf; drop or repair those styles first")
    return x.detach().double()


def _same_width(a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    if a.shape[-1] != b.shape[-1]:
        raise ConfigError(f"{names} differ in style width ({a.shape[-1]} vs {b.shape[-1]}); compute both "
                          "with the same statistic (same stages and channels)")


def nearest_style_score(candidates: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """Minus the smallest Euclidean distance from each candidate's style (M, D) to a shared one (S, D).

    Higher = more likely a member. Without noise a member's own style is in the shared set and
    scores exactly 0 (the maximum), so a noiseless per-image style bank gives AUC 1. Returns (M,)
    float64 on the candidates' device; distances computed directly (no matmul shortcut, which
    would blur exact zeros).
    """
    c = _vectors(candidates, "candidates")
    s = _vectors(shared, "shared").to(c.device)
    _same_width(c, s, "candidates and shared styles")
    d = torch.cdist(c, s, compute_mode="donot_use_mm_for_euclid_dist")
    return -d.min(dim=1).values


def set_membership_score(candidates: torch.Tensor, shared_mean: torch.Tensor, reference_mean: torch.Tensor,
                         set_size: int, *, scale: bool = True) -> torch.Tensor:
    """set_size * (||ref - c||^2 - ||shared - c||^2) per candidate (M,): how much closer the shared
    mean is to the candidate c than a reference mean of public data from the same distribution.

    Why it works, and why it fades as 1/set_size: the shared mean of n = set_size per-image vectors
    is s = (1/n) sum_i x_i. A member c = x_j pulls s towards itself by (c - m)/n (m the population
    mean), so its expected score exceeds a non-member's by 2 E||c - m||^2 / n = 2 tr(Sigma) / n,
    while the score's spread over candidates, 2 (c - m).(s - ref), stays of order
    2 sqrt(tr(Sigma^2) (1/n + 1/n_ref)). The member/non-member gap thus shrinks as 1/n and the
    signal-to-noise ratio as about sqrt(D_eff / n) (D_eff the effective dimension): AUC -> 0.5 as
    the set grows. With n = 1 the shared "mean" is the member's own vector and it scores highest.

    ``scale``: multiply by set_size (default) so the expected gap is 2 tr(Sigma) at every set
    size and scores of different sets are on one scale; a positive factor, it never changes an
    AUC within one set. A reference mean from a few public images is itself noisy: the more
    public images, the better calibrated the score.
    """
    c = _vectors(candidates, "candidates")
    s = _vectors(shared_mean, "shared_mean", dim=1).to(c.device)
    r = _vectors(reference_mean, "reference_mean", dim=1).to(c.device)
    _same_width(c, s, "candidates and shared_mean")
    _same_width(c, r, "candidates and reference_mean")
    if int(set_size) < 1:
        raise ConfigError(f"set_size must be the number of images behind the shared mean (>= 1), got {set_size}")
    score = (r - c).pow(2).sum(1) - (s - c).pow(2).sum(1)
    return score * int(set_size) if scale else score


def membership_auc(member_scores, nonmember_scores) -> float:
    """ROC AUC of membership scores (higher = member): :func:`fedstyle.audit.metrics.roc_auc`."""
    return roc_auc(member_scores, nonmember_scores)
