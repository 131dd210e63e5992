"""Clustered style interpolation (PARDON, Nguyen et al., ICDCS'25, Section III-B, Eq. 1-5).

A client's style (Eq. 1-2 and the mean after Eq. 2):

1. encode every local image with the style backend's encoder and describe it by a feature vector:
   its per-image style (``features="style"``: [mu, sigma] of the encoder features for the AdaIN
   backends, the flattened amplitude spectrum for ``fft``) or its flattened encoder feature map
   (``features="flat"``, the public code's choice; AdaIN backends only);
2. cluster the vectors with FINCH (Sarfraz et al., CVPR'19; the ``finch-clust`` package, cosine
   distance) and keep one partition of its hierarchy (Eq. 1);
3. the style of cluster j is the style over *all pixels of all its members* (Eq. 2) — pooled from
   the per-image styles (``StyleTransfer.pool_styles``, exact for images of one size), or, for a
   backend that cannot pool, the backend's ``dataset_style`` over the cluster's images;
4. the client style is the plain mean of its cluster styles (so a dominant domain does not
   dominate; ``client_style="mean"``, S_Ck = (1/L_k) sum_j S(eps_j) after Eq. 2), or, as the public code
   (client.py:636-652), the style of the clusters' pooled moments with equal weights per cluster
   (``"pooled"``): mu = mean_j mu_j, sigma^2 = mean_j (sigma_j^2 + mu_j^2) - mu^2 (+ eps)
   (``StyleTransfer.pool_styles`` over one group). The two differ in sigma only, and most where the
   clusters' means differ (measured 35 % in the 2026-11-25 parity notes).

The server's interpolation style (Eq. 3-5): FINCH on the client styles, each cluster's style the
mean of its members (Eq. 4), and the global style S_g the element-wise median over the cluster
styles (Eq. 5).

FINCH, as used here (``finch_partition``):

* the first neighbours (level 0 of FINCH) are computed exactly in torch, in chunks, with cosine
  similarity, and handed to FINCH as ``initial_rank``; FINCH's higher levels run on cluster means
  with its exact pairwise distances (``ann_threshold`` is raised so it never needs pynndescent).
  Memory is O(chunk x N) at level 0 and O(M^2) at level 1, with M <= N / 2 the level-0 clusters;
* ``ensure_early_exit=False``, as PARDON's public code (in finch-clust 0.2.3 the flag has no effect);
* partition ``finest`` (FINCH's first), ``coarsest`` (its last; FINCH never returns the
  one-cluster partition, so this has >= 2 clusters unless level 0 is already one), or an integer k
  (FINCH's ``req_clust``: the level with k clusters, else merges down to k; k = 1: one cluster;
  k above the finest partition's count gives the finest partition, i.e. fewer than k clusters);
* fallbacks, none of which raise: fewer than 2 vectors -> one cluster (FINCH needs two to link);
  all-zero vectors (cosine undefined: sklearn would link them to an arbitrary point) form a cluster
  of their own and FINCH runs on the rest; identical vectors tie, and ties link to the lowest index,
  so they end in one cluster (FINCH returns a single cluster for up to ~5 points in practice too).

The median of an even number of cluster styles is ``midpoint`` (mean of the two middle values, the
usual definition; default) or ``lower`` (the lower of the two, PARDON's public code, torch.median).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from fedstyle.errors import ConfigError
from fedstyle.style.stats import channel_stats
from fedstyle.style.transfer.base import Style, StyleMismatchError, StyleTransfer, group_mean
from fedstyle.style.transfer.feature_adain import ADAIN_EPS, FeatureAdaIN

#: what FINCH clusters a client's images on
LOCAL_FEATURES = ("style", "flat")
#: rules for the median of an even number of values
MEDIANS = ("midpoint", "lower")
#: rows of the cosine-similarity matrix computed at once for the first neighbours
_CHUNK = 2048


def check_partition(value: str | int, option: str = "partition") -> str | int:
    """``finest``, ``coarsest`` or a positive integer (given as int or digit string)."""
    text = str(value).strip().lower()
    if text in ("finest", "coarsest"):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(f"{option}={value!r} is not a FINCH partition; choose finest, coarsest or a number of clusters >= 1")


def style_matrix(style: Style) -> torch.Tensor:
    """One row per style: every tensor of the style flattened and concatenated (names sorted), float32."""
    if len(style) == 0:
        raise StyleMismatchError("no styles to cluster")
    return torch.cat([style.tensors[k].reshape(len(style), -1).float() for k in sorted(style.tensors)], dim=1)


def first_neighbours(features: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Index of each row's most cosine-similar other row (ties: the lowest index), exact, in chunks.

    Rows must be non-zero. Runs on ``device`` (default: the features' device); returns CPU int64.
    """
    x = features.to(device if device is not None else features.device, torch.float32)
    x = x / x.norm(dim=1, keepdim=True)
    n = x.shape[0]
    out = torch.empty(n, dtype=torch.long, device=x.device)
    for start in range(0, n, _CHUNK):
        sims = x[start : start + _CHUNK] @ x.T
        rows = torch.arange(sims.shape[0], device=x.device)
        sims[rows, rows + start] = -float("inf")  # never one's own neighbour
        out[start : start + _CHUNK] = sims.argmax(dim=1)
    return out.cpu()


