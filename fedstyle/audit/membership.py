"""Membership inference from shared styles: was this image among the sender's images?

- :func:`nearest_style_score`: styles shared one per image (CCST's per-image style bank, FedDG-GA's
  or StyleDDG's per-image statistics): a member's own style is in the shared set.
- :func:`set_membership_score`: a style summarised over a set (StableFDG's dataset style, a batch
  summary): does the shared mean lean towards the candidate, relative to a reference mean from
  public data of the same kind? The calibration against a reference population is the idea of
  LiRA (Carlini et al., IEEE S&P'22, "Membership Inference Attacks From First Principles"), here
  with the closed form of a mean's pull instead of shadow models (the tracing test of Homer et al.,
  PLoS Genetics 2008, for means of genotype vectors, is the same statistic). Whitened with the
  population's covariance (``precision``, :func:`public_precision`) it is the likelihood-ratio test of
  Sankararaman et al. (Nature Genetics 2009, "Genomic privacy and limits of individual detection in a
  pool"), the most powerful test of a small mean shift for Gaussian vectors.
- :func:`public_precision`: that inverse covariance from public vectors, Ledoit-Wolf shrunk (J.
  Multivariate Analysis 2004, "A well-conditioned estimator for large-dimensional covariance matrices")
  so that it exists when there are fewer public images than dimensions; noise on the release adds to it.
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


def public_precision(vectors: torch.Tensor, extra_variance: float = 0.0) -> torch.Tensor:
    """(D, D) inverse of the Ledoit-Wolf shrunk covariance of public per-image vectors (N, D), plus
    ``extra_variance`` on the diagonal (noise of variance tau^2 on each coordinate of a shared mean of n
    vectors adds n tau^2 to the per-image covariance the score should whiten with).

    Shrinkage (Ledoit & Wolf 2004, Lemma 3.2 / Theorem 3.2): S the 1/N sample covariance, m = tr(S) / D,
    d^2 = ||S - m I||_F^2, b^2 = min(d^2, (1/N^2) sum_k ||x_k x_k' - S||_F^2); covariance
    (b^2 / d^2) m I + (1 - b^2 / d^2) S. One vector, or identical ones, give m I (m = 1 when all is 0)."""
    x = _vectors(vectors, "vectors")
    if not (extra_variance >= 0 and extra_variance < float("inf")):
        raise ConfigError(f"extra_variance must be a finite number >= 0, got {extra_variance}")
    n, d = x.shape
    centred = x - x.mean(0)
    sample = centred.T @ centred / n
    m = float(torch.diagonal(sample).mean())
    target = torch.eye(d, dtype=x.dtype, device=x.device) * (m if m > 0 else 1.0)
    d2 = float((sample - target).pow(2).sum())
    norms = centred.pow(2).sum(1)  # ||x_k x_k' - S||_F^2 = ||x_k||^4 - 2 x_k' S x_k + ||S||_F^2
    spread = norms.pow(2) - 2 * ((centred @ sample) * centred).sum(1) + sample.pow(2).sum()
    b2 = min(d2, float(spread.sum()) / (n * n))
    weight = b2 / d2 if d2 > 0 and m > 0 else 1.0  # no spread at all: the identity
    covariance = weight * target + (1 - weight) * sample
    covariance = covariance + float(extra_variance) * torch.eye(d, dtype=x.dtype, device=x.device)
    return torch.linalg.inv(covariance)


def set_membership_score(candidates: torch.Tensor, shared_mean: torch.Tensor, reference_mean: torch.Tensor,
                         set_size: int, *, scale: bool = True, precision: torch.Tensor | None = None) -> torch.Tensor:
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

    ``precision`` (D, D), e.g. :func:`public_precision`: both distances in that metric,
    (r - c)' P (r - c) - (s - c)' P (s - c). With P the inverse population covariance this is the
    likelihood-ratio test (Sankararaman et al. 2009): coordinates on large scales (second moments beside
    means) no longer drown the others, and correlated ones are not counted twice.
    """
    c = _vectors(candidates, "candidates")
    s = _vectors(shared_mean, "shared_mean", dim=1).to(c.device)
    r = _vectors(reference_mean, "reference_mean", dim=1).to(c.device)
    _same_width(c, s, "candidates and shared_mean")
    _same_width(c, r, "candidates and reference_mean")
    if int(set_size) < 1:
        raise ConfigError(f"set_size must be the number of images behind the shared mean (>= 1), got {set_size}")
    if precision is None:
        score = (r - c).pow(2).sum(1) - (s - c).pow(2).sum(1)
    else:
        p = _vectors(precision, "precision").to(c.device)
        if p.shape != (c.shape[1], c.shape[1]):
            raise ConfigError(f"precision has shape {tuple(p.shape)} but the styles have width {c.shape[1]}; pass "
                              "public_precision() of vectors of the same statistic")
        score = (((r - c) @ p) * (r - c)).sum(1) - (((s - c) @ p) * (s - c)).sum(1)
    return score * int(set_size) if scale else score


def membership_auc(member_scores, nonmember_scores) -> float:
    """ROC AUC of membership scores (higher = member): :func:`fedstyle.audit.metrics.roc_auc`."""
    return roc_auc(member_scores, nonmember_scores)
