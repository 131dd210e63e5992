"""Multi-scale texture corruption: noise, blur or a random texture at one of several spatial scales.

FedGCA names "multi-scale texture corruption" among its style-complement generators without
defining it (its supplement is missing); this is fedstyle's construction. Each sample draws one
corruption ``kind`` and one ``scale`` uniformly. A scale s is a cell size of c = max(1, s * side / 32)
pixels (side = the smaller image side), so s = 1, 2, 4 are 1, 2, 4 px at 32 x 32 and 7, 14, 28 px
at 224 x 224 — the same corruption relative to the image at every resolution. On pixels in [0, 1]:

* ``noise``: u + sigma * up(eps), eps ~ N(0, 1) per channel on a grid of (H / c) x (W / c) cells,
  bilinearly upsampled (c = 1: per-pixel noise; larger c: coloured blotches), sigma ~ U(0, noise_std);
* ``blur``: a separable Gaussian blur of standard deviation blur_sigma * c pixels (replicate border);
* ``texture``: (1 - t) * u + t * sigmoid(T), T = up(eps_c) + 0.5 * up(eps_{c/2}) a two-octave
  coloured random texture, t ~ U(0, texture_strength).

The result is clamped to [0, 1] and re-normalised, so shapes and the value range are kept.
Defaults: kinds noise/blur/texture, scales 1/2/4, noise_std 0.2, blur_sigma 0.5, texture_strength 0.5.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from fedstyle.data.augment.common import Augmentation, Draws, apply_groups, check_choice
from fedstyle.errors import ConfigError

KINDS = ("noise", "blur", "texture")


def cell_size(scale: float, height: int, width: int) -> int:
    return max(1, int(round(scale * min(height, width) / 32)))


def upsampled_noise(draws: Draws, n: int, c: int, height: int, width: int, cell: int) -> torch.Tensor:
    """N(0, 1) per channel on a grid of ``cell``-pixel cells, bilinearly upsampled to (height, width)."""
    grid = (max(1, math.ceil(height / cell)), max(1, math.ceil(width / cell)))
    eps = draws.noise((n, c, *grid))
    if grid == (height, width):
        return eps
    return F.interpolate(eps, size=(height, width), mode="bilinear", align_corners=False)


def gaussian_blur(u: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of each channel (std ``sigma`` pixels, radius ceil(3 sigma), replicate border)."""
    radius = max(1, math.ceil(3 * sigma))
    taps = torch.arange(-radius, radius + 1, device=u.device, dtype=u.dtype)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = kernel / kernel.sum()
    c = u.shape[1]
    out = F.pad(u, (radius, radius, 0, 0), mode="replicate")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    out = F.pad(out, (0, 0, radius, radius), mode="replicate")
    return F.conv2d(out, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


class TextureCorruption(Augmentation):
    name = "texture"
    label = "Texture"
    OPTIONS = {
        "kinds": (KINDS, "corruptions to draw from: noise/blur/texture"),
        "scales": ((1.0, 2.0, 4.0), "cell sizes in units of 1/32 of the image side"),
        "noise_std": (0.2, "largest standard deviation of the additive noise (pixels in [0, 1])"),
        "blur_sigma": (0.5, "blur standard deviation per cell pixel"),
        "texture_strength": (0.5, "largest blend weight of the random texture"),
    }

    def __init__(self, mean: Sequence[float], std: Sequence[float], kinds: Sequence[str] = KINDS,
                 scales: Sequence[float] = (1.0, 2.0, 4.0), noise_std: float = 0.2, blur_sigma: float = 0.5,
                 texture_strength: float = 0.5):
        super().__init__(mean, std)
        self.kinds = check_choice("texture kinds", kinds, KINDS)
        self.scales = tuple(float(s) for s in scales)
        if not self.scales or min(self.scales) <= 0:
            raise ConfigError(f"texture scales must be positive, got {list(scales)}")
        if noise_std < 0 or blur_sigma <= 0 or not 0 <= texture_strength <= 1:
            raise ConfigError("texture needs noise_std >= 0, blur_sigma > 0 and texture_strength in [0, 1], got "
                              f"{noise_std}, {blur_sigma}, {texture_strength}")
        self.noise_std, self.blur_sigma = float(noise_std), float(blur_sigma)
        self.texture_strength = float(texture_strength)

    def _corruption(self, kind: str, scale: float, draws: Draws, strength: torch.Tensor):
        def run(u: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            n, c, h, w = u.shape
            cell = cell_size(scale, h, w)
            s = draws.to_device(strength[idx]).view(n, 1, 1, 1)
            if kind == "noise":
                return u + self.noise_std * s * upsampled_noise(draws, n, c, h, w, cell)
            if kind == "blur":
                return gaussian_blur(u, self.blur_sigma * cell)
            texture = upsampled_noise(draws, n, c, h, w, cell)
            texture = texture + 0.5 * upsampled_noise(draws, n, c, h, w, max(1, cell // 2))
            t = self.texture_strength * s
            return (1.0 - t) * u + t * torch.sigmoid(texture)
        return run

    def apply(self, x: torch.Tensor, draws: Draws) -> torch.Tensor:
        u = self.norm.to_pixels(x)
        n = u.shape[0]
        combos = [(k, s) for k in self.kinds for s in self.scales]
        choice = draws.integers(len(combos), n)
        strength = draws.uniform(n)
        out = apply_groups(u, choice, [self._corruption(k, s, draws, strength) for k, s in combos])
        return self.norm.from_pixels(out.clamp(0.0, 1.0))
