"""Making the style-transferred images of a setup exchange, and caching the clients' styles.

* :func:`stylize_to_style` — every image restyled to one style, through the same cache;
* :func:`stylize_cached` — the output images, in a uint8 cache entry
  ``cache_dir()/<namespace>/<key>/images.npy`` keyed by everything that changes the pixels (the
  content images' bytes, the plan — hence bank, K, seed —, backend, encoder, options, alpha, and
  the method's recipe, e.g. CCST's style type and ``keep_original``), beside ``made.npy``, one
  checksum per output set once its pixels are written and durable (:mod:`fedstyle.data.rowstore`: a row
  that does not match its checksum is made again, never used). By default (``stylize=lazy``) an
  output is made when a training batch first reads it: a run of a few hundred steps pays for the
  images it trains on, not for all d x K (CCST on fashion4 with 3 clients: 94,500 images, 15 minutes
  on 2 CPU cores with the lite backend). ``eager`` makes them all at setup (checking the free space
  first). A rerun or a resumed run reuses what is made; the entry is created under a temporary name
  and renamed, and a killed run leaves rows unmarked, never marked and half-written. Rows are
  written with ``pwrite``, never through a shared memory map, so a full disk is one line naming the
  cache folder and the space needed, not a SIGBUS. A cache that cannot be written (a read-only
  filesystem, EROFS; no permission) is read, and what it lacks is made in memory for this run. The
  key leaves out the device: a GPU's FFT or convolutions may round one pixel in 10^5 differently
  (measured: at most one grey level with ``fft``), and whichever row was made first is reused. On
  CPU a row's pixels do not depend on the other rows it is made with (tested bit for bit), so lazy
  and eager give the same images.
* :func:`cached_style` — a client's computed style (CCST's overall style, PARDON's clustered one),
  one file per recipe and images in ``cache_dir()/client_styles``, so a rerun's setup loads it; the
  file carries a SHA-256 of its tensors, and one that does not match is computed anew.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from fedstyle.data.lazy import LazyImages, MakeCount
from fedstyle.data.rowstore import CacheFullError, FileRows, MemoryRows, cache_full_message
from fedstyle.errors import ConfigError
from fedstyle.io import disk_full, free_bytes, make_staging_dir, read_only, tensors_digest
from fedstyle.style.transfer.augment import AugmentPlan, StyleBank, tensor_digest, weights_fingerprint
from fedstyle.style.transfer.base import Style, StyleTransfer

#: bump when the cache entry layout or the generation procedure changes (2: rows made on demand, made.npy;
#: 3: made.npy holds each row's checksum, client styles their SHA-256)
CACHE_VERSION = 3
_IMAGES, _MADE, _RECIPE = "images.npy", "made.npy", "recipe.json"


#: cache kind of the clients' computed styles (a file per client and recipe)
STYLE_CACHE = "client_styles"


def cached_style(recipe: Mapping[str, Any], images: torch.Tensor, backend: StyleTransfer,
                 compute: Callable[[], tuple[Style, dict[str, float]]]) -> tuple[Style, dict[str, float], bool]:
    """A client's style, computed once per recipe, images and backend (weights included).

    ``compute()`` returns the style and numbers to keep beside it (images used, clusters). A later
    call with the same ``recipe`` (the method and every option that changes the style), the same
    ``images`` (bytes) and the same backend loads both from
    ``cache_dir()/client_styles/<key>.safetensors`` instead: a rerun's setup does not encode its
    images again. Returns (style, numbers, whether it came from the cache). The file carries a SHA-256
    of its tensors and numbers: an unreadable file, or one that does not match it (a flipped bit that
    still parses), is computed and written anew (atomically). A cache that cannot be written keeps
    nothing (one line says so); a full disk is one line naming the folder. As for the images, the key
    leaves out the device.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from fedstyle.data.cache import cache_dir, recipe_key
    from fedstyle.io import atomic_write

    key = dict(recipe, version=CACHE_VERSION, backend=backend.name, encoder=backend.encoder_id,
               weights=weights_fingerprint(backend), images=tensor_digest(images))
    path = cache_dir() / STYLE_CACHE / f"{recipe_key(key)}.safetensors"
    kept = _load_style(path)
    if kept is not None:
        return *kept, True
    style, numbers = compute()
    meta_json = json.dumps({"backend": style.backend, "encoder": style.encoder, "numbers": numbers, "key": key},
                           sort_keys=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in style.tensors.items()}
    metadata = {"fedstyle": meta_json, "sha256": tensors_digest(meta_json, tensors)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    except (OSError, SafetensorError) as err:  # the style is used, only not kept for the next run
        if read_only(err):
            _note_read_only(path.parent.parent, err)
        elif disk_full(err):
            needed = sum(t.numel() * t.element_size() for t in tensors.values()) + len(meta_json) + 1024
            raise CacheFullError(cache_full_message(path.parent, needed, "a client style needs")) from None
        else:
            raise
    return style, numbers, False


def _load_style(path: Path) -> tuple[Style, dict[str, float]] | None:
    """The style and numbers kept in ``path``; None when it is absent, unreadable or does not match its SHA-256."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = json.loads(metadata["fedstyle"])
        if metadata["sha256"] == tensors_digest(metadata["fedstyle"], tensors):
            return Style(meta["backend"], meta["encoder"], tensors), meta["numbers"]
    except (OSError, KeyError, ValueError, RuntimeError, TypeError, SafetensorError):
        return None
    _note(f"fedstyle: {path} does not match its checksum; the client style is computed anew")
    return None


_NOTED: set[str] = set()


def _note(line: str) -> None:
    """Print ``line`` to stderr, once per process."""
    if line not in _NOTED:
        _NOTED.add(line)
        print(line, file=sys.stderr)


def _note_read_only(root: Path, err: BaseException) -> None:
    reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
    _note(f"fedstyle: the style cache {root} cannot be written ({reason}): what it lacks is made in memory for "
          "this run and not kept (set FEDSTYLE_CACHE to a writable folder to keep it)")


# -- generation into the cache --------------------------------------------------------------------
#: when the plan's images are made: ``lazy`` as training batches first read them, ``eager`` all at setup
STYLIZE_MODES = ("lazy", "eager")


def _open_entry(target: Path, key: Mapping[str, Any], shape: tuple[int, ...]) -> FileRows | MemoryRows:
    """The rows of cache entry ``target`` (N, 3, H, W) and their checksums, created empty when absent.

    A writable entry is a :class:`~fedstyle.data.rowstore.FileRows` (a row made by one run is there for
    the next). An entry that cannot be written or created (a read-only filesystem, EROFS; no
    permission) is read through a copy-on-write map, or is empty, and what it lacks is made in memory.
    An entry is created in a staging folder and renamed into place, so it is never seen half-written.
    """
    if not _entry_ok(target, shape):
        try:
            _create_entry(target, key, shape)
        except OSError as err:
            if disk_full(err):
                raise CacheFullError(cache_full_message(target.parent, int(np.prod(shape)) + 8 * shape[0])) from None
            if not read_only(err):
                raise
            _note_read_only(target.parent.parent, err)
            return MemoryRows(np.zeros(shape, dtype=np.uint8))  # untouched pages take no memory
    try:
        return FileRows.open(target / _IMAGES, target / _MADE)
    except OSError as err:
        if not read_only(err):
            raise
        _note_read_only(target.parent.parent, err)
        return MemoryRows(np.load(target / _IMAGES, mmap_mode="c"), np.array(np.load(target / _MADE)))


def _create_entry(target: Path, key: Mapping[str, Any], shape: tuple[int, ...]) -> None:
    """An empty entry (no row made) at ``target``: staged, then renamed into place."""
    from fedstyle.data.cache import _remove_stale_staging  # the dataset cache's rule for killed builds

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = make_staging_dir(target)  # first: on a read-only cache nothing below is tried
    try:
        _remove_stale_staging(target)
        if target.exists():  # damaged or an older layout: made anew
            shutil.rmtree(target, ignore_errors=True)
        _empty_npy(staging / _IMAGES, shape, np.uint8)  # sparse: rows take disk space as they are made
        _empty_npy(staging / _MADE, shape[:1], np.uint64, sparse=False)  # marks never wait for room
        (staging / _RECIPE).write_text(json.dumps(key, indent=1, sort_keys=True))  # last: marks it complete
        try:
            os.replace(staging, target)
        except OSError:  # another process created the same entry first: use that one
            if not _entry_ok(target, shape):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _empty_npy(path: Path, shape: tuple[int, ...], dtype, sparse: bool = True) -> None:
    """An ``.npy`` file of zeros ``shape``: its header, then a hole (``sparse``) or zeros written out
    (no memory map written either way)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                                 "shape": tuple(shape)})
        if sparse:
            f.truncate(f.tell() + size)
        else:
            for start in range(0, size, 1 << 20):
                f.write(bytes(min(1 << 20, size - start)))


