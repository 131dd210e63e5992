"""The styles that clients share, and who receives whose.

- :func:`dataset_style`: StableFDG's Phi_n (Park et al., NeurIPS'23, Section 3.1 step 1, Eq. 2-3), the
  style summary of a client's whole local dataset at one backbone stage.
- :func:`stage_styles`: StyleDDG's psi_i (Zehtabi et al., MobiHoc'25, Eq. 15), the style summaries of
  one mini-batch at several stages of a plain forward.
- :func:`derangement` / :func:`deranged_exchange`: StableFDG's server gives each participant another
  participant's style, never its own.

Style summaries are :class:`~fedstyle.style.shift.StyleSummary` (4 x C numbers per stage).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Mapping

import torch

from fedstyle.errors import ConfigError
from fedstyle.models.batchnorm import batch_statistics
from fedstyle.style.privacy import StylePrivacy
from fedstyle.style.shift import StyleAccumulator, StyleSummary, batch_style

if TYPE_CHECKING:
    from fedstyle.data.client import ClientData
    from fedstyle.models.base import Backbone

#: images per forward pass when a client computes its style information (no gradients), on an accelerator,
#: where a small model's pass is launch-bound (one pass for a typical client)
QUERY_BATCH = 256
#: the same on the CPU, where a pass is compute-bound from a few dozen images on and larger chunks only
#: add allocation cost: glibc serves a block above 32 MB (256 images' 64 x 32 x 32 float maps: 64 MB) with a
#: fresh mmap whose pages fault on every touch; 64 images' (16 MB) are reused from the heap. Measured (issue
#: 23, one thread, all 30 digits4 clients to layer1): ConvNet 5.1 s at 256, 1.6 s at 64; ResNet-18 (32 px)
#: 3.1 s at both; the same Phi bit for bit
CPU_QUERY_BATCH = 64


def query_batch(device: torch.device) -> int:
    """Images per forward of :func:`dataset_style` on ``device``: :data:`QUERY_BATCH`, at most
    :data:`CPU_QUERY_BATCH` on the CPU."""
    return min(QUERY_BATCH, CPU_QUERY_BATCH) if torch.device(device).type == "cpu" else QUERY_BATCH


#: rejection-sampling tries of a uniform derangement before Sattolo's cycle (P(no success) < 1e-199)
DERANGEMENT_TRIES = 1000


#: how :func:`dataset_style` sees a client's images: training batches (augmented, BatchNorm with batch
#: statistics) or evaluation passes (un-augmented, BatchNorm with running statistics)
STYLE_STATS = ("train", "eval")


@torch.no_grad()
def dataset_style(backbone: Backbone, data: ClientData, stage: str, device: torch.device, limit: int = 0,
                  generator: torch.Generator | None = None, privacy: StylePrivacy | None = None,
                  noise: torch.Generator | None = None, *, mode: str = "eval", batch_size: int = 32,
                  batch_stats: bool = True, unbiased: bool = False, spread_eps: float = 0.0) -> StyleSummary:
    """Phi_n = [mu_n, sigma_n, Sigma_n(mu), Sigma_n(sigma)] (Eq. 2-3): means and 1/N variances of the
    per-sample channel statistics of the client's images at ``stage``.

    ``mode="eval"``: the images un-augmented (the data's eval transform), BatchNorm with its running
    statistics, :func:`query_batch` images per forward; ``limit`` = N > 0 (below the client's size): of
    a random N images drawn with ``generator`` instead, a cheaper estimate. ``mode="train"``: the
    features a training forward computes — one epoch of the client's augmented training batches of
    ``batch_size`` (shuffled and augmented with ``generator``), BatchNorm normalising with each batch's
    own statistics and its running statistics left alone (the public StableFDG code's style_collect,
    trainer.py:676-721, on a copy of the model in training mode; ``batch_stats=False``: with its running
    statistics, for a model whose BatchNorm stays in eval mode in training); ``limit``: the first
    ceil(N / batch_size) batches. ``unbiased``: per-sample variances with 1/(HW - 1) and the variances
    over samples with 1/(N - 1); ``spread_eps`` added to the latter (the public code: both, 1e-6).
    ``privacy``: each image's [mu, mu^2, sigma, sigma^2] clipped, Gaussian noise drawn from ``noise``
    on the sums (:mod:`fedstyle.style.privacy`; eval mode only: with batch statistics one image moves
    every image's features of its batch, which the clipping bound does not cover).
    """
    if mode not in STYLE_STATS:
        raise ConfigError(f"style statistics mode {mode!r} is not one of {', '.join(STYLE_STATS)}")
    if mode == "train" and privacy is not None and privacy.clip > 0:
        raise ConfigError("the privacy defence bounds one image's effect on Phi only with style_stats=eval "
                          "(batch statistics let one image move its whole batch); set style_stats=eval")
    acc = StyleAccumulator(clip=privacy.clip if privacy is not None else 0.0)
    if mode == "train":
        steps = data.num_batches(batch_size)
        if 0 < limit < len(data):
            steps = min(steps, -(-limit // batch_size))
        with batch_statistics(backbone) if batch_stats else nullcontext():
            for x, _, _ in data.batches(batch_size, generator, device, steps):
                acc.add(backbone.forward_until(x, stage), unbiased=unbiased)
        return acc.summary(unbiased=unbiased, spread_eps=spread_eps)
    images = data.images
    if 0 < limit < len(data):
        chosen = torch.randperm(len(data), generator=generator)[:limit].sort().values
        images = images[chosen.to(images.device)]
    chunk = query_batch(device)
    for s in range(0, len(images), chunk):
        x = data.transform(images[s : s + chunk].to(device, non_blocking=True), train=False)
        acc.add(backbone.forward_until(x, stage), unbiased=unbiased)
    if privacy is not None and privacy.noise > 0:
        if noise is None:
            raise ValueError("dataset_style with noise needs its generator (StylePrivacy.generator)")
        acc.privatize(privacy, noise)
    return acc.summary(unbiased=unbiased, spread_eps=spread_eps)


def stage_styles(backbone: Backbone, x: torch.Tensor, stages: list[str]) -> dict[str, torch.Tensor]:
    """psi_i = ``{stage: (4, C) tensor}`` (rows mu_bar, sigma_bar, var mu, var sigma; Eq. 15 with Eq. 2-3)
    of the batch ``x`` at the outputs of ``stages``: a plain forward h_theta,l(x_i) (no style ops) that
    stops after the last of them."""
    names = backbone.stage_names
    last = max(names.index(s) for s in stages)
    psi: dict[str, torch.Tensor] = {}
    h = x
    for name in names[: last + 1]:
        h = backbone.run_stage(name, h)
        if name in stages:
            psi[name] = batch_style(h).as_tensor()
    return psi


def derangement(n: int, generator: torch.Generator, tries: int = DERANGEMENT_TRIES) -> list[int]:
    """A random permutation ``p`` of range(n) with p[i] != i for every i (n >= 2; n < 2: identity).

    Uniform over derangements: random permutations are drawn until one has no fixed point (about
    e ~ 2.7 draws expected); after ``tries`` failures (never in practice) Sattolo's algorithm gives
    a random n-cycle, which is a derangement. Ends for every n.
    """
    if n < 2:
        return list(range(n))
    for _ in range(tries):
        perm = torch.randperm(n, generator=generator)
        if not bool((perm == torch.arange(n)).any()):
            return perm.tolist()
    perm = list(range(n))
    for i in range(n - 1, 0, -1):  # Sattolo: swap with a strictly earlier position -> one cycle
        j = int(torch.randint(i, (1,), generator=generator))
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def greedy_pairing(n: int, generator: torch.Generator) -> list[int]:
    """The public StableFDG code's assignment (trainer.py:599-611): participant i in turn receives the style
    of a uniformly chosen participant other than itself not taken yet; when only its own style is left
    (only the last participant can be left so: measured in 25 % of assignments at 3 participants, 12 %
    at 5, 7 % at 10, 3 % at 30), the pass fails for it and the next pass gives it that style anyway —
    its own (the code keeps its partial list after a failed pass). A permutation of range(n), usually
    a derangement; n < 2: identity (the code never ends there). Python's ``random.sample`` on a set
    (the code's draw, which Python >= 3.11 refuses, so the loop never ends there) is replaced by
    uniform draws from ``generator``.
    """
    if n < 2:
        return list(range(n))
    taken: list[int] = []
    while len(taken) < n:
        for i in range(n):
            free = [j for j in range(n) if j != i and j not in taken]
            if free:
                taken.append(free[int(torch.randint(len(free), (1,), generator=generator))])
                if len(taken) == n:
                    break
    return taken


#: how the server assigns received styles: a uniform derangement, or the public code's greedy loop
PAIRINGS = ("derangement", "greedy")


def deranged_exchange(client_ids: list[int], queries: Mapping[int, Mapping[str, Any]], key: str,
                      generator: torch.Generator, pairing: str = "derangement") -> dict[int, dict[str, Any]]:
    """``{client: {key: another client's value}}``: the participants whose query holds ``key`` (in
    ``client_ids`` order) receive each other's by a random :func:`derangement` (``pairing="greedy"``:
    :func:`greedy_pairing`, which can give a participant its own); with fewer than two such
    participants nothing is shared (``{}``)."""
    senders = [c for c in client_ids if key in queries.get(c, {})]
    if len(senders) < 2:
        return {}
    perm = derangement(len(senders), generator) if pairing == "derangement" else greedy_pairing(len(senders), generator)
    return {c: {key: queries[senders[perm[i]]][key]} for i, c in enumerate(senders)}
