"""Image-similarity and attack-success metrics of the privacy audit.

- :func:`psnr`: peak signal-to-noise ratio per image.
- :func:`ssim`: structural similarity (Wang, Bovik, Sheikh & Simoncelli, IEEE TIP 2004, "Image
  quality assessment: from error visibility to structural similarity").
- :func:`roc_auc`: the Mann-Whitney U statistic, normalised (the area under the ROC curve).
- :func:`best_match`: for each reconstruction, the best score over a set of true images.
- :func:`bootstrap_interval`: a percentile bootstrap interval of a mean over groups (victims) of values
  (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13; resampling groups, then values
  within each, is the two-stage cluster bootstrap of Davison & Hinkley 1997, section 3.8).
- :func:`wilson_interval`: the Wilson score interval of a proportion (Wilson, JASA 1927), which keeps
  its coverage for few trials and proportions at 0 or 1, where the normal approximation collapses.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from fedstyle.errors import ConfigError


def check_images(x: torch.Tensor, y: torch.Tensor | None = None, what: str = "images") -> None:
    """Raise ConfigError unless x (and y) are finite, non-empty (N, C, H, W) tensors of equal shape."""
    for t in (x,) if y is None else (x, y):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ConfigError(f"{what} must be (N, C, H, W) tensors, got {shape}; add a batch dimension")
        if t.numel() == 0:
            raise ConfigError(f"{what} are empty (shape {tuple(t.shape)}); pass at least one image")
        if not torch.isfinite(t).all():
            raise ConfigError(f"{what} contain NaN or inf; clean or clamp them to [0, 1] first")
    if y is not None and x.shape != y.shape:
        raise ConfigError(f"{what} differ in shape: {tuple(x.shape)} vs {tuple(y.shape)}; "
                          "resize or select matching images")


def psnr(x: torch.Tensor, y: torch.Tensor, peak: float = 1.0) -> torch.Tensor:
    """10 log10(peak^2 / MSE) per image, shape (N,), for float images (N, C, H, W) in [0, peak].

    Computed in float64; identical images give +inf.
    """
    check_images(x, y)
    mse = (x.double() - y.double()).pow(2).mean(dim=(1, 2, 3))
    return 10.0 * torch.log10(peak * peak / mse)


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    coords = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2
    g = torch.exp(-(coords * coords) / (2 * sigma * sigma))
    return g / g.sum()


def ssim(x: torch.Tensor, y: torch.Tensor, *, window: int = 11, sigma: float = 1.5, k1: float = 0.01,
         k2: float = 0.03, data_range: float = 1.0) -> torch.Tensor:
    """Mean SSIM per image, shape (N,) (Wang et al. 2004), mean over channels and pixels.

    Local statistics with an ``window`` x ``window`` Gaussian window (sigma 1.5, normalised to sum 1),
    population (1/n) covariances, C1 = (k1 R)^2, C2 = (k2 R)^2. Only the *valid* region is averaged:
    the pixels whose whole window lies inside the image (a border of (window - 1) / 2 = 5 pixels is
    left out). That is exactly what ``skimage.metrics.structural_similarity(gaussian_weights=True,
    sigma=1.5, use_sample_covariance=False, data_range=1)`` averages too (it filters the padded image
    but crops the same border before its mean), so the two agree to float precision. Images must
    be at least ``window`` pixels high and wide.
    """
    check_images(x, y)
    if window % 2 != 1 or window < 3:
        raise ConfigError(f"ssim window must be an odd size >= 3, got {window}")
    if min(x.shape[-2:]) < window:
        raise ConfigError(f"ssim needs images of at least {window}x{window} pixels, got "
                          f"{tuple(x.shape[-2:])}; upsample them or pass a smaller odd window")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, y = x.to(dtype), y.to(dtype)
    channels = x.shape[1]
    g = _gaussian_window(window, sigma, dtype, x.device)
    gh = g.view(1, 1, 1, window).expand(channels, 1, 1, window)
    gv = g.view(1, 1, window, 1).expand(channels, 1, window, 1)

    def blur(t: torch.Tensor) -> torch.Tensor:  # separable 'valid' Gaussian filter per channel
        return F.conv2d(F.conv2d(t, gh, groups=channels), gv, groups=channels)

    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    mx, my = blur(x), blur(y)
    vx = blur(x * x) - mx * mx
    vy = blur(y * y) - my * my
    cxy = blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return s.mean(dim=(1, 2, 3))


def _scores(values, what: str) -> torch.Tensor:
    t = torch.as_tensor(values).detach().reshape(-1).to("cpu", torch.float64)
    if t.numel() == 0:
        raise ConfigError(f"{what} scores are empty; pass at least one score for members and one for non-members")
    if not torch.isfinite(t).all():
        raise ConfigError(f"{what} scores contain NaN or inf; fix the attack's scores before the AUC")
    return t


def roc_auc(member_scores, nonmember_scores) -> float:
    """Area under the ROC curve = P(member score > non-member score) + 0.5 P(equal).

    The normalised Mann-Whitney U statistic from average ranks (ties counted half); a higher score
    means "more likely a member". 0.5 is chance, 1.0 a perfect attack.
    """
    pos = _scores(member_scores, "member")
    neg = _scores(nonmember_scores, "non-member")
    both = torch.cat([pos, neg])
    _, inverse, counts = torch.unique(both, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)
    ranks = (ends - (counts.to(torch.float64) - 1) / 2)[inverse]  # 1-based average ranks
    m, n = pos.numel(), neg.numel()
    u = ranks[:m].sum().item() - m * (m + 1) / 2
    return float(u / (m * n))


def best_match(recon: torch.Tensor, truth: torch.Tensor,
               metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = psnr
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """For each reconstruction, the best ``metric`` (higher is better) over all ``truth`` images.

    Returns (scores (R,), index (R,)): the best score and the index of the truth image achieving it
    (the first one on ties). ``metric(a, b)`` must score image pairs (N, C, H, W) -> (N,).
    """
    check_images(recon, what="reconstructions")
    check_images(truth, what="true images")
    if recon.shape[1:] != truth.shape[1:]:
        raise ConfigError(f"reconstructions {tuple(recon.shape[1:])} and true images {tuple(truth.shape[1:])} "
                          "differ in (C, H, W); resize one of them")
    truth = truth.to(recon.device)
    scores, index = [], []
    for r in recon:
        s = metric(r.unsqueeze(0).expand_as(truth), truth)
        s = s.double()
        s = torch.where(torch.isnan(s), torch.full_like(s, -math.inf), s)
        best = int(torch.argmax(s))
        scores.append(s[best])
        index.append(best)
    return torch.stack(scores), torch.tensor(index, dtype=torch.long, device=recon.device)


def bootstrap_interval(groups, *, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``groups`` (a list of 1-D value tensors, one per victim).

    Each resample draws the groups with replacement and then, within each drawn group, its values with
    replacement (the two-stage cluster bootstrap), and takes the mean over all drawn values; the interval is
    the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those means. One group gives the bootstrap of
    its values; a single value gives (value, value). Deterministic for a ``seed``.
    """
    values = [torch.as_tensor(v, dtype=torch.float64).reshape(-1) for v in groups]
    if not values or any(v.numel() == 0 for v in values):
        raise ConfigError("bootstrap_interval needs at least one non-empty group of values (one per victim)")
    if any(not torch.isfinite(v).all() for v in values):
        raise ConfigError("bootstrap_interval got NaN or inf values; score every victim before the interval")
    if not 0.0 < level < 1.0 or int(resamples) < 1:
        raise ConfigError(f"need 0 < level < 1 and resamples >= 1, got level={level}, resamples={resamples}")
    g = torch.Generator().manual_seed(int(seed))
    lengths = torch.tensor([v.numel() for v in values])
    padded = torch.zeros(len(values), int(lengths.max()), dtype=torch.float64)
    for k, v in enumerate(values):
        padded[k, : v.numel()] = v
    drawn = torch.randint(len(values), (int(resamples), len(values)), generator=g)  # groups, with replacement
    size = lengths[drawn].unsqueeze(-1)  # (B, G, 1)
    within = (torch.rand(*drawn.shape, padded.shape[1], generator=g, dtype=torch.float64) * size).long()
    keep = torch.arange(padded.shape[1]) < size  # each drawn group contributes its own number of values
    means = (padded[drawn.unsqueeze(-1), within] * keep).sum((1, 2)) / keep.sum((1, 2))
    low, high = torch.quantile(means, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(low), float(high)


def wilson_interval(successes: int, trials: int, *, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / trials`` (Wilson 1927):

        (p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n),  z the normal quantile of level.

    3 of 3 senders' domains read gives (0.44, 1.00) at 95 %: "every sender" from three is weak evidence."""
    n, k = int(trials), int(successes)
    if n < 1 or not 0 <= k <= n:
        raise ConfigError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    if not 0.0 < level < 1.0:
        raise ConfigError(f"level must be in (0, 1), got {level}")
    z = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor((1 + level) / 2, dtype=torch.float64)))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)
