"""Making the style-transferred images of a setup exchange, and caching the clients' styles.

* :func:`stylize_to_style` — every image restyled to one style, through the same cache;
* :func:`stylize_cached` — the output images, in a memory-mapped uint8 cache entry
  ``cache_dir()/<namespace>/<key>/images.npy`` keyed by everything that changes the pixels (the
  content images' bytes, the plan — hence bank, K, seed —, backend, encoder, options, alpha, and
  the method's recipe, e.g. CCST's style type and ``keep_original``), beside ``made.npy``, one byte
  per output set once its pixels are written. By default (``stylize=lazy``) an output is made when a
  training batch first reads it: a run of a few hundred steps pays for the images it trains on, not
  for all d x K (CCST on fashion4 with 3 clients: 94,500 images, 15 minutes on 2 CPU cores with the
  lite backend). ``eager`` makes them all at setup. A rerun or a resumed run reuses what is made;
  the entry is created under a temporary name and renamed, and a killed run leaves rows unmarked,
  never marked and half-written. The key leaves out the device: a GPU's FFT or convolutions may
  round one pixel in 10^5 differently (measured: at most one grey level with ``fft``), and
  whichever row was made first is reused. On CPU a row's pixels do not depend on the other rows it
  is made with (tested bit for bit), so lazy and eager give the same images.
* :func:`cached_style` — a client's computed style (CCST's overall style, PARDON's clustered one),
  one file per recipe and images in ``cache_dir()/client_styles``, so a rerun's setup loads it.
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
from fedstyle.errors import ConfigError
from fedstyle.io import make_staging_dir
from fedstyle.style.transfer.augment import AugmentPlan, StyleBank, tensor_digest, weights_fingerprint
from fedstyle.style.transfer.base import Style, StyleTransfer

#: bump when the cache entry layout or the generation procedure changes (2: rows made on demand, made.npy)
CACHE_VERSION = 2
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
    images again. Returns (style, numbers, whether it came from the cache). An unreadable file is
    computed and written anew (atomically). As for the images, the key leaves out the device.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import save_file

    from fedstyle.data.cache import cache_dir, recipe_key
    from fedstyle.io import atomic_write

    key = dict(recipe, version=CACHE_VERSION, backend=backend.name, encoder=backend.encoder_id,
               weights=weights_fingerprint(backend), images=tensor_digest(images))
    path = cache_dir() / STYLE_CACHE / f"{recipe_key(key)}.safetensors"
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["fedstyle"])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        return Style(meta["backend"], meta["encoder"], tensors), meta["numbers"], True
    except (OSError, KeyError, ValueError, RuntimeError, TypeError, SafetensorError):  # absent or damaged: anew
        pass
    style, numbers = compute()
    meta = {"backend": style.backend, "encoder": style.encoder, "numbers": numbers, "key": key}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: save_file({k: v.contiguous() for k, v in style.tensors.items()}, str(tmp),
                                                 metadata={"fedstyle": json.dumps(meta, sort_keys=True)}))
    except PermissionError:  # a read-only cache: the style is used, only not kept for the next run
        pass
    return style, numbers, False


# -- generation into the cache --------------------------------------------------------------------
#: when the plan's images are made: ``lazy`` as training batches first read them, ``eager`` all at setup
STYLIZE_MODES = ("lazy", "eager")


def _open_entry(target: Path, key: Mapping[str, Any], shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
    """The cache entry ``target``'s image store (N, 3, H, W) and made map (N,), created empty when absent.

    Both are shared memory maps (a row made by one run is there for the next); an entry that cannot be
    written (a read-only cache) is opened copy-on-write, so its missing rows are made in memory only.
    An entry is created in a staging folder and renamed into place, so it is never seen half-written.
    """
    if not _entry_ok(target, shape):
        try:
            _create_entry(target, key, shape)
        except PermissionError as err:
            raise ConfigError(f"the style cache {target.parent} is not writable and holds no images for this setting; "
                              f"set FEDSTYLE_CACHE to a writable folder, or make this one writable") from err
    try:
        images, made = np.load(target / _IMAGES, mmap_mode="r+"), np.load(target / _MADE, mmap_mode="r+")
    except PermissionError:
        images, made = np.load(target / _IMAGES, mmap_mode="c"), np.load(target / _MADE, mmap_mode="c")
    return torch.from_numpy(images), made


def _create_entry(target: Path, key: Mapping[str, Any], shape: tuple[int, ...]) -> None:
    """An empty entry (no row made) at ``target``: staged, then renamed into place."""
    from fedstyle.data.cache import _remove_stale_staging  # the dataset cache's rule for killed builds

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(target)
    if target.exists():  # damaged or an older layout: made anew
        shutil.rmtree(target, ignore_errors=True)
    staging = make_staging_dir(target)
    try:
        # sparse files: rows take disk space as they are made
        np.lib.format.open_memmap(staging / _IMAGES, mode="w+", dtype=np.uint8, shape=shape).flush()
        np.lib.format.open_memmap(staging / _MADE, mode="w+", dtype=np.uint8, shape=shape[:1]).flush()
        (staging / _RECIPE).write_text(json.dumps(key, indent=1, sort_keys=True))  # last: marks it complete
        try:
            os.replace(staging, target)
        except OSError:  # another process created the same entry first: use that one
            if not _entry_ok(target, shape):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _entry_ok(directory: Path, shape: tuple[int, ...]) -> bool:
    try:
        json.loads((directory / _RECIPE).read_text())
        images = np.load(directory / _IMAGES, mmap_mode="r")
        made = np.load(directory / _MADE, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return (tuple(images.shape) == shape and images.dtype == np.uint8 and tuple(made.shape) == shape[:1]
            and made.dtype == np.uint8)


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
    store, made = _open_entry(entry, key, shape)
    count = MakeCount()
    lazy = LazyImages(store, made, _plan_maker(images, plan, bank, backend, alpha, count), batch_size=batch_size,
                      count=count)
    todo = len(lazy.missing())
    metrics: dict[str, float] = {"augmented_images": float(len(plan)), "cached_images": float(len(plan) - todo)}
    if mode == "lazy":
        return lazy, metrics
    with image_bar(todo, "stylizing", progress) as tick:
        lazy.ensure(progress=tick)
    if todo:
        metrics.update(stylized_images=float(count.transferred), stylize_seconds=count.seconds)
    else:
        metrics["cache_hits"] = 1.0
    if made.mode == "c":  # a read-only cache: the rows just made live in this copy-on-write map only
        return store, metrics
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
