"""Which samples of a batch keep their style: k-means++ on the styles (StableFDG Section 3.1, step 2).

StableFDG runs "k-means++ with k = B/2 in the style space for one iteration" on the batch's
per-sample styles [mu, sigma] and keeps the B/2 selected samples' styles, shifting the others.
Here that is, in torch on the batch's device (no scikit-learn, no host synchronisation):

1. **k-means++ seeding** (Arthur & Vassilvitskii, SODA'07): the first centre uniformly, each next
   one with probability proportional to D(x)^2, the squared distance to the nearest centre chosen
   so far. Chosen points have D = 0 and are never drawn again, so the k centres are k distinct
   samples; if every remaining D is 0 (duplicate styles) the next centre is uniform among the
   samples not chosen yet. Draws use the exponential race argmax_i w_i / E_i, E_i ~ Exp(1)
   (P(i) = w_i / sum w), which needs no host synchronisation (torch.multinomial checks its input
   on the host).
2. **one Lloyd iteration**: every sample joins its nearest centre, each centre moves to its
   cluster's mean (a cluster left empty keeps its seed).
3. **selected samples**: in every non-empty cluster, the member nearest the moved centre (ties:
   the lower batch index). Exactly k samples are kept: if duplicates left clusters empty, the
   unselected samples nearest their centres fill up. With k = B/2 clusters most clusters have one
   or two members; a two-member cluster's members are equidistant from its mean, so the lower
   batch index (batches are shuffled: a random one) is kept.

:func:`selective_shift` is the whole step: the selected samples keep their style, the others are
AdaIN-ed to styles drawn around the received one.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager

import torch

from fedstyle.errors import ConfigError
from fedstyle.style.shift import Normal, StyleSummary, sample_styles, standard_normal
from fedstyle.style.stats import channel_stats, restyle

#: how :func:`selective_shift` chooses the samples that keep their style
SELECTIONS = ("kmeans", "random", "centres")


def kmeans_pp_seeds(points: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (k,) of k distinct rows of ``points`` (N, D) chosen by k-means++ seeding.

    The pairwise squared distances and the k exponential draws are computed up front, so each of
    the k - 1 sequential picks is a handful of small kernels (the loop is launch-bound on a GPU).
    """
    n = points.shape[0]
    if not 0 <= k <= n:
        raise ConfigError(f"k-means++ needs 0 <= k <= number of points, got k={k} for {n} points")
    device = points.device
    if k == 0:
        return torch.empty(0, dtype=torch.long, device=device)
    pairwise = torch.cdist(points, points).pow_(2)
    pairwise.fill_diagonal_(0.0)  # a chosen point's D is exactly 0: it is never drawn again
    race = torch.empty(k, n, dtype=points.dtype, device=device).exponential_().clamp_min_(1e-20)
    available = torch.ones(n, dtype=points.dtype, device=device)
    nxt = torch.randint(n, (1,), device=device)
    picks = [nxt]
    available.index_fill_(0, nxt, 0.0)
    d2 = pairwise.index_select(0, nxt).squeeze(0)
    for j in range(1, k):
        weight = torch.where(d2.sum() > 0, d2, available)  # all remaining D = 0: uniform among them
        nxt = (weight / race[j]).argmax().view(1)
        picks.append(nxt)
        available.index_fill_(0, nxt, 0.0)
        d2 = torch.minimum(d2, pairwise.index_select(0, nxt).squeeze(0))
    return torch.cat(picks)


