"""What each method sends beyond weights, as an honest-but-curious receiver sees it.

A :class:`Surface` is one kind of payload: how a sender computes it from a set of its images
(``release``), the same statistic as a differentiable function of candidate images (``statistic``,
what an inversion attack optimises), and each image's own contribution (``image_vectors``, the space
of the membership and attribute attacks). Set payloads are functions of the *average* of the
per-image contributions, ``set_mean(release) == image_vectors(images).mean(0)``, which is what the
calibrated membership score needs and what the clipping defence bounds.

Surfaces by method (each built from the run's hyperparameters and, where the method uses the
classifier's features, the run's weights):

- CCST (Chen et al. WACV'23): ``single`` — J per-image styles (channel mean and std of the style
  encoder's features, Eq. 6), each describing one image; ``overall`` — one dataset style over all
  pixels of all images (Eq. 8). Sent once to the server, which broadcasts the bank to every client.
- PARDON (Trinh et al.): the client style, the mean of its FINCH clusters' styles (Eq. 1-2), to the
  server. Inverted here as a dataset style of the candidates (the cluster weighting is ignored: an
  approximation stated in the report).
- StableFDG (Park et al. NeurIPS'23): Phi_n = [mean mu, mean sigma, var mu, var sigma] of the
  client's data at ``share_stage`` of the classifier (Eq. 2-3), each round, relayed to one other client.
- StyleDDG (Zehtabi et al. MobiHoc'25): psi_i, the same summary of one mini-batch at every stage in
  ``stages`` (Eq. 15), every iteration, to each neighbour.
- FedDG (Liu et al. CVPR'21, a baseline): per-image amplitude spectra (the ``fft`` backend).
- FedCCRL (Wang et al. arXiv 2410.11267): per-image channel mean and std of the normalised input image, for
  r = 10 % of the client's images drawn afresh each round, to the server, which sends each client the others'.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms import Algorithm
from fedstyle.errors import ConfigError
from fedstyle.models.batchnorm import batch_statistics
from fedstyle.style.privacy import StylePrivacy
from fedstyle.style.sharing import query_batch
from fedstyle.style.shift import StyleAccumulator, summarize_styles
from fedstyle.style.stats import channel_stats
from fedstyle.style.transfer.augment import client_style, make_backend
from fedstyle.style.transfer.feature_adain import ADAIN_EPS
from fedstyle.style.transfer.interpolation import local_style

Images = torch.Tensor  # uint8 (N, 3, H, W)


@dataclass
class Surface:
    """One kind of style payload of one method."""

    method: str
    kind: str                      # "per-image style", "dataset style", ...
    sender: str                    # who sends it, when, to whom
    per_image: bool                # one shared row per image (else one statistic per set)
    set_size: Callable[[int], int]  # images one payload covers, given the sender's data size
    image_vectors: Callable[[Images], torch.Tensor]       # (N, D): each image's contribution
    release: Callable[[Images], torch.Tensor]             # per-image: (N, D) rows; set: a flat vector
    statistic: Callable[[torch.Tensor], torch.Tensor]     # float (R, 3, H, W) in [0, 1] -> like release
    set_mean: Callable[[torch.Tensor], torch.Tensor]      # a set release -> (D,), the mean of its contributions
    approximation: str = ""
    privacy: StylePrivacy | None = None                   # the defence ``release`` applies (clip C, noise z)
    releases: int = 1                                     # releases averaged into one payload (averaged_surface)
    #: set payloads: the coordinates of ``set_mean(release)`` that are linear in the released (noisy) sums, the
    #: means; the rest come through variances clamped at 0 or floored standard deviations. None: all of them
    #: (per-image rows: their noisy standard deviations are floored at sqrt(eps), often with noise, but CCST's
    #: canaries differ mostly in their means: a projection on every coordinate loses little)
    linear: torch.Tensor | None = None


def averaged_surface(surface: Surface, releases: int) -> Surface:
    """The receiver's combination of ``releases`` = T releases of one sender (StableFDG: one each round it is
    sampled): their mean, whose noise has 1/sqrt(T) of one release's standard deviation. The audit replays
    the T releases on the same images and weights (the run's came from each round's weights)."""
    if int(releases) < 1:
        raise ConfigError(f"releases must be >= 1 (the releases a receiver combines), got {releases}")

    def release(images: Images) -> torch.Tensor:
        return torch.stack([surface.release(images) for _ in range(int(releases))]).mean(0)

    return dataclasses.replace(surface, kind=f"{surface.kind}, mean of {int(releases)} releases", release=release,
                               releases=int(releases))


def _moments(features: torch.Tensor) -> torch.Tensor:
    """Per-image first and second moments per channel over H x W: (N, 2C)."""
    f = features.double()
    return torch.cat([f.mean((2, 3)), (f * f).mean((2, 3))], 1)


def _dataset_style_from_moments(mean_moments: torch.Tensor) -> torch.Tensor:
    """CCST Eq. 8's (mu, sigma) over all pixels of equal-size images from their average moments."""
    c = mean_moments.shape[-1] // 2
    mu, second = mean_moments[..., :c], mean_moments[..., c:]
    return torch.cat([mu, (second - mu * mu).clamp_min(0).add(ADAIN_EPS).sqrt()], -1)


