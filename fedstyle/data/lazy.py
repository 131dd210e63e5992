"""Images made on first read: rows of a generated dataset (CCST's restyled copies, PARDON's
transfers to S_g) computed when a batch first needs them, kept in a memory-mapped file.

A run of a few hundred local steps reads a small fraction of a client's d x K augmented images;
generating all of them up front cost CCST 13 minutes on 2 CPU cores for a run whose training took
one (issue 27). :class:`LazyImages` stands where a client's uint8 image tensor stands
(:class:`fedstyle.data.client.SamplePool`, an aligned view) and answers the reads a client makes —
``index_select`` of a batch's rows, ``len``, ``shape`` — by calling ``make`` on the rows not made
yet, writing them into ``store`` (a shared memory map, so a later run with the same cache entry finds
them) and setting their byte in ``made``. Reading the whole tensor (``materialize``) makes every row.

The pixels do not depend on when a row is made or with which others: ``make`` must compute each
row on its own terms (a style transfer is per image; checked bit for bit on CPU by the tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class MakeCount:
    """Rows made and seconds spent making them, shared by a :class:`LazyImages` and its device copies.

    ``transferred``: the rows among them that needed the style backend, counted by the ``make``
    function (the others were copies, e.g. CCST's kept originals), so a rate is the backend's.
    """

    images: int = 0
    seconds: float = 0.0
    transferred: int = 0


class LazyImages:
    """uint8 images (N, C, H, W) whose rows are made by ``make(rows)`` on first read.

    ``store``: an (N, C, H, W) uint8 tensor over a writable shared memory map; ``made``: an (N,)
    uint8 numpy memory map, 1 where the row of ``store`` holds its image. ``make`` receives sorted
    distinct row indices (int64, CPU) and returns their images (uint8, CPU). ``count`` holds the
    work this object and its device copies did (not what an earlier run left in the cache).
    """

    dtype = torch.uint8

    def __init__(self, store: torch.Tensor, made: np.ndarray, make: Callable[[torch.Tensor], torch.Tensor],
                 device: torch.device | str = "cpu", batch_size: int = 256, count: MakeCount | None = None):
        if store.dim() != 4 or store.dtype != torch.uint8 or tuple(made.shape) != (store.shape[0],):
            raise ValueError("LazyImages needs a uint8 (N, C, H, W) store and an (N,) made map")
        self.store, self.made, self.make = store, made, make
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.count = count if count is not None else MakeCount()

    # -- what a tensor of images answers ----------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self.store.shape

    def __len__(self) -> int:
        return int(self.store.shape[0])

    def dim(self) -> int:
        return 4

    def numel(self) -> int:
        return self.store.numel()

    def element_size(self) -> int:
        return 1

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "LazyImages":
        """The same images, read onto ``device`` (the store and the made map stay where they are)."""
        device = torch.device(device)
        if device == self.device:
            return self
        return LazyImages(self.store, self.made, self.make, device, self.batch_size, self.count)

    def index_select(self, dim: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` of the images (made first where missing), on this object's device."""
        if dim != 0:
            raise ValueError("LazyImages selects rows (dim 0) only")
        rows = rows.to("cpu", torch.long)
        self.ensure(rows)
        out = self.store.index_select(0, rows)
        return out if self.device.type == "cpu" else out.to(self.device)

    def __getitem__(self, index) -> torch.Tensor:
        rows = torch.arange(len(self))[index]
        return self.index_select(0, rows.reshape(-1)).reshape(*rows.shape, *self.shape[1:])

    def materialize(self) -> torch.Tensor:
        """Every image (all rows made), as a tensor on this object's device."""
        return self.index_select(0, torch.arange(len(self)))

    # -- making rows --------------------------------------------------------------------------
    def missing(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Sorted distinct rows (of ``rows``, default all) not made yet."""
        made = torch.from_numpy(np.asarray(self.made))
        if rows is None:
            return (made == 0).nonzero().flatten()
        rows = torch.unique(rows)
        return rows[made.index_select(0, rows) == 0]

    def ensure(self, rows: torch.Tensor | None = None, progress: Callable[[int], None] | None = None) -> int:
        """Make the rows (default all) not made yet, ``batch_size`` at a time; returns how many were made."""
        todo = self.missing(rows)
        for start in range(0, len(todo), self.batch_size):
            part = todo[start : start + self.batch_size]
            began = time.perf_counter()
            images = self.make(part)
            if images.dtype != torch.uint8 or tuple(images.shape) != (len(part), *self.shape[1:]):
                raise ValueError(f"make returned {images.dtype} {tuple(images.shape)} for {len(part)} rows "
                                 f"of {tuple(self.shape[1:])}")
            self.store[part] = images.to("cpu")
            self.made[part.numpy()] = 1  # after the pixels: a row marked made is complete
            self.count.seconds += time.perf_counter() - began
            self.count.images += len(part)
            if progress is not None:
                progress(len(part))
        return len(todo)



def read_images(images: torch.Tensor | LazyImages, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``images`` (or its rows ``rows``) as a tensor: a lazy store makes what it lacks."""
    if isinstance(images, LazyImages):
        return images.materialize() if rows is None else images.index_select(0, rows)
    return images if rows is None else images.index_select(0, rows)
