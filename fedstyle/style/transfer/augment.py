"""Cross-client style augmentation, shared by CCST and FedDG-FFT (and reusable by later methods).

The pieces of a setup-phase style exchange (CCST Section 3.2, Algorithm 1):

* :func:`client_style` — what a client uploads: J single-image styles of randomly drawn images
  (CCST Eq. 6, 7) or its overall style over all images (Eq. 8);
* :class:`StyleBank` — the server's concatenation of every client's styles (Eq. 9, 10) with, per
  style, the client (= domain) it came from, as a payload;
* :class:`AugmentPlan` and :func:`plan_cross_client` — which content image and which bank style
  every output image uses (Algorithm 1: K distinct domains per image, own domain = original; or,
  ``keep_original="always"``, the original plus K distinct other domains);
* :func:`stylize_to_style` — every image restyled to one style, through the same cache;
* :func:`stylize_cached` — the output images generated once, in batches, into a memory-mapped
  uint8 cache entry ``cache_dir()/<namespace>/<key>/images.npy`` keyed by everything that changes
  the pixels (the content images' bytes, the plan — hence bank, K, seed —, backend, encoder,
  options, alpha, and the method's recipe, e.g. CCST's style type and ``keep_original``), written
  under a temporary name and renamed, so a rerun or a resumed run reuses it and a crash leaves
  nothing half-written. The key leaves out the device: a GPU's FFT or
  convolutions may round one pixel in 10^5 differently (measured: at most one grey level with
  ``fft``), and whichever entry was generated first is reused;
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from fedstyle.devices import resolve_device
from fedstyle.errors import ConfigError
from fedstyle.io import make_staging_dir
from fedstyle.payload import Payload
from fedstyle.style.transfer.base import TRANSFER_BACKENDS, Style, StyleMismatchError, StyleTransfer

#: bump when the cache entry layout or the generation procedure changes
CACHE_VERSION = 1
_IMAGES, _RECIPE = "images.npy", "recipe.json"
# ctx.state keys carrying the style computation's cost from setup_upload to setup_download
_STYLE_SECONDS, _STYLE_IMAGES = "setup/style_seconds", "setup/style_images"


def make_backend(name: str, device: torch.device | str, **options: Any) -> StyleTransfer:
    """The backend ``name`` built with ``device`` and the non-empty ``options`` (e.g. weight paths)."""
    kept = {k: v for k, v in options.items() if v not in ("", None)}
    return TRANSFER_BACKENDS.get(name)(device=device, **kept)


def resolve_style_device(name: str, run_device: torch.device) -> torch.device:
    """``auto`` = the run's device; otherwise the named device (checked like ``--device``)."""
    if name == "auto":
        return run_device
    return resolve_device(name)


def tensor_digest(*tensors: torch.Tensor, extra: str = "") -> str:
    """SHA-256 over the shapes, dtypes and bytes of ``tensors`` (and ``extra``)."""
    digest = hashlib.sha256(extra.encode())
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def weights_fingerprint(backend: StyleTransfer) -> str:
    """Digest of every network the backend holds (encoder and decoder weights), '' when it has none."""
    cached = getattr(backend, "_fedstyle_weights_fingerprint", None)
    if cached is None:
        modules = {k: v for k, v in vars(backend).items() if isinstance(v, torch.nn.Module)}
        tensors, names = [], []
        for attr, module in sorted(modules.items(), key=lambda item: item[0]):
            for name, value in sorted(module.state_dict().items()):
                names.append(f"{attr}.{name}")
                tensors.append(value)
        cached = tensor_digest(*tensors, extra="|".join(names)) if tensors else ""
        backend._fedstyle_weights_fingerprint = cached
    return cached