def _finch():
    with warnings.catch_warnings():  # finch-clust warns at import that the optional pynndescent is missing
        warnings.simplefilter("ignore")
        try:
            from finch import FINCH
        except ImportError:
            raise ConfigError("PARDON's clustering needs the finch-clust package: pip install finch-clust==0.2.3") from None
    return FINCH


def finch_partition(features: torch.Tensor, partition: str | int = "coarsest",
                    device: torch.device | str | None = None) -> torch.Tensor:
    """Cluster labels (N,) in 0..L-1 of the rows of ``features`` (N, F) by FINCH with cosine distance.

    See the module docstring for the partition choice and the fallbacks (few rows, zero rows, ties).
    """
    partition = check_partition(partition)
    x = features.detach().reshape(features.shape[0], -1).to(torch.float32)
    n = x.shape[0]
    labels = torch.zeros(n, dtype=torch.long)
    zero = (x.abs().amax(dim=1) == 0).cpu() if x.shape[1] else torch.ones(n, dtype=torch.bool)
    live = (~zero).nonzero().flatten()
    if len(live) >= 2 and partition != 1:
        data = x[live.to(x.device)]
        rank = first_neighbours(data, device)
        finch = _finch()
        kwargs = dict(initial_rank=rank.numpy().astype(np.int32), distance="cosine", ensure_early_exit=False,
                      ann_threshold=max(20_000, len(live)), verbose=False)
        if isinstance(partition, int):
            kwargs["req_clust"] = partition
        with contextlib.redirect_stdout(io.StringIO()):  # FINCH prints when req_clust exceeds its finest level
            columns, _, requested = finch(data=data.cpu().numpy(), **kwargs)
        chosen = {"finest": lambda: columns[:, 0], "coarsest": lambda: columns[:, -1]}.get(partition, lambda: requested)()
        _, dense = np.unique(np.asarray(chosen), return_inverse=True)  # labels 0..L-1 in order of first label
        labels[live] = torch.from_numpy(dense.reshape(-1).astype(np.int64))
    if bool(zero.any()) and len(live) > 0:
        labels[zero] = int(labels[live].max()) + 1
    return labels


@dataclass
class LocalStyle:
    """A client's style (N = 1) and how it was made."""

    style: Style
    clusters: int
    images: int


def image_features(backend: StyleTransfer, images: torch.Tensor, features: str, batch_size: int,
                   progress: Callable[[int], None] | None = None) -> tuple[Style, torch.Tensor]:
    """The per-image styles of ``images`` and the vectors FINCH clusters them on (N, F);
    ``progress(n)`` after each batch of n images."""
    if features not in LOCAL_FEATURES:
        raise ConfigError(f"local features {features!r} is not one of {', '.join(LOCAL_FEATURES)}")
    n = int(images.shape[0])
    if n == 0:
        raise StyleMismatchError("a client with no images has no style; choose a partition that leaves no client empty")
    tick = progress or (lambda _: None)
    if features == "style":
        parts = []
        for s in range(0, n, batch_size):
            parts.append(backend.image_styles(images[s : s + batch_size]))
            tick(len(parts[-1]))
        style = Style.concat(parts)
        return style, style_matrix(style)
    if not isinstance(backend, FeatureAdaIN):
        raise ConfigError(f"local_features=flat clusters encoder feature maps, which the {backend.name!r} backend has "
                          "not; use an encoder backend (lite or adain) or local_features=style")
    means, stds, flats = [], [], []
    with torch.no_grad():
        for s in range(0, n, batch_size):
            maps = backend.encode(images[s : s + batch_size])
            mean, std = channel_stats(maps, eps=ADAIN_EPS)  # the statistic of FeatureAdaIN.image_styles
            means.append(mean.flatten(1).float().cpu())
            stds.append(std.flatten(1).float().cpu())
            flats.append(maps.flatten(1).float().cpu())
            tick(len(maps))
    style = Style(backend.name, backend.encoder_id, {"mean": torch.cat(means), "std": torch.cat(stds)})
    return style, torch.cat(flats)


