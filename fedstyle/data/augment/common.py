"""What every batched augmentation shares: the normalisation it undoes, its random draws, per-sample groups.

Augmentations take the **normalised float batch the model sees**, ``x = (pixels / 255 - mean) / std``
of shape (B, C, H, W) on the training device, and return a batch of the same shape, dtype and
device. Ops defined on pixels (AugMix's operations, texture corruption) un-normalise to [0, 1]
with :class:`Normalization`, work there, clamp to [0, 1] and re-normalise; RandConv convolves the
normalised batch directly (its recipe) and clamps to the normalised image range. Either way the
output stays inside ``[(0 - mean) / std, (1 - mean) / std]`` per channel, the range of real images.

Randomness (:class:`Draws`): small draws that steer the computation — kernel sizes, which op a
sample gets, per-sample magnitudes, filter weights, mixing weights — are made on the CPU and then
copied to the device (no host synchronisation); large draws (noise fields the size of the batch)
are made on the device. With an explicit CPU ``torch.Generator`` every draw comes from it, so the
output is a function of the generator's state (and of the device's arithmetic). Without one
(``generator=None``, the training path) the small draws come from torch's global CPU generator and
the large ones from the global generator of the batch's device — both seeded per client, round and
phase by the runtime, so runs are reproducible.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import torch
from torch.distributions import Gamma

from fedstyle.errors import ConfigError


class Normalization:
    """The per-channel affine map between pixels in [0, 1] and the normalised batch."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        if len(mean) != len(std) or not len(mean):
            raise ConfigError(f"mean and std need one value per channel, got {list(mean)} and {list(std)}")
        if min(std) <= 0:
            raise ConfigError(f"std must be positive, got {list(std)}")
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)

    def _stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 4 or x.shape[1] != len(self.mean):
            raise ConfigError(f"augmentations take a (B, {len(self.mean)}, H, W) float batch, got {tuple(x.shape)}")
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return mean, std

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised batch -> pixels, clamped to [0, 1]."""
        mean, std = self._stats(x)
        return (x * std + mean).clamp_(0.0, 1.0)

    def from_pixels(self, u: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(u)
        return (u - mean) / std

    def bounds(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised images' range per channel: ((0 - mean) / std, (1 - mean) / std), shaped (1, C, 1, 1)."""
        mean, std = self._stats(x)
        return -mean / std, (1.0 - mean) / std


class Draws:
    """The random numbers of one augmentation call (see the module docstring for where they come from)."""

    def __init__(self, x: torch.Tensor, generator: torch.Generator | None):
        if generator is not None and generator.device.type != "cpu":
            raise ConfigError("augmentations take a CPU torch.Generator (or None for torch's seeded global ones)")
        self.generator = generator
        self.device = x.device
        self.dtype = x.dtype

    # -- small draws, on the CPU ----------------------------------------------------------
    def uniform(self, shape: Sequence[int] | int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return low + (high - low) * torch.rand(shape, generator=self.generator)

    def normal(self, shape: Sequence[int]) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.generator)

    def integers(self, high: int, shape: Sequence[int] | int) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return torch.randint(0, high, shape, generator=self.generator)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[int(self.integers(len(options), ()))]

    def signs(self, n: int) -> torch.Tensor:
        return self.integers(2, n).to(torch.float32) * 2.0 - 1.0

    def gamma(self, concentration: torch.Tensor) -> torch.Tensor:
        """Gamma(concentration, 1) samples. torch's Gamma sampler takes no generator: with one, the
        global CPU generator is forked and seeded from it, so the draw is still a function of it."""
        if self.generator is None:
            return Gamma(concentration, torch.ones_like(concentration)).sample()
        seed = int(torch.randint(0, 2**62, (), generator=self.generator))
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            return Gamma(concentration, torch.ones_like(concentration)).sample()

    def dirichlet(self, n: int, k: int, alpha: float) -> torch.Tensor:
        """(n, k) rows ~ Dirichlet(alpha, ..., alpha)."""
        g = self.gamma(torch.full((n, k), float(alpha)))
        return g / g.sum(1, keepdim=True).clamp_min(1e-30)

    def beta(self, n: int, alpha: float) -> torch.Tensor:
        """(n,) ~ Beta(alpha, alpha)."""
        g = self.gamma(torch.full((n, 2), float(alpha)))
        return g[:, 0] / (g.sum(1).clamp_min(1e-30))

    # -- large draws, on the device -------------------------------------------------------
    def noise(self, shape: Sequence[int]) -> torch.Tensor:
        """Standard normal noise on the batch's device."""
        if self.generator is None:
            return torch.randn(tuple(shape), device=self.device, dtype=self.dtype)
        return torch.randn(tuple(shape), generator=self.generator, dtype=self.dtype).to(self.device)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=self.dtype if t.is_floating_point() else t.dtype, non_blocking=True)


GroupFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def apply_groups(x: torch.Tensor, choice: torch.Tensor, fns: Sequence[GroupFn | None]) -> torch.Tensor:
    """Per-sample dispatch: sample ``b`` gets ``fns[choice[b]]`` (``None``: unchanged).

    ``choice`` is a CPU (B,) integer tensor, so the groups' sizes are known on the host and no
    device synchronisation happens. Each function gets its group's samples and their CPU indices
    (to look up per-sample parameters drawn on the CPU) and runs once on the whole group.
    """
    batch = x.shape[0]
    out = None
    for k, fn in enumerate(fns):
        if fn is None:
            continue
        idx = torch.nonzero(choice == k).flatten()
        if idx.numel() == 0:
            continue
        if idx.numel() == batch:
            return fn(x, idx)
        if out is None:
            out = x.clone()
        dev = idx.to(x.device, non_blocking=True)
        out.index_copy_(0, dev, fn(x.index_select(0, dev), idx).to(out.dtype))
    return x if out is None else out


class Augmentation:
    """Base class: a batched image augmentation of the normalised batch (see the module docstring).

    ``OPTIONS`` declares the constructor's keyword options as ``name: (default, help)``; they are what
    ``--hp augment_args=NAME=VALUE,...`` may set (lists written with ``/``, e.g. ``kernel_sizes=1/3``).
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, tuple[Any, str]]] = {}

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.norm = Normalization(mean, std)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One augmented copy of ``x`` (same shape, dtype, device and value range)."""
        if not x.is_floating_point():
            raise ConfigError(f"{type(self).__name__} takes the normalised float batch, got {x.dtype}")
        if x.shape[0] == 0:
            return x
        return self.apply(x, Draws(x, generator))

    def apply(self, x: torch.Tensor, draws: Draws) -> torch.Tensor:
        raise NotImplementedError

    def views(self, x: torch.Tensor, n: int, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        """``n`` independently augmented copies of ``x`` (fresh random parameters for each)."""
        return [self(x, generator) for _ in range(n)]

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.OPTIONS if hasattr(self, k))
        return f"{type(self).__name__}({opts})"


def check_choice(name: str, values: Sequence[str], valid: Sequence[str]) -> tuple[str, ...]:
    values = tuple(values)
    if not values:
        raise ConfigError(f"{name} is empty; choose from {'/'.join(valid)}")
    for v in values:
        if v not in valid:
            raise ConfigError(f"{name}: unknown {v!r}; choose from {'/'.join(valid)}")
    return values