# -- the client's style ---------------------------------------------------------------------------
def client_style(
    backend: StyleTransfer, images: torch.Tensor, *, style_type: str, count: int, seed: int, batch_size: int
) -> tuple[Style, int]:
    """A client's style upload and how many images it was computed from.

    ``single``: the styles of ``count`` images drawn without replacement with ``seed`` (all of them
    if ``count`` exceeds the data); ``overall``: the backend's dataset style over every image.
    """
    n = int(images.shape[0])
    if n == 0:
        raise StyleMismatchError("a client with no images has no style; choose a partition that leaves no client empty")
    batches = range(0, n, batch_size)
    if style_type == "overall":
        return backend.dataset_style(images[s : s + batch_size] for s in batches), n
    if style_type != "single":
        raise ConfigError(f"style type {style_type!r} is not single or overall")
    count = min(int(count), n)
    chosen = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count].sort().values
    parts = [backend.image_styles(images[chosen[s : s + batch_size]]) for s in range(0, count, batch_size)]
    return Style.concat(parts), count


def record_style_cost(state: dict[str, torch.Tensor], seconds: float, images: int) -> None:
    """Keep the style computation's time and image count until :func:`pop_style_cost` (setup_download)."""
    state[_STYLE_SECONDS] = torch.tensor(float(seconds), dtype=torch.float64)
    state[_STYLE_IMAGES] = torch.tensor(float(images), dtype=torch.float64)


def pop_style_cost(state: dict[str, torch.Tensor]) -> dict[str, float]:
    """``{"style_seconds", "style_images"}`` recorded at upload (removed from the client state), or {}."""
    if _STYLE_SECONDS not in state:
        return {}
    return {"style_seconds": float(state.pop(_STYLE_SECONDS)), "style_images": float(state.pop(_STYLE_IMAGES))}


# -- the server's bank ----------------------------------------------------------------------------
@dataclass
class StyleBank:
    """Every client's styles concatenated (CCST Eq. 9, 10); ``owner[i]`` is the client of style i.

    Rows are grouped by client in increasing client id, so client c's styles are one contiguous block.
    """

    style: Style
    owner: torch.Tensor

    @classmethod
    def from_uploads(cls, uploads: Mapping[int, Payload], prefix: str = "style") -> "StyleBank":
        """Concatenate the clients' style payloads; refuses an empty bank and mixed backends or encoders."""
        ids = sorted(uploads)
        styles = [Style.from_payload(uploads[c], prefix) for c in ids]
        style = Style.concat(styles)  # raises StyleMismatchError for none / empty / mixed origins
        owner = torch.cat([torch.full((len(s),), c, dtype=torch.long) for c, s in zip(ids, styles)])
        return cls(style, owner)

    def to_payload(self, prefix: str = "bank") -> Payload:
        payload = self.style.to_payload(prefix)
        payload[f"{prefix}/owner"] = self.owner
        return payload

    @classmethod
    def from_payload(cls, payload: Payload, prefix: str = "bank") -> "StyleBank":
        style = Style.from_payload(payload, prefix)
        owner = payload.get(f"{prefix}/owner")
        if not style.tensors or len(style) == 0 or not isinstance(owner, torch.Tensor) or len(owner) == 0:
            raise StyleMismatchError("the broadcast style bank is empty: no client contributed a style")
        owner = owner.to("cpu", torch.long)
        if len(owner) != len(style) or bool((owner[1:] < owner[:-1]).any()):
            raise StyleMismatchError("the style bank's owner list does not match its styles (rows grouped by client)")
        return cls(style, owner)

    def __len__(self) -> int:
        return len(self.style)

    def domains(self) -> list[int]:
        return sorted(set(self.owner.tolist()))

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(domain ids, first row, row count) of each client's block."""
        ids, counts = torch.unique_consecutive(self.owner, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        return ids, first, counts

    def digest(self) -> str:
        names = sorted(self.style.tensors)
        return tensor_digest(self.owner, *(self.style.tensors[k] for k in names),
                             extra=f"{self.style.backend}|{self.style.encoder}|{names}")


# -- what to generate -----------------------------------------------------------------------------
@dataclass
class AugmentPlan:
    """Output image m is content image ``source[m]`` restyled to bank row ``style_row[m]``
    (``-1``: the original image), with interpolation ``ratio[m]`` (None: the method's alpha)."""

    source: torch.Tensor
    style_row: torch.Tensor
    ratio: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.source.shape[0])

    def digest(self) -> str:
        parts = [self.source, self.style_row] + ([self.ratio] if self.ratio is not None else [])
        return tensor_digest(*parts)


