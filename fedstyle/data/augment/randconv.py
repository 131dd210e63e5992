"""RandConv (Xu et al., ICLR'21): convolve the image with a freshly drawn random filter.

Per call (one "repetition"): a kernel size k drawn uniformly from ``kernel_sizes`` ({1, 3, 5, 7}),
weights W in R^{C x C x k x k} drawn i.i.d. from N(0, 1 / (C_in k^2)) — Kaiming-normal with fan-in
and gain 1, the public recipe's initialisation —, stride 1, padding k // 2, no bias, and

    RC_mix (``mix=True``, default):  x' = a * (W * x) + (1 - a) * x,   a ~ U(mix_low, mix_high) = U(0, 1)
    RC_img (``mix=False``):           x' = W * x

Normalisation: like the public recipe, the filter runs on the **normalised** batch
(x = (pixels - mean) / std); the variance 1 / (C_in k^2) keeps the output's second moment at the
input's for roughly zero-mean, unit-variance inputs. The result is then clamped to the normalised
image range [(0 - mean) / std, (1 - mean) / std] per channel (``clamp=True``; the public code's
optional ``clamp_output``), so augmented images are valid images. With k = 1 and a = 0 the output
is the input exactly.

``per_sample=False`` (default, the public code): one filter and one mixing weight per call for the
whole batch. ``per_sample=True``: one filter and one weight per sample (a grouped convolution); the
kernel size stays one per call. Every call draws new weights ("resampled per repetition").
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from fedstyle.data.augment.common import Augmentation, Draws
from fedstyle.errors import ConfigError


class RandConv(Augmentation):
    name = "randconv"
    label = "RC"
    OPTIONS = {
        "kernel_sizes": ((1, 3, 5, 7), "odd kernel sizes, one drawn uniformly per call"),
        "mix": (True, "RC_mix: blend a*(W*x) + (1-a)*x (true) or use W*x alone, RC_img (false)"),
        "mix_low": (0.0, "lower end of the mixing weight a ~ U(mix_low, mix_high)"),
        "mix_high": (1.0, "upper end of the mixing weight"),
        "per_sample": (False, "one filter and mixing weight per sample (true) or per batch (false, the public code)"),
        "clamp": (True, "clamp the output to the normalised image range"),
    }

    def __init__(self, mean: Sequence[float], std: Sequence[float], kernel_sizes: Sequence[int] = (1, 3, 5, 7),
                 mix: bool = True, mix_low: float = 0.0, mix_high: float = 1.0, per_sample: bool = False,
                 clamp: bool = True):
        super().__init__(mean, std)
        self.kernel_sizes = tuple(int(k) for k in kernel_sizes)
        if not self.kernel_sizes or any(k < 1 or k % 2 == 0 for k in self.kernel_sizes):
            raise ConfigError(f"randconv kernel_sizes must be odd and >= 1, got {list(kernel_sizes)}")
        if not 0.0 <= mix_low <= mix_high <= 1.0:
            raise ConfigError(f"randconv needs 0 <= mix_low <= mix_high <= 1, got {mix_low} and {mix_high}")
        self.mix, self.mix_low, self.mix_high = bool(mix), float(mix_low), float(mix_high)
        self.per_sample, self.clamp = bool(per_sample), bool(clamp)

    def sample_weights(self, draws: Draws, filters: int, channels: int) -> torch.Tensor:
        """(filters * C, C, k, k) weights ~ N(0, 1 / (C k^2)), k drawn from ``kernel_sizes``."""
        k = draws.choice(self.kernel_sizes)
        w = draws.normal((filters * channels, channels, k, k)) / math.sqrt(channels * k * k)
        return draws.to_device(w)

    def apply(self, x: torch.Tensor, draws: Draws) -> torch.Tensor:
        b, c, h, w_ = x.shape
        filters = b if self.per_sample else 1
        weight = self.sample_weights(draws, filters, c)
        pad = weight.shape[-1] // 2
        if self.per_sample:
            out = F.conv2d(x.reshape(1, b * c, h, w_), weight, padding=pad, groups=b).view(b, c, h, w_)
        else:
            out = F.conv2d(x, weight, padding=pad)
        if self.mix:
            a = draws.to_device(draws.uniform((filters, 1, 1, 1), self.mix_low, self.mix_high))
            out = a * out + (1.0 - a) * x
        if self.clamp:
            lo, hi = self.norm.bounds(x)
            out = torch.maximum(torch.minimum(out, hi), lo)
        return out