def lloyd_step(points: torch.Tensor, centres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One Lloyd iteration: (assignment (N,), moved centres (k, D)); an empty cluster keeps its centre."""
    k = centres.shape[0]
    assign = torch.cdist(points, centres).argmin(1)
    sums = torch.zeros_like(centres).index_add_(0, assign, points)
    counts = torch.zeros(k, dtype=points.dtype, device=points.device).index_add_(
        0, assign, torch.ones_like(assign, dtype=points.dtype))
    moved = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centres)
    return assign, moved


def select_by_kmeans(points: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep mask (N,) with exactly k True, the k moved centres) — see the module docstring."""
    n = points.shape[0]
    keep = torch.zeros(n, dtype=torch.bool, device=points.device)
    if k == 0:
        return keep, points[:0]
    centres = points.index_select(0, kmeans_pp_seeds(points, k))
    assign, moved = lloyd_step(points, centres)
    dist = (points - moved.index_select(0, assign)).pow(2).sum(1)
    # nearest member of each cluster: order by distance, then (stably) by cluster; first of each run
    order = torch.argsort(dist, stable=True)
    order = order[torch.argsort(assign[order], stable=True)]
    grouped = assign[order]
    first = torch.ones_like(grouped, dtype=torch.bool)
    first[1:] = grouped[1:] != grouped[:-1]
    representative = torch.zeros_like(keep).scatter(0, order, first)
    # representatives first (by distance), then the others by distance; keep the first k
    order = torch.argsort(dist, stable=True)
    order = order[torch.argsort((~representative[order]).to(torch.uint8), stable=True)]
    return keep.scatter(0, order[:k], True), moved


def _untimed(name: str) -> ContextManager:
    return nullcontext()


def sklearn_kmeans_centres(points: torch.Tensor, k: int, random_state: int) -> torch.Tensor:
    """The k cluster centres (k, D) of scikit-learn's ``KMeans(k, init="k-means++", max_iter=1, n_init=1)``
    on ``points``, the public StableFDG code's selection (style_insert.py:72-81): greedy k-means++
    seeding with local trials, one Lloyd iteration, on the CPU (a host synchronisation per batch)."""
    import warnings

    from sklearn.cluster import KMeans

    if not 0 <= k <= points.shape[0]:
        raise ConfigError(f"k-means needs 0 <= k <= number of points, got k={k} for {points.shape[0]} points")
    if k == 0:
        return points[:0].detach()
    model = KMeans(n_clusters=k, init="k-means++", max_iter=1, n_init=1, random_state=random_state)
    with warnings.catch_warnings():  # duplicate styles: fewer distinct clusters than k (centres repeat)
        warnings.simplefilter("ignore")
        model.fit(points.detach().cpu().numpy())
    return torch.as_tensor(model.cluster_centers_, dtype=points.dtype, device=points.device)


def selective_shift(x: torch.Tensor, received: StyleSummary, select: str = "kmeans",
                    timed: Callable[[str], ContextManager] = _untimed, *,
                    kmeans: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] = select_by_kmeans,
                    normal: Normal = standard_normal, unbiased: bool = False, sigma_floor: float = 1e-6
                    ) -> torch.Tensor:
    """Selective style shifting (StableFDG Section 3.1 step 2) of features ``x`` (B, C, H, W).

    k = floor(B/2) samples keep their style — chosen by ``kmeans`` (:func:`select_by_kmeans`) on the styles
    [mu, sigma] (``kmeans``, the paper) or uniformly at random (``random``, Table 11) — and the other
    B - k are AdaIN-ed to the received style with noise, sigma' = sigma_n' + eps_sigma, mu' = mu_n' +
    eps_mu, eps ~ N(0, Sigma_n') (:func:`~fedstyle.style.shift.sample_styles`; a draw of sigma' below
    ``sigma_floor`` is floored there). ``centres`` is the public code's variant (style_insert.py:17-69):
    the first k samples get the k-means cluster centres' styles (``kmeans(points, k)[1]``), the last
    B - k draw around ``received`` (noise drawn for those B - k only, eps_mu first). Source statistics
    detached, as MixStyle's; ``unbiased``: per-sample variances with 1/(HW - 1) (the public code's
    ``x.var``). B = 1: nothing to select, the sample is shifted. ``timed(name)`` times the ``kmeans``
    and ``shift`` parts (e.g. ``ClientContext.timed``); ``kmeans`` and ``normal`` make the draws
    (tests force them).
    """
    if select not in SELECTIONS:
        raise ConfigError(f"unknown selection {select!r} for the style shift; choose {', '.join(SELECTIONS)}")
    b = x.shape[0]
    k = b // 2
    mu, sigma = channel_stats(x, unbiased=unbiased)
    mu, sigma = mu.detach(), sigma.detach()
    if select == "centres":
        mu_t, sigma_t = sample_styles(received, b - k, x, normal=normal, sigma_floor=sigma_floor)
        with timed("kmeans"):
            _, centres = kmeans(torch.cat([mu.flatten(1), sigma.flatten(1)], 1), k)
        with timed("shift"):
            c = mu.shape[1]
            mu_t = torch.cat([centres[:, :c].view(k, c, 1, 1), mu_t])
            sigma_t = torch.cat([centres[:, c:].clamp_min(sigma_floor).view(k, c, 1, 1), sigma_t])
            return restyle(x, mu, sigma, mu_t, sigma_t)
    mu_t, sigma_t = sample_styles(received, b, x, normal=normal, sigma_floor=sigma_floor)
    with timed("kmeans"):
        if select == "kmeans":
            keep, _ = kmeans(torch.cat([mu.flatten(1), sigma.flatten(1)], 1), k)
        else:
            keep = torch.zeros(b, dtype=torch.bool, device=x.device)
            keep[torch.randperm(b, device=x.device)[:k]] = True
    with timed("shift"):
        return torch.where(keep.view(b, 1, 1, 1), x, restyle(x, mu, sigma, mu_t, sigma_t))