def _moments_from_dataset_style(style: torch.Tensor) -> torch.Tensor:
    c = style.shape[-1] // 2
    mu, sigma = style[..., :c], style[..., c:]
    return torch.cat([mu, sigma * sigma - ADAIN_EPS + mu * mu], -1)


def _summary(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """(4C,) = [mean mu, mean sigma, var mu, var sigma] of per-image (N, C) statistics (StableFDG Eq. 2-3)."""
    return summarize_styles(mu, sigma).as_tensor().flatten()


def encoder_surface(method: str, algorithm: Algorithm, device: torch.device, kind: str,
                    set_size: Callable[[int], int], privacy: StylePrivacy | None = None, seed: int = 0) -> Surface:
    """CCST / PARDON: statistics of the image style encoder (public weights; the receiver has them). CCST's
    payloads are released by the senders' own function (``client_style``) with the run's defence."""
    backend = make_backend(algorithm.backend_name(), device, **algorithm.backend_options())
    encoder, min_size = backend.encoder, backend.min_size
    releases = iter(range(1 << 62))

    def encode(x01: torch.Tensor) -> torch.Tensor:  # FeatureAdaIN.prepare on float images
        x = x01.to(device)
        if min(x.shape[-2:]) < min_size:
            scale = min_size / min(x.shape[-2:])
            size = (max(min_size, round(x.shape[-2] * scale)), max(min_size, round(x.shape[-1] * scale)))
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return encoder(x)

    def floats(images: Images) -> torch.Tensor:
        return images.to(device).float().div(255.0)

    def per_image(x01: torch.Tensor) -> torch.Tensor:
        mu, sigma = channel_stats(encode(x01), eps=ADAIN_EPS)
        return torch.cat([mu.flatten(1), sigma.flatten(1)], 1)

    @torch.no_grad()
    def moments(images: Images) -> torch.Tensor:
        return torch.cat([_moments(encode(floats(images[s:s + 64]))) for s in range(0, len(images), 64)])

    @torch.no_grad()
    def vectors(images: Images) -> torch.Tensor:
        return torch.cat([per_image(floats(images[s:s + 64])) for s in range(0, len(images), 64)]).double()

    @torch.no_grad()
    def release(images: Images) -> torch.Tensor:
        if method == "pardon":
            style = local_style(backend, images, features=algorithm.hp["local_features"],
                                partition=algorithm.hp["local_partition"]).style
        else:  # every given image is used: count = len(images) draws them all, in order
            noise = privacy.generator(seed, "audit", next(releases)) if privacy is not None else None
            style, _ = client_style(backend, images, style_type="single" if kind == "per-image style" else "overall",
                                    count=len(images), seed=0, batch_size=64, privacy=privacy, noise=noise)
        rows = torch.cat([style.tensors["mean"], style.tensors["std"]], 1).double().to(device)  # styles live on the CPU
        return rows if kind == "per-image style" else rows.flatten()

    sender = "each client, once at setup, to the server" + (
        ", which sends the bank to every client" if method == "ccst" else "")
    if kind == "per-image style":
        return Surface(method, kind, sender, True, set_size, vectors, release, per_image, lambda r: r.mean(0),
                       privacy=privacy)
    approximation = ("PARDON's client style is the mean of its clusters' styles; it is inverted and scored as the "
                     "dataset style of all the client's images") if method == "pardon" else ""

    def statistic(x01: torch.Tensor) -> torch.Tensor:
        f = encode(x01)
        return _dataset_style_from_moments(torch.cat([f.mean((2, 3)), (f * f).mean((2, 3))], 1).mean(0))

    linear = None
    if privacy is not None:  # [mu | E f^2] per channel: mu = S_1 / N is linear in the noisy sums
        with torch.no_grad():
            channels = encoder(torch.zeros(1, 3, min_size, min_size, device=device)).shape[1]
        linear = torch.arange(2 * channels) < channels
    return Surface(method, kind, sender, False, set_size, moments, release, statistic, _moments_from_dataset_style,
                   approximation, privacy=privacy, linear=linear)


def classifier_surface(method: str, model: nn.Module, stages: list[str], normalize: Callable[[torch.Tensor], torch.Tensor],
                       device: torch.device, resolution: int, sender: str, set_size: Callable[[int], int],
                       batch_stats: bool = False, privacy: StylePrivacy | None = None, seed: int = 0) -> Surface:
    """StableFDG / StyleDDG: the summary of per-image channel statistics at the classifier's ``stages``,
    released through the senders' own accumulator (:class:`StyleAccumulator`) with the run's defence."""
    backbone = model.backbone
    last = max(backbone.stage_names.index(s) for s in stages)
    releases = iter(range(1 << 62))

    def stage_maps(x01: torch.Tensor) -> list[torch.Tensor]:
        h, out = normalize(x01.to(device)), []
        with batch_statistics(model) if batch_stats else nullcontext():  # StyleDDG's share_stats=train (Eq. 15)
            for name in backbone.stage_names[: last + 1]:
                h = backbone.run_stage(name, h)
                if name in stages:
                    out.append(h)
        return out

    def floats(images: Images) -> torch.Tensor:
        return images.to(device).float().div(255.0)

    def chunks(images: Images):
        step = len(images) if batch_stats else query_batch(device)  # batch statistics: the whole set in one pass
        return (floats(images[s:s + step]) for s in range(0, len(images), step))

    def contributions(h: torch.Tensor) -> torch.Tensor:  # [mu, sigma, mu^2, sigma^2]: what the sums add up
        mu, sigma = (m.flatten(1).double() for m in channel_stats(h))
        return torch.cat([mu, sigma, mu * mu, sigma * sigma], 1)

    @torch.no_grad()
    def image_vectors(images: Images) -> torch.Tensor:
        rows = [torch.cat([contributions(h) for h in stage_maps(x)], 1) for x in chunks(images)]
        return torch.cat(rows)

    def statistic(x01: torch.Tensor) -> torch.Tensor:
        return torch.cat([_summary(*(m.flatten(1) for m in channel_stats(h))) for h in stage_maps(x01)])

    @torch.no_grad()
    def release(images: Images) -> torch.Tensor:
        accumulators = [StyleAccumulator(clip=privacy.clip if privacy else 0.0) for _ in stages]
        for x in chunks(images):
            for acc, h in zip(accumulators, stage_maps(x)):
                acc.add(h)
        if privacy is not None and privacy.noise > 0:
            for acc in accumulators:
                acc.privatize(privacy, privacy.generator(seed, "audit", next(releases)))
        return torch.cat([acc.summary().as_tensor().flatten() for acc in accumulators]).double()

    with torch.no_grad():
        channels = [h.shape[1] for h in stage_maps(torch.zeros(2, 3, resolution, resolution, device=device))]

    def set_mean(rel: torch.Tensor) -> torch.Tensor:
        parts, at = [], 0
        for c in channels:  # per stage: rows [mean mu, mean sigma, var mu, var sigma] of C; E[x^2] = var + mean^2
            mean, var = rel[at:at + 2 * c].double(), rel[at + 2 * c:at + 4 * c].double()
            parts += [mean, var + mean * mean]
            at += 4 * c
        return torch.cat(parts)

    # per stage [mean mu | mean sigma (floored at sqrt(eps)), E mu^2, E sigma^2 (through variances clamped at 0)]
    linear = torch.cat([torch.arange(4 * c) < c for c in channels])
    return Surface(method, "dataset style" if method == "stablefdg" else "batch style", sender, False, set_size,
                   image_vectors, release, statistic, set_mean, privacy=privacy, linear=linear)


def amplitude_surface(device: torch.device, set_size: Callable[[int], int]) -> Surface:
    """FedDG's per-image amplitude spectra (images on the 0-255 scale, as the fft backend takes them)."""

    def spectrum(x01: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft2(x01.to(device) * 255.0, dim=(-2, -1)).abs().flatten(1)

    rows = torch.no_grad()(lambda im: spectrum(im.to(device).float().div(255.0)).double())
    return Surface("feddg_fft", "per-image amplitude spectrum", "each client, once at setup, to the server, which "
                   "sends the bank to every client", True, set_size, rows, rows, spectrum, lambda r: r.mean(0))


def input_statistics_surface(method: str, normalize: Callable[[torch.Tensor], torch.Tensor],
                             set_size: Callable[[int], int], eps: float, unbiased: bool = False) -> Surface:
    """FedCCRL's rows: per image, the channel means and standard deviations sqrt(var + eps) of the normalised input
    image over H x W ((N, 2C); ``unbiased``: 1/(HW - 1), its reference_code). One row per image, so membership is
    an exact match; a sender sends a fresh draw of r n images each round it is sampled, so over rounds the
    receiver collects rows of most of its images."""

    def statistic(x01: torch.Tensor) -> torch.Tensor:
        mu, sigma = channel_stats(normalize(x01).float(), eps=eps, unbiased=unbiased)
        return torch.cat([mu.flatten(1), sigma.flatten(1)], 1)

    rows = torch.no_grad()(lambda im: statistic(im.float().div(255.0)).double())
    return Surface(method, "per-image input statistics", "each sampled client, every round, to the server, which "
                   "sends each client the other clients' rows", True, set_size, rows, rows, statistic,
                   lambda r: r.mean(0))
