"""Batched input pipeline: uint8 images in, augmented and normalised float32 out.

Augmentations work on a whole uint8 batch at once, on whatever device the batch lives on. Every
random number is drawn on the CPU from the caller's ``torch.Generator`` and only then moved to the
device, so a given generator state yields the same batch on CPU and GPU.

Cropping with reflection padding is one gather: output pixel ``(i, j)`` of sample ``b`` reads
source pixel ``(reflect(i + dy_b - p), reflect(j + dx_b - p))``, which is exactly "pad by ``p``
with reflection, then crop at offset ``(dy_b, dx_b)``" without materialising the padded batch.
A horizontal flip just reverses the column index map.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from fedstyle.errors import ConfigError
from fedstyle.registry import Registry

# An augmentation maps a uint8 (B, 3, H, W) batch and a CPU generator to a uint8 batch.
Augmentation = Callable[[torch.Tensor, "torch.Generator | None"], torch.Tensor]
AUGMENTATIONS: Registry[Augmentation] = Registry("augmentation")


def crop_padding(size: int) -> int:
    """Padding of the random crop: ``max(2, size // 8)`` (4 px at 32, 28 px at 224)."""
    return max(2, size // 8)


def reflect_indices(size: int, offsets: torch.Tensor, padding: int) -> torch.Tensor:
    """Source indices (B, size) of a crop at ``offsets`` from a reflection-padded axis.

    Matches ``torch.nn.functional.pad(mode="reflect")``: the edge pixel is not repeated, so
    index ``-1`` maps to ``1`` and index ``size`` maps to ``size - 2``.
    """
    if padding >= size:
        raise ConfigError(f"reflection padding {padding} needs images larger than {padding} pixels, got {size}")
    positions = torch.arange(size, device=offsets.device) + offsets[:, None] - padding
    positions = positions.abs()
    return torch.where(positions >= size, 2 * (size - 1) - positions, positions)


def gather_pixels(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``out[b, c, i, j] = x[b, c, rows[b, i], cols[b, j]]`` for a (B, C, H, W) batch."""
    batch = torch.arange(x.shape[0], device=x.device)[:, None, None]
    # Advanced indices separated by a slice move to the front: result is (B, H', W', C).
    return x[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def _random_crop_maps(
    x: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, _, height, width = x.shape
    pad_h, pad_w = crop_padding(height), crop_padding(width)
    dy = torch.randint(0, 2 * pad_h + 1, (batch,), generator=generator)
    dx = torch.randint(0, 2 * pad_w + 1, (batch,), generator=generator)
    rows = reflect_indices(height, dy.to(x.device), pad_h)
    cols = reflect_indices(width, dx.to(x.device), pad_w)
    return rows, cols


@AUGMENTATIONS.register("none")
def no_augmentation(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    return x


@AUGMENTATIONS.register("crop")
def random_crop(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Reflection-pad by ``max(2, size // 8)`` and crop back at a random offset per sample."""
    rows, cols = _random_crop_maps(x, generator)
    return gather_pixels(x, rows, cols)


@AUGMENTATIONS.register("crop_flip")
def random_crop_flip(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """:func:`random_crop`, then a horizontal flip of each sample with probability 1/2."""
    rows, cols = _random_crop_maps(x, generator)
    flip = (torch.rand(x.shape[0], generator=generator) < 0.5).to(x.device)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    return gather_pixels(x, rows, cols)


class BatchTransform:
    """Turns a uint8 (B, 3, H, W) batch into normalised float32 ``(x / 255 - mean) / std``.

    With ``train=True`` the named augmentation runs first (on uint8, which is cheaper to gather);
    with ``train=False`` the batch is only normalised. Output stays on the input's device.
    Without a generator, training draws from torch's default CPU generator (seeded by
    ``torch.manual_seed``); pass one for reproducible, device-independent batches.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], augment: str = "none",
                 output_size: int | None = None):
        if len(mean) != 3 or len(std) != 3:
            raise ConfigError(f"mean and std need 3 channel values, got {list(mean)} and {list(std)}")
        if min(std) <= 0:
            raise ConfigError(f"std must be positive, got {list(std)}")
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        self.augment = augment
        self._augmentation = AUGMENTATIONS.get(augment)
        #: the model's input side when images are stored smaller (``--input-resolution``): the batch is resized
        #: bilinearly on its device after the crop and flip, so the cache holds the small side only (issue 54)
        self.output_size = output_size

    def __call__(
        self, x: torch.Tensor, train: bool, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
            raise ConfigError(f"BatchTransform expects uint8 (B, 3, H, W), got {x.dtype} {tuple(x.shape)}")
        if train:
            x = self._augmentation(x, generator)
        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        # channels-last: the convolution kernels of CPUs (oneDNN) and GPUs (tensor cores) run faster
        # on NHWC; measured 1.7x for the digits ConvNet on this 2-core CPU (docs/results/speed.md
        # "Speed: FedAvg on digits4")
        x = x.contiguous(memory_format=torch.channels_last)
        x = x.to(torch.float32)
        if self.output_size is not None and tuple(x.shape[-2:]) != (self.output_size, self.output_size):
            x = torch.nn.functional.interpolate(x, size=(self.output_size, self.output_size), mode="bilinear",
                                                align_corners=False, antialias=self.output_size < x.shape[-1])
            x = x.contiguous(memory_format=torch.channels_last)
        return (x / 255.0 - mean) / std

    def aligned(
        self, batches: Sequence[torch.Tensor], train: bool, generator: torch.Generator | None = None
    ) -> list[torch.Tensor]:
        """Transform several uint8 batches of the same samples with one random draw: batch k of the
        output is batch k of the input cut by the same crop offsets and flips (aligned views)."""
        if not batches:
            return []
        shape = batches[0].shape
        for x in batches:
            if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3 or x.shape[0] != shape[0] \
                    or x.shape[-2:] != shape[-2:]:
                raise ConfigError(f"aligned batches must be uint8 (B, 3, H, W) of one shape, got {x.dtype} "
                                  f"{tuple(x.shape)} beside {tuple(shape)}")
        stacked = torch.cat(list(batches), dim=1)  # the augmentations are channel-agnostic gathers
        if train:
            stacked = self._augmentation(stacked, generator)
        return [self(part.contiguous(), train=False) for part in stacked.split(3, dim=1)]

    def __repr__(self) -> str:
        size = f", output_size={self.output_size}" if self.output_size is not None else ""
        return f"BatchTransform(mean={self.mean}, std={self.std}, augment={self.augment!r}{size})"
