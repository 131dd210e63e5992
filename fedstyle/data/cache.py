"""Decode once, memory-map forever: the on-disk cache behind every dataset.

A dataset is described by a *recipe* (a JSON-serialisable dict with at least ``name`` and
``version``; it holds everything that changes the decoded pixels: seed, resolution, a fingerprint
of the source files ...). Its decoded arrays live in ``cache_dir()/<name>-<sha256(recipe)[:16]>/``
as one ``.npy`` file per domain and array plus a ``meta.json``. The directory is written under a
temporary name and renamed with :func:`os.replace`, so a crash never leaves a half-written cache,
and a cached dataset is opened with ``numpy.load(mmap_mode="c")``: nothing is decoded or copied,
and the copy-on-write mapping is writable, so ``torch.from_numpy`` takes it without warnings.

Memory does not grow with the dataset (issue 54). Builders write large image arrays through
:meth:`ArrayWriter.image_rows`, a :class:`ChunkedImages` that appends rows through a file
descriptor and, every :data:`FLUSH_BYTES`, makes them durable (``fdatasync``) and drops them
from the page cache (``posix_fadvise(DONTNEED)``): neither the process nor its container holds
dirty pages of the whole file, so a 10 GB cache is built in a few hundred MB. Cold decoding runs
in :func:`decode_workers` processes (:meth:`ChunkedImages.fill`; ``FEDSTYLE_DECODE_WORKERS`` or the
CPU count): each worker decodes a chunk on its own terms and writes its rows at their place in the
file itself, so no image crosses a pipe and the cache is bit-identical to a serial build.

A run builds only the images it uses: a loader given ``pick_per_class`` (the run's
``--per-class``) decodes the same seeded pick :meth:`DomainDataset.subset_per_class` makes, into
its own entry keyed by the pick (:func:`fedstyle.data.contract.pick_per_class`). We chose a
cache keyed by the subset over a sparse cache filled on demand: a per-class run reads all of its
subset (training rows, held-out domain) in its first round anyway, a keyed entry is an ordinary
dense file (no per-row marks or checksums to keep), and "uint8 decoded once and cached" stays true
per subset; the price is that two per-class sizes are two entries (small by construction).
Before writing, :func:`check_free_space` refuses, in one line, an entry that would not fit the
free disk.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import multiprocessing
import shutil
import warnings
import sys
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import platformdirs
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import ConfigError, DataError
from fedstyle.io import disk_full, free_text, human_bytes, make_staging_dir, remove_leftovers, reserve, temp_prefix

CACHE_ENV = "FEDSTYLE_CACHE"
#: number of decoding processes for a cold cache (default: the CPUs this process may use)
WORKERS_ENV = "FEDSTYLE_DECODE_WORKERS"
#: bytes written between two flushes of a :class:`ChunkedImages` (about 440 images at 224 px)
FLUSH_BYTES = 64 << 20
META_FILE = "meta.json"
# Bumped when the on-disk layout of a cache entry changes (independent of any recipe version).
LAYOUT_VERSION = 1
# Staging folders older than this were left by a killed build and are removed.
STALE_STAGING_SECONDS = 24 * 3600


def cache_dir() -> Path:
    """Root of the dataset cache: ``$FEDSTYLE_CACHE`` if set, else the user cache dir."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        path = Path(configured).expanduser()
        if path.exists() and not path.is_dir():
            raise ConfigError(f"${CACHE_ENV}={configured} is a file, not a folder; point it at a folder (it is made "
                              "if missing) or unset it for the user cache folder")
        return path
    return Path(platformdirs.user_cache_dir("fedstyle"))


def recipe_key(recipe: dict) -> str:
    """First 16 hex digits of the SHA-256 of the recipe's canonical JSON (sorted keys, no spaces)."""
    try:
        canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except TypeError as err:
        raise ConfigError(f"dataset recipe must be JSON-serialisable: {err}") from None
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]