def _entry_ok(directory: Path, shape: tuple[int, ...]) -> bool:
    try:
        json.loads((directory / _RECIPE).read_text())
        images = np.load(directory / _IMAGES, mmap_mode="r")
        made = np.load(directory / _MADE, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return (tuple(images.shape) == shape and images.dtype == np.uint8 and tuple(made.shape) == shape[:1]
            and made.dtype == np.uint64)


def _check_room(rows: FileRows | MemoryRows, todo: int) -> None:
    """Refuse before any work when the rows ``todo`` cannot fit on the entry's disk (eager mode writes them all)."""
    if rows.location is None or not todo:
        return
    needed = todo * int(np.prod(rows.shape[1:]))
    free = free_bytes(rows.location)
    if free is not None and needed > free:
        raise CacheFullError(cache_full_message(rows.location.parent, needed))


def stylize_cached(
    namespace: str,
    recipe: Mapping[str, Any],
    images: torch.Tensor,
    plan: AugmentPlan,
    bank: StyleBank,
    backend: StyleTransfer,
    alpha: float,
    batch_size: int,
    progress: bool | None = None,
    mode: str = "lazy",
) -> tuple[torch.Tensor | LazyImages, dict[str, float]]:
    """The plan's output images and metrics of the setup's work.

    ``mode="lazy"`` (default): a :class:`~fedstyle.data.lazy.LazyImages` over the cache entry; an
    output image is made when a training batch first reads it (its pixels are the same whichever
    way: each image is restyled on its own), so a run pays for the images it trains on. ``eager``:
    every image made now (the paper's procedure; a bar shows progress on a terminal, ``progress``
    None) and returned as a tensor. Metrics: ``augmented_images``; ``cached_images`` (outputs an
    earlier run made); eager: ``stylized_images`` and ``stylize_seconds`` made now, ``cache_hits =
    1`` when nothing was left to make.
    """
    from fedstyle.data.cache import cache_dir, recipe_key  # lazy: fedstyle.data is not needed to import styles

    if mode not in STYLIZE_MODES:
        raise ConfigError(f"stylize={mode!r} is not one of {', '.join(STYLIZE_MODES)}")
    backend.check(bank.style)
    images = images.detach().to("cpu")
    if images.dim() != 4 or images.dtype != torch.uint8:
        raise ConfigError(f"client images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
    shape = (len(plan), 3, *images.shape[-2:])
    key = dict(recipe, version=CACHE_VERSION, backend=backend.name, encoder=backend.encoder_id, alpha=float(alpha),
               weights=weights_fingerprint(backend), images=tensor_digest(images), plan=plan.digest(),
               bank=bank.digest())
    entry = cache_dir() / namespace / recipe_key(key)
    rows = _open_entry(entry, key, shape)
    count = MakeCount()
    lazy = LazyImages(rows, _plan_maker(images, plan, bank, backend, alpha, count), batch_size=batch_size, count=count)
    todo = len(lazy.missing())
    metrics: dict[str, float] = {"augmented_images": float(len(plan)), "cached_images": float(len(plan) - todo)}
    if mode == "lazy":
        return lazy, metrics
    _check_room(rows, todo)
    with image_bar(todo, "stylizing", progress) as tick:
        lazy.ensure(progress=tick)
    lazy.verify()  # what an earlier run made: a damaged row is made again, never trained on
    lazy.flush()  # every mark on disk with its pixels
    if todo:
        metrics.update(stylized_images=float(count.transferred), stylize_seconds=count.seconds)
    else:
        metrics["cache_hits"] = 1.0
    if count.repaired:
        metrics["repaired_images"] = float(count.repaired)
    if isinstance(rows, MemoryRows):  # a read-only cache: the rows just made live in memory only
        return torch.from_numpy(rows.images), metrics
    return torch.from_numpy(np.load(entry / _IMAGES, mmap_mode="c")), metrics  # copy-on-write: never written back


@contextmanager
def image_bar(total: int, desc: str, show: bool | None = None) -> Iterator[Callable[[int], None]]:
    """A tqdm bar over ``total`` images on stderr (counts, rate, time left), shown when ``show`` is true
    (None: when stderr is a terminal); yields ``tick(n)``, to call after each n images."""
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if show is None else show
    with tqdm(total=total, desc=desc, unit="img", disable=not show, leave=False, file=sys.stderr) as bar:
        yield bar.update


def _plan_maker(images: torch.Tensor, plan: AugmentPlan, bank: StyleBank, backend: StyleTransfer, alpha: float,
                count: MakeCount):
    """``make(rows)`` of the plan's outputs: originals copied, the others restyled to their bank rows
    (counted in ``count.transferred``)."""
    rgb = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images

    def make(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty((len(rows), 3, *images.shape[-2:]), dtype=torch.uint8)
        style_rows, source = plan.style_row[rows], plan.source[rows]
        keep = style_rows < 0
        out[keep] = rgb[source[keep]]
        todo = (~keep).nonzero().flatten()
        if len(todo):
            ratio = alpha if plan.ratio is None else plan.ratio[rows[todo]]
            out[todo] = backend.transfer(images[source[todo]], bank.style.select(style_rows[todo]), ratio).cpu()
            count.transferred += len(todo)
        return out

    return make


def stylize_to_style(
    namespace: str,
    recipe: Mapping[str, Any],
    images: torch.Tensor,
    style: Style,
    backend: StyleTransfer,
    alpha: float,
    batch_size: int,
    progress: bool | None = None,
    mode: str = "lazy",
) -> tuple[torch.Tensor | LazyImages, dict[str, float]]:
    """Every image restyled to the one ``style`` (no bank: e.g. PARDON's transfer to its global
    interpolation style S_g), through the cache like :func:`stylize_cached`; row i of the output is
    image i restyled, so it can ride along as an aligned view."""
    if len(style) != 1:
        raise ConfigError(f"stylize_to_style takes one style, got {len(style)}; use stylize_cached with a bank")
    n = int(images.shape[0])
    bank = StyleBank(style, torch.zeros(1, dtype=torch.long))
    plan = AugmentPlan(torch.arange(n), torch.zeros(n, dtype=torch.long))
    return stylize_cached(namespace, recipe, images, plan, bank, backend, alpha, batch_size, progress, mode)


def made_so_far(*stores: Any) -> tuple[float, float]:
    """(images restyled, seconds spent making rows) so far by the :class:`LazyImages` among ``stores``
    (other tensors count 0; device copies of one store, which share its count, count once)."""
    counts = {id(s.count): s.count for s in stores if isinstance(s, LazyImages)}
    return float(sum(c.transferred for c in counts.values())), float(sum(c.seconds for c in counts.values()))
