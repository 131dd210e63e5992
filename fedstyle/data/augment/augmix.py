"""AugMix (Hendrycks et al., ICLR'20) as batched tensor ops: k chains of label-preserving operations, mixed.

Per sample: chain weights w ~ Dirichlet(alpha, ..., alpha) over ``width`` = k = 3 chains, a skip
weight m ~ Beta(alpha, alpha); chain i applies d_i operations (``depth``; -1 draws d_i uniformly
from {1, 2, 3} per chain and sample), each picked uniformly with replacement from ``ops``, with a
magnitude level ~ U(0.1, severity) and a random sign, and

    x_augmix = (1 - m) * x + m * sum_i w_i * chain_i(x).

Mixing happens on pixels in [0, 1] (the batch is un-normalised, augmented and re-normalised;
convex combinations commute with the normalisation, as in the official code), so the output stays
in the image range. Operations, on the whole batch at once (samples grouped by the operation they
drew; no PIL, no per-image Python), with the official severity mapping (level / 10 of the maximum):

* autocontrast: per sample and channel, stretch [min, max] to [0, 1] (identity when flat);
* equalize: histogram equalisation per sample and channel on the 256 quantised levels, PIL's
  ``ImageOps.equalize`` look-up table computed from a batched histogram (scatter_add);
* posterize: keep 4 - int(4 level / 10) bits of the 8-bit value;
* solarize: invert values >= 256 - int(256 level / 10) (in 8-bit units);
* rotate (up to 30 level / 10 degrees), shear_x / shear_y (up to 0.3 level / 10), translate_x /
  translate_y (up to int(side / 3 * level / 10) pixels of the actual image side): one per-sample
  affine matrix, ``affine_grid`` + bilinear ``grid_sample``, zero (black) fill like PIL. Rotation and
  shear act about the image centre (PIL shears about the top-left corner, i.e. also shifts);
* with ``ops`` extended (AugMix's ``--all-ops``): brightness, contrast, color, sharpness with PIL's
  enhancement factors 0.1 + 1.8 level / 10.

Defaults: width 3, depth -1, severity 3, alpha 1 (the official CIFAR settings), the nine default ops.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from fedstyle.data.augment.common import Augmentation, Draws, apply_groups, check_choice
from fedstyle.errors import ConfigError

GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
DEFAULT_OPS = ("autocontrast", "equalize", "posterize", "rotate", "solarize", "shear_x", "shear_y",
               "translate_x", "translate_y")
EXTRA_OPS = ("brightness", "contrast", "color", "sharpness")  # ImageNet-C-overlapping (--all-ops)
ALL_OPS = DEFAULT_OPS + EXTRA_OPS


def _levels(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    return level.to(v.device, v.dtype).view(-1, 1, 1, 1)


def _gray(v: torch.Tensor) -> torch.Tensor:
    if v.shape[1] == 3:
        return 0.299 * v[:, 0:1] + 0.587 * v[:, 1:2] + 0.114 * v[:, 2:3]
    return v.mean(1, keepdim=True)


def autocontrast(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    lo = v.amin((2, 3), keepdim=True)
    hi = v.amax((2, 3), keepdim=True)
    span = hi - lo
    return torch.where(span > 0, (v - lo) / span.clamp_min(1e-12), v)


def equalize(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """PIL's equalize per sample and channel: lut[i] = (step // 2 + #values below i) // step with
    step = (count - count of the highest occupied level) // 255 (identity when step is 0)."""
    n, c, h, w = v.shape
    q = (v * 255.0).round().clamp(0, 255).long().reshape(n * c, h * w)
    hist = torch.zeros(n * c, 256, dtype=torch.long, device=v.device).scatter_add_(1, q, torch.ones_like(q))
    last = 255 - (hist > 0).flip(1).to(torch.int32).argmax(1, keepdim=True)
    step = (hist.sum(1, keepdim=True) - hist.gather(1, last)) // 255
    safe = step.clamp_min(1)
    lut = ((hist.cumsum(1) - hist + safe // 2) // safe).clamp_max(255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=v.device).expand_as(lut))
    return (lut.gather(1, q).to(v.dtype) / 255.0).view(n, c, h, w)


def posterize(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """Keep the top 4 - int(4 level / 10) bits: floor(q / 2^(8 - bits)) * 2^(8 - bits) on the 8-bit value q
    (exact in float arithmetic)."""
    bits = 4 - (level * 4 / 10).long()  # per sample, CPU
    div = (2.0 ** (8 - bits)).to(v.device, v.dtype).view(-1, 1, 1, 1)
    q = (v * 255.0).round().clamp(0, 255)
    return torch.floor(q / div) * div / 255.0


def solarize(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    threshold = (256 - (level * 256 / 10).long()).to(v.device, v.dtype).view(-1, 1, 1, 1)
    return torch.where(v * 255.0 >= threshold, 1.0 - v, v)


def _factor(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    return _levels(v, level * 1.8 / 10 + 0.1)


def brightness(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    return (v * _factor(v, level)).clamp(0, 1)


def contrast(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    m = _gray(v).mean((2, 3), keepdim=True)
    return (m + _factor(v, level) * (v - m)).clamp(0, 1)


def color(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    g = _gray(v)
    return (g + _factor(v, level) * (v - g)).clamp(0, 1)


def sharpness(v: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH kernel [[1,1,1],[1,5,1],[1,1,1]] / 13 as the degenerate image; borders keep the original."""
    c = v.shape[1]
    kernel = torch.ones(3, 3, device=v.device, dtype=v.dtype)
    kernel[1, 1] = 5
    kernel = (kernel / 13).expand(c, 1, 3, 3)
    smooth = v.clone()
    smooth[:, :, 1:-1, 1:-1] = F.conv2d(v, kernel, groups=c)
    return (smooth + _factor(v, level) * (v - smooth)).clamp(0, 1)


POINTWISE = {"autocontrast": autocontrast, "equalize": equalize, "posterize": posterize, "solarize": solarize,
             "brightness": brightness, "contrast": contrast, "color": color, "sharpness": sharpness}


def affine_matrices(kind: torch.Tensor, level: torch.Tensor, sign: torch.Tensor, height: int,
                    width: int) -> torch.Tensor:
    """(n, 2, 3) ``affine_grid`` matrices (output -> input, normalised coordinates, align_corners=False)
    of the geometric ops ``GEOMETRIC[kind[b]]`` (-1: identity) with the official AugMix magnitudes; CPU."""
    n = kind.shape[0]
    rad = torch.deg2rad((level * 30 / 10).long().float() * sign)
    shear = level * 0.3 / 10 * sign
    rot, zero, one = kind == 0, torch.zeros(n), torch.ones(n)
    a = torch.empty(n, 2, 2)
    a[:, 0, 0] = torch.where(rot, torch.cos(rad), one)
    a[:, 0, 1] = torch.where(rot, -torch.sin(rad), torch.where(kind == 1, shear, zero))
    a[:, 1, 0] = torch.where(rot, torch.sin(rad), torch.where(kind == 2, shear, zero))
    a[:, 1, 1] = torch.where(rot, torch.cos(rad), one)
    t = torch.stack([torch.where(kind == 3, (level * (width / 3) / 10).long().float() * sign, zero),
                     torch.where(kind == 4, (level * (height / 3) / 10).long().float() * sign, zero)], 1)
    half = torch.tensor([width / 2.0, height / 2.0])
    theta = torch.empty(n, 2, 3)
    theta[:, :, :2] = a * half.view(1, 1, 2) / half.view(1, 2, 1)  # D^-1 A D, D = diag(W/2, H/2)
    theta[:, :, 2] = t / half
    return theta


def sampling_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``F.affine_grid(theta, (n, C, height, width), align_corners=False)`` as three broadcast
    multiply-adds per coordinate (affine_grid's batched matmul is the slowest part on a CPU)."""
    xs = (torch.arange(width, device=theta.device, dtype=theta.dtype) * 2 + 1) / width - 1
    ys = (torch.arange(height, device=theta.device, dtype=theta.dtype) * 2 + 1) / height - 1
    xs, ys = xs.view(1, 1, width), ys.view(1, height, 1)
    t = theta.view(-1, 6, 1, 1)
    gx = t[:, 0] * xs + t[:, 1] * ys + t[:, 2]
    gy = t[:, 3] * xs + t[:, 4] * ys + t[:, 5]
    return torch.stack([gx, gy], dim=-1)


class AugMix(Augmentation):
    name = "augmix"
    label = "AugMix"
    OPTIONS = {
        "width": (3, "k: number of augmentation chains mixed"),
        "depth": (-1, "operations per chain; -1 draws 1..3 per chain and sample"),
        "severity": (3.0, "magnitude levels are drawn from U(0.1, severity), severity in (0.1, 10]"),
        "alpha": (1.0, "concentration of the Dirichlet chain weights and the Beta skip weight"),
        "ops": (DEFAULT_OPS, "operations to draw from (AugMix's nine; add brightness/contrast/color/sharpness "
                             "for all-ops)"),
    }

    def __init__(self, mean: Sequence[float], std: Sequence[float], width: int = 3, depth: int = -1,
                 severity: float = 3.0, alpha: float = 1.0, ops: Sequence[str] = DEFAULT_OPS):
        super().__init__(mean, std)
        if width < 1:
            raise ConfigError(f"augmix width (number of chains) must be >= 1, got {width}")
        if depth == 0 or depth < -1:
            raise ConfigError(f"augmix depth must be >= 1, or -1 for a random depth in 1..3, got {depth}")
        if not 0.1 < severity <= 10:
            raise ConfigError(f"augmix severity must be in (0.1, 10], got {severity}")
        if alpha <= 0:
            raise ConfigError(f"augmix alpha must be > 0 (Dirichlet/Beta concentration), got {alpha}")
        self.width, self.depth, self.severity, self.alpha = int(width), int(depth), float(severity), float(alpha)
        self.ops = check_choice("augmix ops", ops, ALL_OPS)
        self._pointwise = [op for op in self.ops if op in POINTWISE]
        # per entry of self.ops: its geometric kind (index into GEOMETRIC, -1 if pointwise) and its group
        # (0: the one affine warp shared by the geometric ops; 1 + k: the k-th pointwise op)
        self._kind = torch.tensor([GEOMETRIC.index(op) if op in GEOMETRIC else -1 for op in self.ops])
        self._group = torch.tensor([0 if op in GEOMETRIC else 1 + self._pointwise.index(op) for op in self.ops])

    def _step(self, v: torch.Tensor, op: torch.Tensor, draws: Draws) -> torch.Tensor:
        """One operation per sample (``op[b]`` indexes ``self.ops``; -1: none); all parameters on the CPU."""
        n = v.shape[0]
        level = draws.uniform(n, 0.1, self.severity)
        sign = draws.signs(n)
        some = op >= 0
        group = torch.where(some, self._group[op.clamp_min(0)], -1)
        kind = torch.where(some, self._kind[op.clamp_min(0)], -1)
        theta = affine_matrices(kind, level, sign, v.shape[2], v.shape[3])

        def geometric(sub: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            grid = sampling_grid(draws.to_device(theta[idx]), sub.shape[2], sub.shape[3])
            return F.grid_sample(sub, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

        def pointwise(fn):
            return lambda sub, idx: fn(sub, level[idx])

        return apply_groups(v, group, [geometric, *[pointwise(POINTWISE[nm]) for nm in self._pointwise]])

    def apply(self, x: torch.Tensor, draws: Draws) -> torch.Tensor:
        u = self.norm.to_pixels(x)
        n = u.shape[0]
        ws = draws.to_device(draws.dirichlet(n, self.width, self.alpha))
        m = draws.to_device(draws.beta(n, self.alpha)).view(n, 1, 1, 1)
        mixed = torch.zeros_like(u)
        for i in range(self.width):
            depth = torch.full((n,), self.depth) if self.depth > 0 else draws.integers(3, n) + 1
            v = u
            for step in range(int(depth.max())):
                op = draws.integers(len(self.ops), n)
                op[depth <= step] = -1
                v = self._step(v, op, draws)
            mixed = mixed + ws[:, i].view(n, 1, 1, 1) * v
        return self.norm.from_pixels((1.0 - m) * u + m * mixed)
