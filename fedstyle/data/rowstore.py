"""Where the rows of a :class:`fedstyle.data.lazy.LazyImages` are kept, each with a checksum.

A store is never trusted blindly (issue 39). Beside each row it keeps a mark: 0 while the row is
not made, else ``2**32 + CRC-32`` of the row's bytes (:func:`row_sums`). A reader checks every row
it reads against its mark, so a row whose bytes do not match — flipped on disk, marked made but
never written (a power loss that kept the mark and lost the pixels), its mark damaged — is found
and made again, never used.

* :class:`FileRows`: a cache entry's ``images.npy`` (N, C, H, W) uint8 and ``made.npy`` (N,) uint64,
  so a later run finds the rows. Rows are written with ``pwrite``, never through a shared memory
  map: on a full disk a write through a map into a sparse file is a SIGBUS that kills the process,
  ``pwrite`` raises ENOSPC, which becomes :class:`CacheFullError` (one line naming the cache folder
  and the room needed). A mark is written only after its pixels are durable (``fdatasync``).
* :class:`MemoryRows`: rows in memory (a tensor, or a copy-on-write map of an entry that cannot be
  written: a read-only cache is read, and what it lacks is made for this run only).
"""

from __future__ import annotations

import os
import time
import weakref
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from fedstyle.errors import FedstyleError
from fedstyle.io import disk_full, free_text, human_bytes

#: set in every mark of a made row, so that a mark is never 0 (the mark of a row not made)
MADE_BIT = np.uint64(1 << 32)


def row_sums(images: np.ndarray | torch.Tensor) -> np.ndarray:
    """The marks of made rows ``images`` (n, ...) uint8: ``2**32 + CRC-32`` of each row's bytes, (n,) uint64."""
    if isinstance(images, torch.Tensor):
        images = images.numpy()
    flat = np.ascontiguousarray(images).reshape(len(images), int(np.prod(images.shape[1:], dtype=np.int64)))
    return np.array([zlib.crc32(row) for row in flat], dtype=np.uint64) | MADE_BIT


class CacheFullError(FedstyleError):
    """No room left in a cache folder for the rows being made."""


def cache_full_message(folder: Path, needed: int, what: str = "this setting's images need up to") -> str:
    """One line for a full disk under the cache folder ``folder`` (e.g. ``<cache>/ccst``) short of ``needed`` bytes."""
    return (f"no space left on device in the style cache {folder}: {what} "
            f"{human_bytes(needed)} more there ({free_text(folder)}); free space "
            f"(`fedstyle cache clear {folder.name}`) or set FEDSTYLE_CACHE to a folder with room")