def entry_dir(recipe: dict) -> Path:
    """Cache directory of the dataset that ``recipe`` describes."""
    return cache_dir() / f"{recipe['name']}-{recipe_key(recipe)}"


@dataclass
class DecodedArrays:
    """What a dataset builder returns: decoded numpy arrays, one entry per domain.

    ``images[d]`` is uint8 (N, 3, H, W); ``labels[d]`` is integer (N,). Builders with too much
    data for memory fill arrays from :meth:`ArrayWriter.empty_images` instead of numpy arrays.
    """

    domains: list[str]
    classes: list[str]
    images: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    augment: str = "crop"
    info: dict = field(default_factory=dict)


class ChunkedImages:
    """A uint8 ``.npy`` file of ``count`` rows (3, height, width), written a chunk of rows at a time.

    Rows go through ``os.pwrite``, never through a writable memory map (whose dirty pages would
    pile up until the whole file is in memory, and a full disk would be a SIGBUS). Every
    ``flush_every`` rows the written range is made durable (``fdatasync``) and dropped from the page
    cache (``posix_fadvise(DONTNEED)``), so memory stays bounded by one chunk whatever the count.
    The file's disk space is reserved up front: a full disk fails here, not half-way.
    """

    def __init__(self, path: Path, count: int, height: int, width: int, flush_every: int | None = None):
        self.path, self.shape = path, (int(count), 3, int(height), int(width))
        self.row_bytes = 3 * int(height) * int(width)
        self.flush_every = max(1, flush_every or FLUSH_BYTES // max(1, self.row_bytes))
        self.written = self.flushes = 0
        self._unflushed_from = 0
        header = {"descr": "|u1", "fortran_order": False, "shape": self.shape}
        with open(path, "wb") as handle:
            np.lib.format.write_array_header_1_0(handle, header)
            self.offset = handle.tell()
        self._fd = os.open(path, os.O_RDWR)
        try:
            reserve(self._fd, self.offset + count * self.row_bytes)
        except OSError as err:
            os.close(self._fd)
            err.needed = count * self.row_bytes  # for the message
            raise

    def append(self, rows: np.ndarray) -> None:
        """Write ``rows`` (n, 3, height, width) uint8 after the rows written so far."""
        rows = np.ascontiguousarray(rows, dtype=np.uint8)
        if rows.shape[1:] != self.shape[1:] or self.written + len(rows) > self.shape[0]:
            raise ValueError(f"rows {rows.shape} do not fit {self.shape} after {self.written} rows")
        view, at = memoryview(rows.reshape(-1)), self.offset + self.written * self.row_bytes
        while len(view):
            done = os.pwrite(self._fd, view, at)
            view, at = view[done:], at + done
        self.written += len(rows)
        if self.written - self._unflushed_from >= self.flush_every:
            self.flush()

    def fill(self, jobs: Iterable[tuple[Callable[[Any], tuple[np.ndarray, Any]], Any, int]], workers: int
             ) -> Iterator[Any]:
        """Append rows that ``workers`` processes compute and write themselves; yields each job's extra, in order.

        A job is ``(function, item, rows)``: ``function(item)`` returns ``(images, extra)`` with ``rows`` images.
        Each job's place in the file is known before it runs, so a worker ``pwrite``s its rows there and sends
        back only ``extra`` (no image crosses a pipe; the bytes do not depend on ``workers``). The flushes stay
        here: ``fdatasync`` and ``posix_fadvise`` act on the file, whichever process wrote its pages.
        """
        def placed():
            planned = self.written
            for function, item, rows in jobs:
                if planned + rows > self.shape[0]:
                    raise ValueError(f"{rows} more rows do not fit {self.shape} after {planned} rows")
                yield _WriteJob(function, item, str(self.path), self.offset + planned * self.row_bytes, rows,
                                self.shape[1:])
                planned += rows

        for rows, extra in ordered_map(_compute_and_write, placed(), workers):
            self.written += rows
            if self.written - self._unflushed_from >= self.flush_every:
                self.flush()
            yield extra

    def flush(self) -> None:
        """Make the rows written since the last flush durable and drop them from the page cache."""
        if self.written == self._unflushed_from:
            return
        start = self.offset + self._unflushed_from * self.row_bytes
        length = (self.written - self._unflushed_from) * self.row_bytes
        os.fdatasync(self._fd)
        if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the kernel writes back on its own
            os.posix_fadvise(self._fd, start, length, os.POSIX_FADV_DONTNEED)
        self._unflushed_from = self.written
        self.flushes += 1

    def discard(self) -> None:
        """Close the file without checks (after a failed build; the staging folder is removed anyway)."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def close(self) -> np.ndarray:
        """Flush, close and return the file as a read-only memory map (every row must be written)."""
        if self.written != self.shape[0]:
            self.discard()
            raise ValueError(f"{self.path.name}: {self.written} of {self.shape[0]} rows written")
        try:
            self.flush()
        finally:
            self.discard()
        return np.load(self.path, mmap_mode="r")


@dataclass(frozen=True)
class _WriteJob:
    """A chunk of rows a worker computes (``function(item)``) and writes at byte ``at`` of ``path``."""

    function: Callable[[Any], tuple[np.ndarray, Any]]
    item: Any
    path: str
    at: int
    rows: int
    row_shape: tuple[int, ...]


def _compute_and_write(job: _WriteJob) -> tuple[int, Any]:
    images, extra = job.function(job.item)
    images = np.ascontiguousarray(images, dtype=np.uint8)
    if images.shape != (job.rows, *job.row_shape):
        raise ValueError(f"a chunk of {job.rows} rows of {job.row_shape} came back as {images.shape}")
    fd = os.open(job.path, os.O_WRONLY)
    try:
        view, at = memoryview(images.reshape(-1)), job.at
        while len(view):
            done = os.pwrite(fd, view, at)
            view, at = view[done:], at + done
    finally:
        os.close(fd)
    return job.rows, extra


class ArrayWriter:
    """Hands builders files inside the (temporary) cache entry: :meth:`image_rows` (chunked writes,
    bounded memory) or :meth:`empty_images` (a memory map, for small arrays filled out of order)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._allocated: dict[int, np.ndarray] = {}

    def image_rows(self, domain_index: int, count: int, height: int, width: int,
                   flush_every: int | None = None) -> ChunkedImages:
        """A :class:`ChunkedImages` for domain ``domain_index``; hand :meth:`finish` its result."""
        return ChunkedImages(_image_path(self.directory, domain_index), count, height, width, flush_every)

    def finish(self, domain_index: int, rows: ChunkedImages) -> np.ndarray:
        """Close ``rows`` and return its memory map, which :func:`cached_dataset` then keeps as it is."""
        array = rows.close()
        self._allocated[domain_index] = array
        return array

    def empty_images(self, domain_index: int, count: int, height: int, width: int) -> np.ndarray:
        """A writable uint8 (count, 3, height, width) array backed by the cache file itself, its disk space
        reserved (a builder writing into a memory map on a full disk would die of SIGBUS)."""
        array = _reserved_memmap(_image_path(self.directory, domain_index), (count, 3, height, width))
        self._allocated[domain_index] = array
        return array

    def keep_images(self, domain_index: int, keep: np.ndarray) -> np.ndarray:
        """Shrink an array from :meth:`empty_images` or :meth:`finish` to the rows ``keep`` (e.g. skipping
        bad files).

        The rows are copied, a block at a time, into a new file that then replaces the old one
        (POSIX keeps the old mapping valid until it is dropped).
        """
        full = self._allocated.pop(domain_index)
        if isinstance(full, np.memmap) and full.mode != "r":
            full.flush()
        path = _image_path(self.directory, domain_index)
        partial = path.with_name(f"{path.stem}.partial.npy")
        kept = ChunkedImages(partial, len(keep), *full.shape[2:])
        block = 256
        for start in range(0, len(keep), block):
            kept.append(full[keep[start : start + block]])
        array = kept.close()
        os.replace(partial, path)
        self._allocated[domain_index] = array
        return array

    def owns(self, domain_index: int, array: np.ndarray) -> bool:
        return self._allocated.get(domain_index) is array


# -- decoding in worker processes ---------------------------------------------------------------
def decode_workers(workers: int | None = None) -> int:
    """How many processes decode a cold cache: ``workers``, else ``$FEDSTYLE_DECODE_WORKERS``, else the CPUs
    this process may run on."""
    if workers is None:
        configured = os.environ.get(WORKERS_ENV)
        if configured:
            try:
                workers = int(configured)
            except ValueError:
                raise ConfigError(f"${WORKERS_ENV}={configured!r} is not a whole number of processes; "
                                  "set it to 1 or more, or unset it for the CPU count") from None
        else:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers < 1:
        raise ConfigError(f"decode workers must be at least 1, got {workers}")
    return int(workers)


def _one_thread() -> None:
    # Each worker is one decoder: torch's own thread pool in every worker would oversubscribe the CPUs.
    torch.set_num_threads(1)


def ordered_map(function: Callable[[Any], Any], items: Iterable[Any], workers: int) -> Iterator[Any]:
    """``map(function, items)`` in ``workers`` processes, results in order, at most ``2 * workers`` in flight
    (so memory holds a few chunks, not the dataset). ``workers == 1`` runs in this process.

    ``function`` must be picklable (a module-level function or a ``functools.partial`` of one) and must
    compute each item on its own terms: then the results do not depend on ``workers``. A single item is
    computed in this process too (a pool would cost more than it saves).
    """
    items = iter(items)
    first = list(itertools.islice(items, 2))
    if workers <= 1 or len(first) < 2:
        yield from map(function, itertools.chain(first, items))
        return
    items = itertools.chain(first, items)
    # fork, as torch's DataLoader does on Linux (no re-import, works from `python -`); the initializer
    # gives each child one torch thread. spawn where fork does not exist.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_one_thread) as pool:
        pending: deque = deque()
        try:
            for item in items:
                pending.append(pool.submit(function, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


# -- refusing a cache that cannot fit --------------------------------------------------------------
def check_free_space(folder: Path, needed: int, what: str, fix: str) -> None:
    """Refuse in one line, before writing anything, an entry of ``needed`` bytes that the free disk under
    ``folder`` (or its nearest existing parent) cannot hold."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise DataError(f"{what} needs {human_bytes(needed)} in {folder} but only {human_bytes(free)} is free "
                        f"there; {fix}")


def _reserved_memmap(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 ``.npy`` memory map of zeros ``shape`` whose every byte has its disk space already."""
    try:
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=shape)
        fd = os.open(path, os.O_RDWR)
        try:
            reserve(fd, array.offset + array.nbytes)
        finally:
            os.close(fd)
    except OSError as err:
        err.needed = int(np.prod(shape, dtype=np.int64))  # for the message
        raise
    return array


def _image_path(directory: Path, index: int) -> Path:
    # Files are numbered, not named after domains: domain names may hold spaces or slashes.
    return directory / f"images_{index}.npy"


def _label_path(directory: Path, index: int) -> Path:
    return directory / f"labels_{index}.npy"


def cached_dataset(
    recipe: dict,
    build: Callable[[ArrayWriter], DecodedArrays],
    progress: bool = True,
    expected_bytes: int | None = None,
    too_big_fix: str = "",
) -> DomainDataset:
    """Return the dataset ``recipe`` describes, calling ``build`` only if it is not cached yet.

    Args:
        recipe: JSON-serialisable description with ``name`` and ``version`` keys; any change to
            it (bump ``version`` when the building code changes) selects a new cache entry.
        build: decodes the dataset; it receives an :class:`ArrayWriter` for arrays too large for
            memory and may ignore it.
        progress: print a one-line note to stderr when building.
        expected_bytes: the entry's size, when the loader knows it before decoding: a build that would
            not fit the free disk is refused before anything is written (:func:`check_free_space`).
        too_big_fix: what the user can change, for that refusal (e.g. "pass a smaller --resolution").
    """
    for key in ("name", "version"):
        if key not in recipe:
            raise ConfigError(f"dataset recipe needs a {key!r} entry, got keys {sorted(recipe)}")
    target = entry_dir(recipe)
    if not _is_complete(target):
        if target.exists():  # left behind by an older layout or edited by hand
            shutil.rmtree(target, ignore_errors=True)
        if expected_bytes is not None:
            fix = f"{too_big_fix + ', or ' if too_big_fix else ''}set {CACHE_ENV} to a folder with room"
            check_free_space(target.parent, expected_bytes, f"the {recipe['name']} cache", fix)
        if progress:
            print(f"fedstyle: building {recipe['name']} once, cached in {target}", file=sys.stderr)
        _build_entry(recipe, build, target)
    try:
        return load_entry(target)
    except DamagedEntryError as err:  # damaged since it was written (edited, cut short): decoded again, once
        warnings.warn(f"{err}; decoding it again", stacklevel=2)
        _set_aside(target)
        if not _is_complete(target):  # another process may have rebuilt it meanwhile
            _build_entry(recipe, build, target)
        return load_entry(target)


def _set_aside(target: Path) -> None:
    """Move a damaged entry out of the way under a name of this process, then delete it. Processes that found
    the damage together rename it at most once between them (rmtree in place could delete the fresh entry
    another one has just built); one whose rename finds nothing goes on to build or read theirs."""
    aside = target.parent / f"{temp_prefix(target.name)}damaged.tmp"
    try:
        load_entry(target)  # mended by another process since we looked: keep it
        return
    except DamagedEntryError:
        pass
    try:
        os.replace(target, aside)
    except OSError:  # gone already (set aside by another process), or a fresh one in its place
        return
    shutil.rmtree(aside, ignore_errors=True)


def _is_complete(directory: Path) -> bool:
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("layout") == LAYOUT_VERSION


def _remove_stale_staging(target: Path) -> None:
    """Remove staging folders of ``target`` left by dead processes (never a live builder's)."""
    remove_leftovers(target.parent, f".{target.name}.*.tmp", STALE_STAGING_SECONDS)


def _build_entry(recipe: dict, build: Callable[[ArrayWriter], DecodedArrays], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(target)
    staging = make_staging_dir(target)
    try:
        writer = ArrayWriter(staging)
        try:
            arrays = build(writer)
            _write_arrays(arrays, writer, staging, recipe)
        except OSError as err:
            if not disk_full(err):
                raise
            needed = getattr(err, "needed", None)
            what = (f"{human_bytes(needed)} more needed" if needed is not None else
                    f"{human_bytes(sum(f.stat().st_blocks * 512 for f in staging.iterdir()))} written when it filled")
            raise DataError(f"no space left on device in the dataset cache {target.parent} while building "
                            f"{recipe['name']} ({what}, {free_text(target.parent)}); free space or set "
                            "FEDSTYLE_CACHE to a folder with room") from None
        try:
            os.replace(staging, target)
        except OSError:
            # Another process finished the same entry first; its copy is identical.
            if not _is_complete(target):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _write_arrays(arrays: DecodedArrays, writer: ArrayWriter, directory: Path, recipe: dict) -> None:
    for index, domain in enumerate(arrays.domains):
        images = arrays.images[domain]
        if writer.owns(index, images):
            if isinstance(images, np.memmap) and images.mode != "r":
                images.flush()
        else:
            np.save(_image_path(directory, index), np.ascontiguousarray(images, dtype=np.uint8))
        np.save(_label_path(directory, index), np.asarray(arrays.labels[domain], dtype=np.int64))
    meta = {
        "layout": LAYOUT_VERSION,
        "name": recipe["name"],
        "recipe": recipe,
        "domains": list(arrays.domains),
        "classes": list(arrays.classes),
        "mean": [float(v) for v in arrays.mean],
        "std": [float(v) for v in arrays.std],
        "augment": arrays.augment,
        "info": arrays.info,
    }
    # meta.json is written last: its presence marks a complete entry.
    (directory / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))


class DamagedEntryError(DataError):
    """A complete cache entry whose files can no longer be read."""


def load_entry(directory: Path) -> DomainDataset:
    """Open a complete cache entry as a :class:`DomainDataset` of memory-mapped tensors. A damaged entry (a file
    cut short, deleted or edited) is a :class:`DamagedEntryError` naming the file."""
    def damaged(path: Path, err: Exception) -> DataError:
        return DamagedEntryError(f"the dataset cache entry {directory} is damaged ({path.name}: {err}); `fedstyle "
                                 "cache clear datasets` (or deleting that folder) removes it")

    try:
        meta = json.loads((directory / META_FILE).read_text())
        domains = list(meta["domains"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise damaged(directory / META_FILE, err) from None
    images, labels = {}, {}
    for index, domain in enumerate(domains):
        for path, into in ((_image_path(directory, index), images), (_label_path(directory, index), labels)):
            try:
                into[domain] = torch.from_numpy(np.load(path, mmap_mode="c"))
            except (OSError, ValueError, EOFError) as err:
                raise damaged(path, err) from None
    info = dict(meta["info"])
    info.setdefault("recipe", meta["recipe"])
    info["cache_dir"] = str(directory)
    return DomainDataset(
        name=meta["name"],
        domains=list(meta["domains"]),
        classes=list(meta["classes"]),
        images=images,
        labels=labels,
        mean=tuple(meta["mean"]),
        std=tuple(meta["std"]),
        augment=meta["augment"],
        info=info,
    )


# -- inspecting and clearing the cache ---------------------------------------------------------
#: top-level folders of the cache that hold derived data, by kind (everything else is a decoded dataset)
DERIVED_KINDS = {
    "ccst": "CCST's stylized copies (per client, bank, K, seed)",
    "pardon": "PARDON's transfers to its interpolation style S_g",
    "client_styles": "CCST's and PARDON's client styles (the setup's style computation)",
    "feddg_fft": "FedDG-FFT's amplitude-exchanged copies",
    "style": "lite decoders written by `fedstyle style train-decoder`",
    "adain": "AdaIN weights copied into the cache",
}


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cache_usage() -> dict[str, tuple[int, int]]:
    """``{kind: (entries, bytes)}`` of the cache: ``datasets`` and the kinds of :data:`DERIVED_KINDS`."""
    root = cache_dir()
    usage: dict[str, tuple[int, int]] = {}
    if not root.is_dir():
        return usage
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.name in DERIVED_KINDS and entry.is_dir():
            kind, count = entry.name, sum(1 for e in entry.iterdir() if not e.name.startswith("."))
        else:
            kind, count = "datasets", 1
        size = _folder_bytes(entry) if entry.is_dir() else entry.stat().st_size
        entries, total = usage.get(kind, (0, 0))
        usage[kind] = (entries + count, total + size)
    return usage


def clear_cache(kinds: list[str]) -> int:
    """Delete the cache folders of ``kinds`` (``datasets`` or names of :data:`DERIVED_KINDS`); returns bytes freed.

    Everything deleted is rebuilt on demand (datasets decoded again, images stylized again).
    """
    unknown = sorted(set(kinds) - set(DERIVED_KINDS) - {"datasets"})
    if unknown:
        raise ConfigError(f"unknown cache kind(s) {', '.join(unknown)}; choose from datasets, {', '.join(DERIVED_KINDS)}")
    root = cache_dir()
    freed = 0
    if not root.is_dir():
        return freed
    for entry in root.iterdir():
        kind = entry.name if entry.name in DERIVED_KINDS else "datasets"
        if kind in kinds and not entry.name.startswith("."):
            freed += _folder_bytes(entry) if entry.is_dir() else entry.stat().st_size
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    return freed