#: :func:`plan_cross_client`'s rules for the original image (CCST's ``keep_original``)
KEEP_ORIGINAL = ("own_domain", "always")


def plan_cross_client(num_images: int, bank: StyleBank, own: int, k: int, seed: int, per_batch: int = 0,
                      keep_original: str = "own_domain") -> AugmentPlan:
    """Which style every output image of client ``own`` gets (CCST Section 3.2.3).

    ``keep_original="own_domain"`` — CCST Algorithm 1, the paper's: K distinct bank domains per
    image, drawn uniformly without replacement; the own domain keeps the original, another domain
    gives a style drawn uniformly from that domain's block (its overall style when the block has one
    row). d x K outputs; the original is among them only when the own domain is drawn (probability
    K / N for N domains: always when K = N, as in the paper's experiments with one client per domain).

    ``keep_original="always"``: every image's original, then K distinct domains drawn the same way
    among the *other* domains of the bank (K <= N - 1), each a restyled copy: d x (K + 1) outputs.
    At K = N - 1 it holds the same images as Algorithm 1 at K = N.

    ``per_batch > 0`` (the public code): the style of a domain is drawn once per run of
    ``per_batch`` consecutive images instead of once per image. Outputs are image-major:
    output ``i * k + j`` is image i's j-th draw (``always``: ``i * (k + 1)`` is image i's original,
    ``i * (k + 1) + 1 + j`` its j-th draw).
    """
    if keep_original not in KEEP_ORIGINAL:
        raise ConfigError(f"keep_original={keep_original!r} is not one of {', '.join(KEEP_ORIGINAL)}")
    ids, first, counts = bank.blocks()
    n = len(ids)
    always = keep_original == "always"
    # positions into ids that may be drawn: every domain (Algorithm 1) or every domain but the own one
    drawable = (ids != own).nonzero().flatten() if always else torch.arange(n)
    if k > len(drawable):
        if always:
            raise ConfigError(
                f"k={k} restyled copies per image from other clients' styles, but the style bank holds only "
                f"{len(drawable)} domains besides client {own}'s (clients {ids.tolist()}); choose k <= "
                f"{len(drawable)} (keep_original=always draws the K domains without replacement among the others)"
            )
        raise ConfigError(
            f"k={k} styles per image, but the style bank holds only {n} domains (clients {ids.tolist()}); "
            f"choose k <= {n} (Algorithm 1 draws the K domains without replacement)"
        )
    g = torch.Generator().manual_seed(seed)
    # positions into ids, distinct per row
    picks = drawable[torch.rand(num_images, len(drawable), generator=g).argsort(dim=1)[:, :k]]
    if per_batch > 0:
        u = torch.rand(math.ceil(num_images / per_batch), n, generator=g)
        u = u[torch.arange(num_images) // per_batch].gather(1, picks)
    else:
        u = torch.rand(num_images, k, generator=g)
    rows = first[picks] + (u * counts[picks]).long().clamp_max(counts[picks] - 1)
    rows = torch.where(ids[picks] == own, torch.full_like(rows, -1), rows)  # Algorithm 1 line 5; never under always
    if always:
        rows = torch.cat([torch.full((num_images, 1), -1, dtype=rows.dtype), rows], dim=1)
    per_image = rows.shape[1]
    return AugmentPlan(torch.arange(num_images).repeat_interleave(per_image), rows.reshape(-1))


# -- generation into the cache --------------------------------------------------------------------
def _complete(directory: Path, shape: tuple[int, ...]) -> bool:
    try:
        json.loads((directory / _RECIPE).read_text())
        array = np.load(directory / _IMAGES, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return tuple(array.shape) == shape and array.dtype == np.uint8


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
) -> tuple[torch.Tensor, dict[str, float]]:
    """The plan's output images (uint8, memory-mapped from the cache) and metrics of the work done.

    Metrics: ``augmented_images`` always; ``stylized_images`` and ``stylize_seconds`` when the
    images were generated now, ``cache_hits = 1`` when an earlier run's entry was reused.
    ``progress`` None shows a bar only on a terminal.
    """
    from fedstyle.data.cache import cache_dir, recipe_key  # lazy: fedstyle.data is not needed to import styles

    backend.check(bank.style)
    images = images.detach().to("cpu")
    if images.dim() != 4 or images.dtype != torch.uint8:
        raise ConfigError(f"client images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
    shape = (len(plan), 3, *images.shape[-2:])
    key = dict(recipe, version=CACHE_VERSION, backend=backend.name, encoder=backend.encoder_id, alpha=float(alpha),
               weights=weights_fingerprint(backend), images=tensor_digest(images), plan=plan.digest(),
               bank=bank.digest())
    target = cache_dir() / namespace / recipe_key(key)
    metrics: dict[str, float] = {"augmented_images": float(len(plan))}
    if not _complete(target, shape):
        metrics.update(_generate(target, key, shape, images, plan, bank, backend, alpha, batch_size, progress))
    else:
        metrics["cache_hits"] = 1.0
    array = np.load(target / _IMAGES, mmap_mode="c")  # copy-on-write: writable for torch, never written back
    return torch.from_numpy(array), metrics


def stylize_to_style(
    namespace: str,
    recipe: Mapping[str, Any],
    images: torch.Tensor,
    style: Style,
    backend: StyleTransfer,
    alpha: float,
    batch_size: int,
    progress: bool | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Every image restyled to the one ``style`` (no bank: e.g. PARDON's transfer to its global
    interpolation style S_g), generated once into the cache like :func:`stylize_cached`; row i of
    the output is image i restyled, so it can ride along as an aligned view."""
    if len(style) != 1:
        raise ConfigError(f"stylize_to_style takes one style, got {len(style)}; use stylize_cached with a bank")
    n = int(images.shape[0])
    bank = StyleBank(style, torch.zeros(1, dtype=torch.long))
    plan = AugmentPlan(torch.arange(n), torch.zeros(n, dtype=torch.long))
    return stylize_cached(namespace, recipe, images, plan, bank, backend, alpha, batch_size, progress)


def _generate(target, key, shape, images, plan, bank, backend, alpha, batch_size, progress) -> dict[str, float]:
    from tqdm.auto import tqdm

    from fedstyle.data.cache import _remove_stale_staging  # the dataset cache's rule for killed builds

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(target)
    if target.exists():  # incomplete or damaged: rebuilt
        shutil.rmtree(target, ignore_errors=True)
    staging = make_staging_dir(target)
    try:
        array = np.lib.format.open_memmap(staging / _IMAGES, mode="w+", dtype=np.uint8, shape=shape)
        out = torch.from_numpy(array)  # writes go to the memory-mapped file
        rgb = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
        keep = (plan.style_row < 0).nonzero().flatten()
        for s in range(0, len(keep), 4096):
            idx = keep[s : s + 4096]
            out[idx] = rgb[plan.source[idx]]
        todo = (plan.style_row >= 0).nonzero().flatten()
        start = time.perf_counter()
        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(total=len(todo), desc="stylizing", unit="img", disable=not show, leave=False, file=sys.stderr) as bar:
            for s in range(0, len(todo), batch_size):
                idx = todo[s : s + batch_size]
                ratio = alpha if plan.ratio is None else plan.ratio[idx]
                style = bank.style.select(plan.style_row[idx])
                out[idx] = backend.transfer(images[plan.source[idx]], style, ratio).cpu()
                bar.update(len(idx))
        seconds = time.perf_counter() - start
        array.flush()
        del out, array
        (staging / _RECIPE).write_text(json.dumps(key, indent=1, sort_keys=True))  # last: marks the entry complete
        try:
            os.replace(staging, target)
        except OSError:  # another process finished the same entry first; its images are identical
            if not _complete(target, shape):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return {"stylized_images": float(len(todo)), "stylize_seconds": seconds}