class RowStore(Protocol):
    """Where a :class:`~fedstyle.data.lazy.LazyImages` keeps its rows and their marks."""

    shape: tuple[int, ...]
    #: where the rows are kept, for messages (None: in memory)
    location: Path | None

    def made(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The (N,) uint64 marks (of rows ``rows``): 0 for a row not made, else :func:`row_sums` of its pixels."""

    def read(self, rows: np.ndarray) -> np.ndarray:
        """A copy of rows ``rows``."""

    def write(self, rows: np.ndarray, images: np.ndarray, sums: np.ndarray) -> None:
        """Keep ``images`` as rows ``rows`` (sorted, distinct), marked ``sums`` once they are in place."""

    def flush(self) -> None:
        """Make the rows written so far durable with their marks (a no-op in memory)."""


class MemoryRows:
    """Rows in memory: an array (or a copy-on-write map of a cache entry that cannot be written) and marks."""

    location = None

    def __init__(self, images: np.ndarray | torch.Tensor, made: np.ndarray | None = None):
        self.images = images.numpy() if isinstance(images, torch.Tensor) else images
        self.shape = tuple(self.images.shape)
        self._made = np.zeros(self.shape[0], dtype=np.uint64) if made is None else made

    def made(self, rows: np.ndarray | None = None) -> np.ndarray:
        return self._made if rows is None else self._made[rows]

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self.images[rows]

    def write(self, rows: np.ndarray, images: np.ndarray, sums: np.ndarray) -> None:
        self.images[rows] = images
        self._made[rows] = sums

    def flush(self) -> None:
        pass


#: marks of rows written are made durable at most this long after their pixels (a run killed meanwhile
#: makes those rows again); each flush is one ``fdatasync``, milliseconds on a disk, so not one per batch
FLUSH_SECONDS = 10.0
_OPEN: "weakref.WeakValueDictionary[tuple[str, int, int], FileRows]" = weakref.WeakValueDictionary()


class _Files:
    """A :class:`FileRows`' descriptors and the marks it has not written yet (what its finalizer flushes)."""

    def __init__(self, images: Path, made: Path, made_offset: int, count: int):
        self.images_fd = os.open(images, os.O_RDWR)
        try:
            self.made_fd = os.open(made, os.O_RDWR)
        except OSError:
            os.close(self.images_fd)
            raise
        self.made_offset = made_offset
        self.new = np.zeros(count, dtype=np.uint64)  # marks of the rows this process wrote
        self.pending: list[np.ndarray] = []  # rows among them whose marks are not on disk yet
        self.flushed = time.monotonic()

    def flush(self) -> None:
        """The pending marks, after the pixels they vouch for are durable: fdatasync, then pwrite."""
        if not self.pending:
            return
        rows = np.unique(np.concatenate(self.pending))
        os.fdatasync(self.images_fd)
        _write_rows(self.made_fd, self.made_offset, 8, rows, self.new[rows])
        self.pending, self.flushed = [], time.monotonic()

    def close(self) -> None:
        try:
            self.flush()
        except OSError:  # at exit or collection: rows whose marks are lost are made again by the next run
            pass
        for fd in (self.images_fd, self.made_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class FileRows:
    """Rows in the ``.npy`` files ``images`` (N, C, H, W) uint8 and ``made`` (N,) uint64 of a cache entry.

    Read through read-only shared memory maps (a row another process writes is seen once its mark
    is); written with ``pwrite``. Marks wait in memory (where every store of this process over the
    entry sees them: :meth:`open` shares one object per file) and are flushed — ``fdatasync`` of the
    pixels, then ``pwrite`` of the marks — every :data:`FLUSH_SECONDS`, on :meth:`flush`, and when
    the object is collected or the interpreter exits. Opening raises OSError (EROFS, EACCES) when the
    files cannot be written: the caller keeps the rows in memory.
    """

    def __init__(self, images: Path, made: Path):
        self.location, self._paths = images.parent, (images, made)
        images_map, made_map = np.load(images, mmap_mode="r"), np.load(made, mmap_mode="r")
        self._images_offset, made_offset = images_map.offset, made_map.offset
        self._images, self._made = images_map.view(np.ndarray), made_map.view(np.ndarray)  # plain arrays: faster rows
        self.shape = tuple(self._images.shape)
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64))
        self._files = _Files(images, made, made_offset, self.shape[0])
        weakref.finalize(self, self._files.close)

    @classmethod
    def open(cls, images: Path, made: Path) -> "FileRows":
        """The one object of this process over these files (its unflushed marks seen by every user)."""
        stat = os.stat(images)  # an inode held open by a live object is not reused: the key is safe
        key = (str(images), stat.st_dev, stat.st_ino)  # the path too: a read-only mount of the file is not written
        rows = _OPEN.get(key)
        if rows is None:
            rows = _OPEN[key] = cls(images, made)
        return rows

    def __reduce__(self):  # another process opens the files anew (descriptors do not travel)
        return FileRows.open, self._paths

    def made(self, rows: np.ndarray | None = None) -> np.ndarray:
        new, disk = (self._files.new, self._made) if rows is None else (self._files.new[rows], self._made[rows])
        return np.where(new != 0, new, disk)

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self._images[rows]

    def write(self, rows: np.ndarray, images: np.ndarray, sums: np.ndarray) -> None:
        files = self._files
        try:
            _write_rows(files.images_fd, self._images_offset, self._row_bytes, rows, np.ascontiguousarray(images))
            files.new[rows] = sums
            files.pending.append(rows.copy())
            if time.monotonic() - files.flushed >= FLUSH_SECONDS:
                files.flush()
        except OSError as err:
            self._failed(err)

    def flush(self) -> None:
        try:
            self._files.flush()
        except OSError as err:
            self._failed(err)

    def _failed(self, err: OSError):
        if disk_full(err):
            left = int((self.made() == 0).sum()) * self._row_bytes
            raise CacheFullError(cache_full_message(self.location.parent, left)) from None
        raise FedstyleError(f"cannot write the style cache {self.location}: {err.strerror or err}") from None


def flush_all() -> None:
    """Write the pending marks of every cache entry this process has open (see :class:`FileRows`)."""
    for rows in list(_OPEN.values()):
        rows.flush()


def _write_rows(fd: int, offset: int, row_bytes: int, rows: np.ndarray, data: np.ndarray) -> None:
    """``pwrite`` rows ``rows`` (sorted, distinct) of ``data`` at ``offset``, a run of consecutive rows at a time."""
    buffer = memoryview(data.reshape(len(rows), -1).view(np.uint8).reshape(-1))
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    for start, stop in zip(np.r_[0, breaks], np.r_[breaks, len(rows)]):
        chunk, at = buffer[start * row_bytes : stop * row_bytes], offset + int(rows[start]) * row_bytes
        while len(chunk):
            written = os.pwrite(fd, chunk, at)
            chunk, at = chunk[written:], at + written
