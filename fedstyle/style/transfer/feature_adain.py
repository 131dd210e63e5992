"""Encoder -> AdaIN -> decoder style transfer (Huang & Belongie, ICCV'17), shared by ``adain`` and ``lite``.

A backend of this family is an encoder ``enc`` (images in [0, 1] -> a feature map) and a decoder
``dec`` (feature map -> images). With f_c = enc(content):

* the style of an image is S = (mu(enc(I)), sigma(enc(I))), per channel over H x W  (CCST Eq. 4, 6);
* the overall style of a dataset is (mu, sigma) over *all* pixels of *all* feature maps (CCST Eq. 8),
  streamed: per-channel sum and sum of squares in float64, never holding the features;
* transfer is  dec(alpha * AdaIN(f_c, mu_t, sigma_t) + (1 - alpha) * f_c)  (CCST Eq. 2, 5; the
  reference implementations' content/style interpolation), with
  AdaIN(f, mu_t, sigma_t) = sigma_t * (f - mu(f)) / sigma(f) + mu_t, so the output's channel means
  and standard deviations are the target's.

Every sigma is sqrt(var + eps) with the population variance and eps = 1e-5 (as the reference
implementations; they use the unbiased variance, a factor HW / (HW - 1) that fedstyle leaves out so
that a single image's style and a dataset's style are the same statistic). A channel with zero
variance therefore gives no NaN: it maps to the constant mu_t. ``unbiased_content = True`` (set by
CCST's ``reference_code``) normalises the content in :meth:`FeatureAdaIN.transfer` with the unbiased
variance instead, as CCST's transfer does (``calc_mean_std``, JeremyCJM/CCST
``style_transfer/AdaIN/function.py:4-12``, in ``adaIN_StyleStat_ContentFeat``, ``:26-33``); the styles stay
population statistics, as CCST's style scripts make them (E[f^2] - mu^2:
``CCST_SingleStyleTransfer.py:201-203``, ``mean_std_computation_effcientMem.py:135-137``). The setting
joins :attr:`FeatureAdaIN.encoder_id` (so caches and style checks keep the two apart).

Input handling (uint8 (B, C, H, W) tensors): one channel is repeated to three (grayscale -> RGB);
images whose shorter side is below the encoder's ``min_size`` are upsampled bilinearly so that the
shorter side equals ``min_size`` (aspect ratio kept) before encoding, and the decoded output is
resized back (bilinear, antialiased) to the content's H x W. Styles are therefore statistics of
the upsampled images; they are only compared within one backend and encoder, whose id records
``min_size``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.devices import resolve_device
from fedstyle.errors import ConfigError
from fedstyle.style.privacy import StylePrivacy, clip_factors, clip_rows
from fedstyle.style.stats import adain, channel_stats
from fedstyle.style.transfer.base import Style, StyleMismatchError, StyleTransfer, group_mean

#: eps inside every sigma = sqrt(var + eps) of image style transfer (the AdaIN reference value)
ADAIN_EPS = 1e-5


def module_fingerprint(module: nn.Module) -> str:
    """First 12 hex digits of the SHA-256 over a module's structure (its ``repr``: the layers, in order, with their
    settings) and state (names, shapes and values). The structure counts because layers without weights change
    the features too: an encoder with a final ReLU and the same encoder cut before it share every weight but not
    their styles, so they must not share cached styles."""
    digest = hashlib.sha256()
    # repr names each layer and its settings; addresses some reprs print (a function's) would change per process
    digest.update(re.sub(r" at 0x[0-9a-fA-F]+", "", repr(module)).encode())
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def check_images(images: torch.Tensor, what: str = "images") -> torch.Tensor:
    """Validate a uint8 (B, C, H, W) batch with C = 1 (grayscale) or 3 (RGB)."""
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        dtype = getattr(images, "dtype", type(images).__name__)
        raise ConfigError(f"style transfer expects {what} as a uint8 tensor (B, 3, H, W), got {dtype}")
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ConfigError(
            f"style transfer expects {what} of shape (B, 3, H, W) or (B, 1, H, W), got {tuple(images.shape)}"
        )
    return images


class FeatureAdaIN(StyleTransfer):
    """Base class of the encoder -> AdaIN -> decoder backends.

    Args:
        encoder: module mapping float RGB images in [0, 1] of shape (B, 3, H, W) to a feature map
            (it does its own input normalisation); frozen and kept in eval mode.
        decoder: module mapping such a feature map back to images in (about) [0, 1].
        encoder_name: readable encoder name; :attr:`encoder_id` adds ``min_size`` and a fingerprint
            of the encoder's weights.
        min_size: smallest shorter image side the encoder is run at (smaller images are upsampled).
        device: ``auto``, ``cpu``, ``cuda`` ...
        batch_size: images per forward pass (bounds memory; results do not depend on it).
    """

    supports_privacy = True  # styles are channel moments: dataset_style(privacy=...), private_styles
    #: transfer normalises the content with the unbiased variance (CCST's public code; see the module docstring)
    unbiased_content = False

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        encoder_name: str,
        min_size: int,
        device: str | torch.device = "auto",
        batch_size: int = 128,
    ):
        if int(min_size) < 1:
            raise ConfigError(f"min_size must be a positive number of pixels, got {min_size}")
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        self.device = resolve_device(device)
        # channels-last: 3-4x faster convolutions on CPU (oneDNN), same results up to float rounding
        self.encoder = encoder.to(self.device, memory_format=torch.channels_last).eval().requires_grad_(False)
        self.decoder = decoder.to(self.device, memory_format=torch.channels_last).eval().requires_grad_(False)
        self.min_size = int(min_size)
        self.batch_size = int(batch_size)
        self._encoder_id = f"{encoder_name}@{self.min_size}:{module_fingerprint(encoder)}"

    @property
    def encoder_id(self) -> str:
        return self._encoder_id + ("+unbiased-content" if self.unbiased_content else "")

    # -- images <-> features ------------------------------------------------------------
    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, 1|3, H, W) -> float RGB in [0, 1] on the device, shorter side at least ``min_size``."""
        x = check_images(images).to(self.device, non_blocking=True).float().div_(255.0)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        height, width = x.shape[-2:]
        if min(height, width) < self.min_size:
            scale = self.min_size / min(height, width)
            size = (max(self.min_size, round(height * scale)), max(self.min_size, round(width * scale)))
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return x.contiguous(memory_format=torch.channels_last)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Features of uint8 images (after :meth:`prepare`)."""
        return self.encoder(self.prepare(images))

    def decode(self, features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """uint8 (B, 3, *size) images from features; the decoder's output is resized to ``size`` if needed."""
        x = self.decoder(features)
        if tuple(x.shape[-2:]) != tuple(size):
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
        return x.clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)

    def _chunks(self, count: int) -> Iterable[slice]:
        for start in range(0, count, self.batch_size):
            yield slice(start, min(start + self.batch_size, count))

    def _style(self, mean: torch.Tensor, std: torch.Tensor) -> Style:
        return Style(self.name, self.encoder_id, {"mean": mean.float().cpu(), "std": std.float().cpu()})

    # -- the StyleTransfer interface ------------------------------------------------------
    @torch.no_grad()
    def image_styles(self, images: torch.Tensor) -> Style:
        """Per-image (mu, sigma) of the encoder features, each (N, C) (CCST Eq. 4, 6)."""
        check_images(images)
        means, stds = [], []
        for part in self._chunks(images.shape[0]):
            mean, std = channel_stats(self.encode(images[part]), eps=ADAIN_EPS)
            means.append(mean.flatten(1))
            stds.append(std.flatten(1))
        if not means:
            raise ConfigError("image_styles got an empty batch of images")
        return self._style(torch.cat(means), torch.cat(stds))

    def _moment_sums(self, batches: Iterable[torch.Tensor], clip: float) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Per-channel float64 sums of f and f^2 over all pixels of all images and their count; ``clip`` = C > 0:
        sums of each image's moments [mean_hw f, mean_hw f^2] scaled to L2 norm <= C, and the image count."""
        total = total_sq = None
        count = 0
        for batch in batches:
            check_images(batch)
            for part in self._chunks(batch.shape[0]):
                features = self.encode(batch[part]).double()
                if clip > 0:  # the defence of fedstyle.style.privacy: one image moves the sums by <= 2C
                    first, second = features.mean(dim=(2, 3)), features.square().mean(dim=(2, 3))
                    scale = clip_factors(torch.cat([first, second], 1), clip)
                    sums, squares = (first * scale).sum(0), (second * scale).sum(0)
                    count += features.shape[0]
                else:
                    sums = features.sum(dim=(0, 2, 3))
                    squares = features.square().sum(dim=(0, 2, 3))
                    count += features.shape[0] * features.shape[2] * features.shape[3]
                total = sums if total is None else total + sums
                total_sq = squares if total_sq is None else total_sq + squares
        return total, total_sq, count

    @torch.no_grad()
    def dataset_style(self, batches: Iterable[torch.Tensor], privacy: StylePrivacy | None = None,
                      generator: torch.Generator | None = None) -> Style:
        """(mu, sigma) over all pixels of all images' features (CCST Eq. 8), N = 1, streamed in float64.

        ``privacy`` (:mod:`fedstyle.style.privacy`): from each image's first and second moments, clipped to L2
        norm C, summed, with Gaussian noise drawn from ``generator``: mu = S_1 / N, sigma^2 = S_2 / N - mu^2
        (clamped at 0) for N images (equal to Eq. 8 for images of one size, up to rounding, at a large C)."""
        total, total_sq, count = self._moment_sums(batches, privacy.clip if privacy is not None else 0.0)
        if count == 0:
            raise StyleMismatchError("dataset_style got no images: a client with no data has no style")
        if privacy is not None and privacy.noise > 0:
            total, total_sq = privacy.perturb(torch.stack([total, total_sq]), generator).unbind(0)
        mean = total / count
        var = (total_sq / count - mean.square()).clamp_(min=0.0)  # rounding can make it -1e-17
        return self._style(mean[None], (var + ADAIN_EPS).sqrt()[None])

    @torch.no_grad()
    def private_styles(self, style: Style, privacy: StylePrivacy, generator: torch.Generator) -> Style:
        """Per-image styles released under ``privacy`` (CCST Eq. 6-7, :mod:`fedstyle.style.privacy`): each
        image's [mu, sigma] (2 numbers a channel) clipped to L2 norm C, Gaussian noise on every number (one image
        moves one row by <= 2C), then sigma floored at sqrt(eps), the smallest a feature map has."""
        self.check(style)
        channels = style.tensors["mean"].shape[1]
        rows = clip_rows(torch.cat([style.tensors["mean"], style.tensors["std"]], 1).double(), privacy.clip)
        mean, std = privacy.perturb(rows, generator).split(channels, dim=1)
        if privacy.noise > 0:
            std = std.clamp_min(ADAIN_EPS ** 0.5)
        return self._style(mean, std)

    @torch.no_grad()
    def pool_styles(self, style: Style, groups: torch.Tensor) -> Style:
        """Each group's (mu, sigma) over all pixels of its images from the per-image styles: with
        equal pixel counts per image (one client's images share H x W), mu_g = mean_i mu_i and
        sigma_g^2 = mean_i (sigma_i^2 - eps + mu_i^2) - mu_g^2 (+ eps), i.e. :meth:`dataset_style`
        of the group up to float rounding, without encoding the images again."""
        self.check(style)
        mean = style.tensors["mean"].to(torch.float64)
        second = style.tensors["std"].to(torch.float64).square() - ADAIN_EPS + mean.square()  # E[f^2] per image
        group_mu = group_mean(mean, groups)
        var = (group_mean(second, groups) - group_mu.square()).clamp_(min=0.0)
        return self._style(group_mu, (var + ADAIN_EPS).sqrt())

    @torch.no_grad()
    def transfer(self, content: torch.Tensor, style: Style, alpha: float = 1.0) -> torch.Tensor:
        """dec(alpha * AdaIN(f_c, mu_t, sigma_t) + (1 - alpha) * f_c) as uint8 (B, 3, H, W) (CCST Eq. 2, 5)."""
        check_images(content, "content images")
        self.check(style)
        if not 0.0 <= float(alpha) <= 1.0:
            raise ConfigError(f"alpha (content/style interpolation) must be in [0, 1], got {alpha}")
        count, styles = content.shape[0], len(style)
        if styles not in (1, count):
            raise StyleMismatchError(
                f"transfer needs one style for all {count} content images or one per image, got {styles} styles"
            )
        mean = style.tensors["mean"].to(self.device, torch.float32)
        std = style.tensors["std"].to(self.device, torch.float32)
        size = tuple(content.shape[-2:])
        out = torch.empty((count, 3, *size), dtype=torch.uint8)
        for part in self._chunks(count):
            features = self.encode(content[part])
            if features.shape[1] != mean.shape[1]:
                raise StyleMismatchError(
                    f"the style has {mean.shape[1]} channels but the encoder gives {features.shape[1]}"
                )
            target_mean, target_std = (mean, std) if styles == 1 else (mean[part], std[part])
            restyled = adain(features, target_mean[..., None, None], target_std[..., None, None], eps=ADAIN_EPS,
                             unbiased=self.unbiased_content)
            if alpha < 1.0:
                restyled = alpha * restyled + (1.0 - alpha) * features
            out[part] = self.decode(restyled, size).cpu()
        return out
