"""Images made on first read: rows of a generated dataset (CCST's restyled copies, PARDON's
transfers to S_g) computed when a batch first needs them, kept in a file for the next run.

A run of a few hundred local steps reads a small fraction of a client's d x K augmented images;
generating all of them up front cost CCST 13 minutes on 2 CPU cores for a run whose training took
one (issue 27). :class:`LazyImages` stands where a client's uint8 image tensor stands
(:class:`fedstyle.data.client.SamplePool`, an aligned view) and answers the reads a client makes —
``index_select`` of a batch's rows, ``len``, ``shape`` — by calling ``make`` on the rows not made
yet and keeping them in its :class:`~fedstyle.data.rowstore.RowStore` (a cache entry's files, so a
later run finds them, or memory). Reading the whole tensor (``materialize``) makes every row.

Every row read is checked against the checksum its store keeps (issue 39): a row that does not
match is made again and rewritten, never used, and a line says so. The check is one CRC-32 per row
read (a few microseconds for a 32 x 32 image).

The pixels do not depend on when a row is made or with which others: ``make`` must compute each
row on its own terms (a style transfer is per image; checked bit for bit on CPU by the tests).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from fedstyle.data.rowstore import MemoryRows, RowStore, row_sums


@dataclass
class MakeCount:
    """Rows made and seconds spent making them, shared by a :class:`LazyImages` and its device copies.

    ``transferred``: the rows among them that needed the style backend, counted by the ``make``
    function (the others were copies, e.g. CCST's kept originals), so a rate is the backend's.
    ``repaired``: rows found damaged on read and made again (counted in ``images`` too).
    """

    images: int = 0
    seconds: float = 0.0
    transferred: int = 0
    repaired: int = 0


class LazyImages:
    """uint8 images (N, C, H, W) whose rows are made by ``make(rows)`` on first read and checked on every read.

    ``rows``: the :class:`~fedstyle.data.rowstore.RowStore` that keeps them (a tensor: rows in memory).
    ``make`` receives sorted distinct row indices (int64, CPU) and returns their images (uint8, CPU).
    ``count`` holds the work this object and its device copies did (not what an earlier run left).
    """

    dtype = torch.uint8

    def __init__(self, rows: RowStore | torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor],
                 device: torch.device | str = "cpu", batch_size: int = 256, count: MakeCount | None = None):
        if isinstance(rows, torch.Tensor):
            rows = MemoryRows(rows)
        if len(rows.shape) != 4 or tuple(rows.made().shape) != rows.shape[:1]:
            raise ValueError("LazyImages needs an (N, C, H, W) row store with an (N,) made map")
        self.rows, self.make = rows, make
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.count = count if count is not None else MakeCount()

    # -- what a tensor of images answers ----------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.rows.shape)

    @property
    def made(self) -> np.ndarray:
        """The rows' marks: 0 where not made, else a checksum (:func:`~fedstyle.data.rowstore.row_sums`)."""
        return self.rows.made()

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def dim(self) -> int:
        return 4

    def numel(self) -> int:
        return int(np.prod(self.rows.shape))

    def element_size(self) -> int:
        return 1

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "LazyImages":
        """The same images, read onto ``device`` (the store stays where it is)."""
        device = torch.device(device)
        if device == self.device:
            return self
        return LazyImages(self.rows, self.make, device, self.batch_size, self.count)

    def index_select(self, dim: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` of the images (made first where missing, made again where damaged), on this object's device."""
        if dim != 0:
            raise ValueError("LazyImages selects rows (dim 0) only")
        wanted = rows.to("cpu", torch.long).reshape(-1).numpy()
        marks = self.rows.made(wanted)
        images = self.rows.read(wanted) if marks.all() else None  # a warm read: one read, one check
        if images is None or not np.array_equal(row_sums(images), marks):
            images = self._made_and_checked(wanted)
        out = torch.from_numpy(images)
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
        if rows is None:
            return torch.from_numpy(np.flatnonzero(self.rows.made() == 0))
        rows = torch.unique(rows)
        return rows[torch.from_numpy(self.rows.made(rows.numpy()) == 0)]

    def ensure(self, rows: torch.Tensor | None = None, progress: Callable[[int], None] | None = None) -> int:
        """Make the rows (default all) not made yet, ``batch_size`` at a time; returns how many were made."""
        todo = self.missing(rows)
        self._make_rows(todo, progress)
        return len(todo)

    def _make_rows(self, todo: torch.Tensor, progress: Callable[[int], None] | None = None,
                   keep: bool = False) -> np.ndarray | None:
        """Make rows ``todo`` (sorted, distinct), ``batch_size`` at a time; their images when ``keep``."""
        kept = []
        try:
            for start in range(0, len(todo), self.batch_size):
                part = todo[start : start + self.batch_size]
                began = time.perf_counter()
                images = self._make(part)
                kept += [images] if keep else []
                self.count.seconds += time.perf_counter() - began
                self.count.images += len(part)
                if progress is not None:
                    progress(len(part))
        except BaseException:  # a failed batch (out of memory, Ctrl-C): the rows made before it are kept
            try:
                self.rows.flush()
            except Exception:
                pass
            raise
        return np.concatenate(kept) if keep else None

    def flush(self) -> None:
        """Make the rows made so far durable with their marks (else within
        :data:`~fedstyle.data.rowstore.FLUSH_SECONDS`, or at exit)."""
        self.rows.flush()

    def verify(self, block: int = 4096) -> int:
        """Check every made row against its mark, ``block`` rows at a time, making the damaged ones again;
        returns how many were."""
        before = self.count.repaired
        made = np.flatnonzero(self.rows.made() != 0)
        for start in range(0, len(made), block):
            self._checked(made[start : start + block])
        return self.count.repaired - before

    def _make(self, rows: torch.Tensor) -> np.ndarray:
        images = self.make(rows)
        if images.dtype != torch.uint8 or tuple(images.shape) != (len(rows), *self.shape[1:]):
            raise ValueError(f"make returned {images.dtype} {tuple(images.shape)} for {len(rows)} rows "
                             f"of {tuple(self.shape[1:])}")
        images = images.to("cpu").contiguous().numpy()
        self.rows.write(rows.numpy(), images, row_sums(images))
        return images

    def _made_and_checked(self, wanted: np.ndarray) -> np.ndarray:
        """Rows ``wanted`` (any order, repeats allowed): the missing made, the others read and checked."""
        distinct, inverse = np.unique(wanted, return_inverse=True)
        new = self.rows.made(distinct) == 0
        images = np.empty((len(distinct), *self.shape[1:]), dtype=np.uint8)
        if new.any():
            images[new] = self._make_rows(torch.from_numpy(distinct[new]), keep=True)
        if not new.all():
            images[~new] = self._checked(distinct[~new])
        return images[inverse.reshape(-1)]

    def _checked(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct, all marked made) read from the store, each matching its mark;
        those that do not are made again and rewritten, and a line says so (once per store)."""
        images = self.rows.read(rows)
        bad = np.flatnonzero(row_sums(images) != self.rows.made(rows))
        if len(bad):
            if not self.count.repaired:
                where = self.rows.location or "memory"
                print(f"fedstyle: {len(bad)} damaged image(s) in the style cache {where} do not match their "
                      f"checksums; made again", file=sys.stderr)
            images[bad] = self._make_rows(torch.from_numpy(rows[bad]), keep=True)
            self.count.repaired += len(bad)
        return images


def read_images(images: torch.Tensor | LazyImages, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``images`` (or its rows ``rows``) as a tensor: a lazy store makes what it lacks."""
    if isinstance(images, LazyImages):
        return images.materialize() if rows is None else images.index_select(0, rows)
    return images if rows is None else images.index_select(0, rows)