def cluster_styles(backend: StyleTransfer, per_image: Style, labels: torch.Tensor, images: torch.Tensor,
                   batch_size: int) -> Style:
    """The style of every cluster over all pixels of its members (PARDON Eq. 2), one row per label."""
    try:
        return backend.pool_styles(per_image, labels)
    except NotImplementedError:  # a backend that cannot pool: encode each cluster's images again
        parts = []
        for j in range(int(labels.max()) + 1):
            members = images[(labels == j).nonzero().flatten()]
            parts.append(backend.dataset_style(members[s : s + batch_size] for s in range(0, len(members), batch_size)))
        return Style.concat(parts)


def mean_style(style: Style) -> Style:
    """The element-wise mean of N styles (N = 1 result)."""
    return Style(style.backend, style.encoder, {k: v.to(torch.float64).mean(0, keepdim=True).to(v.dtype)
                                                for k, v in style.tensors.items()})


def median_style(style: Style, rule: str = "midpoint") -> Style:
    """The element-wise median of N styles (PARDON Eq. 5); even N: ``midpoint`` or ``lower`` (see module)."""
    if rule not in MEDIANS:
        raise ConfigError(f"median rule {rule!r} is not one of {', '.join(MEDIANS)}")
    n = len(style)
    if n == 0:
        raise StyleMismatchError("the median of no styles is undefined")
    out = {}
    for key, value in style.tensors.items():
        ordered = value.sort(dim=0).values
        if n % 2 == 1 or rule == "lower":
            out[key] = ordered[(n - 1) // 2 : (n - 1) // 2 + 1].clone()
        else:
            out[key] = (ordered[n // 2 - 1 : n // 2].to(torch.float64) + ordered[n // 2 : n // 2 + 1]).div(2).to(value.dtype)
    return Style(style.backend, style.encoder, out)


#: how a client's cluster styles become its style (see the module docstring)
CLIENT_STYLES = ("mean", "pooled")


def combine_clusters(backend: StyleTransfer, clusters: Style, rule: str = "mean") -> Style:
    """The client style from its cluster styles: their element-wise ``mean`` or their ``pooled`` moments."""
    if rule not in CLIENT_STYLES:
        raise ConfigError(f"client style rule {rule!r} is not one of {', '.join(CLIENT_STYLES)}")
    if rule == "mean":
        return mean_style(clusters)
    try:
        return backend.pool_styles(clusters, torch.zeros(len(clusters), dtype=torch.long))
    except NotImplementedError:
        raise ConfigError(f"client_style=pooled needs a backend whose styles are moments; {backend.name!r} "
                          "cannot pool them: use client_style=mean") from None


def local_style(backend: StyleTransfer, images: torch.Tensor, *, features: str = "style",
                partition: str | int = "coarsest", batch_size: int = 64, combine: str = "mean",
                progress: Callable[[int], None] | None = None) -> LocalStyle:
    """A client's style: FINCH clusters of its images (Eq. 1), each cluster's style (Eq. 2), combined by
    ``combine`` (:func:`combine_clusters`). ``progress(n)`` after each batch of n images encoded."""
    per_image, vectors = image_features(backend, images, features, batch_size, progress)
    device = getattr(backend, "device", None)
    labels = finch_partition(vectors, partition, device=device)
    clusters = cluster_styles(backend, per_image, labels, images, batch_size)
    return LocalStyle(combine_clusters(backend, clusters, combine), len(clusters), int(images.shape[0]))


def interpolation_style(client_styles: Style, *, partition: str | int = "coarsest", median: str = "midpoint"
                        ) -> tuple[Style, torch.Tensor]:
    """The global interpolation style S_g (N = 1) of the clients' styles and the cluster label of each
    client: FINCH on the client styles (Eq. 3), cluster means (Eq. 4), element-wise median (Eq. 5)."""
    labels = finch_partition(style_matrix(client_styles), partition)
    means = {k: group_mean(v, labels).to(v.dtype) for k, v in client_styles.tensors.items()}
    clusters = Style(client_styles.backend, client_styles.encoder, means)
    return median_style(clusters, median), labels
