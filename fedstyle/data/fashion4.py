"""``fashion4``: Fashion-MNIST rendered as four visual domains, a PACS-like style shift offline.

The 70,000 Fashion-MNIST images (60k train + 10k test, Xiao et al., 2017) are split (seeded,
stratified) into four disjoint domains of 17,500 and each domain is rendered at 32 x 32 RGB by a
batched, seeded image filter (numpy / scipy.ndimage; no per-pixel or per-sample Python):

* ``photo``: colourised garment on a textured gradient background, drop shadow, spot lighting.
* ``art``: painterly gradient-mapped palette, brush-stroke smudges, posterised, canvas weave.
* ``cartoon``: flat two-tone colours with thick dark outlines (edge detection).
* ``sketch``: grey pencil strokes (gradient magnitude, stroke texture) on white paper, no fill.

Normalisation is fixed at mean = std = 0.5 (data statistics would leak the held-out domain).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Callable

import numpy as np
from matplotlib.colors import hsv_to_rgb
from scipy import ndimage

import torch

from fedstyle.data.cache import ArrayWriter, DecodedArrays, cached_dataset, decode_workers, ordered_map
from fedstyle.data.contract import DomainDataset, check_build_options
from fedstyle.data.contract import pick_per_class as pick_per_class_rows
from fedstyle.data.digits4 import resize_uint8, stratified_split, take_per_class
from fedstyle.data.idx import read_idx
from fedstyle.errors import DataError
from fedstyle.registry import Registry

NAME = "fashion4"
# Bump when anything below changes the generated pixels.
RECIPE_VERSION = 1
BASE_RESOLUTION = 32
DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
# The four files and the MD5 of the official downloads (Debian recompresses them, so a local
# copy may differ in MD5 while holding the same images: checksums are checked on download only).
FASHION_MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "train_labels": ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
    "test_images": ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
    "test_labels": ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
}
FASHION_MNIST_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)
FASHION_MNIST_URLS = tuple(base + name for base in FASHION_MNIST_MIRRORS for name, _ in FASHION_MNIST_FILES.values())
#: images in Fashion-MNIST (train + test): the most a full base entry holds
FASHION_MNIST_COUNT = 70_000
# Rendering works on chunks of this many images to bound float32 temporaries (~50 MB).
CHUNK = 4096

# A renderer maps garment intensities m in [0, 1], (N, 32, 32), to RGB in [0, 1], (N, 32, 32, 3).
Renderer = Callable[[np.ndarray, np.random.Generator], np.ndarray]
RENDERERS: Registry[Renderer] = Registry("fashion4 domain")


# ----------------------------------------------------------------------------- source files


def find_source_files(data_root: str | os.PathLike | None) -> dict[str, Path]:
    """Paths of the four idx files (``.gz`` or uncompressed) or a DataError naming the fixes."""
    root = Path(data_root).expanduser() if data_root is not None else DEFAULT_ROOT
    found = {}
    for key, (gz_name, _) in FASHION_MNIST_FILES.items():
        for candidate in (root / gz_name, root / gz_name[: -len(".gz")]):
            if candidate.is_file():
                found[key] = candidate
                break
    if len(found) == len(FASHION_MNIST_FILES):
        return found
    missing = [FASHION_MNIST_FILES[k][0] for k in FASHION_MNIST_FILES if k not in found]
    where = f"--data-root {root}" if data_root is not None else f"the default location {DEFAULT_ROOT}"
    raise DataError(
        f"fashion4 needs the Fashion-MNIST idx files; {where} lacks {', '.join(missing)}. Fix one of: "
        f"(1) install the Debian package: sudo apt install dataset-fashion-mnist; "
        f"(2) pass --data-root DIR with the four files {', '.join(n for n, _ in FASHION_MNIST_FILES.values())}; "
        f"(3) download them from {FASHION_MNIST_MIRRORS[0]} (or call "
        f"fedstyle.data.fashion4.download_fashion_mnist(DIR)) and pass --data-root DIR."
    )


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def download_fashion_mnist(dest: str | os.PathLike) -> Path:
    """Download the four Fashion-MNIST files into ``dest`` (MD5-checked, atomic per file).

    Only called on explicit request; tries each mirror in :data:`FASHION_MNIST_MIRRORS` in turn.
    """
    dest = Path(dest).expanduser()
    dest.mkdir(parents=True, exist_ok=True)
    for name, md5 in FASHION_MNIST_FILES.values():
        target = dest / name
        if target.is_file() and md5_of(target) == md5:
            continue
        errors = []
        for base in FASHION_MNIST_MIRRORS:
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=dest)
            try:
                with os.fdopen(handle, "wb") as out, urllib.request.urlopen(base + name, timeout=60) as response:
                    shutil.copyfileobj(response, out)
                actual = md5_of(Path(temporary))
                if actual != md5:
                    raise DataError(f"MD5 {actual} differs from the official {md5}")
                os.replace(temporary, target)
                break
            except (OSError, DataError) as err:
                errors.append(f"{base + name}: {err}")
            finally:
                Path(temporary).unlink(missing_ok=True)
        else:
            raise DataError(f"could not download {name}: " + "; ".join(errors))
    return dest


def read_fashion_mnist(files: dict[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    """All 70,000 images (N, 28, 28) uint8 and labels (train first, then test)."""
    images, labels = [], []
    for split in ("train", "test"):
        x, y = read_idx(files[f"{split}_images"]), read_idx(files[f"{split}_labels"])
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise DataError(
                f"{files[f'{split}_images']} and {files[f'{split}_labels']} do not match: "
                f"images {x.shape}, labels {y.shape}"
            )
        if len(y) and (y.min() < 0 or y.max() >= len(CLASSES)):
            raise DataError(f"{files[f'{split}_labels']} holds labels outside 0..9")
        images.append(x.astype(np.uint8))
        labels.append(y.astype(np.int64))
    return np.concatenate(images), np.concatenate(labels)


# ----------------------------------------------------------------------------- batched filters


def blur(x: np.ndarray, sigma: float | tuple[float, float]) -> np.ndarray:
    """Gaussian blur of the two spatial axes of (N, H, W[, C]), never across samples/channels."""
    sy, sx = (sigma, sigma) if np.isscalar(sigma) else sigma
    return ndimage.gaussian_filter(x, sigma=(0, sy, sx) + (0,) * (x.ndim - 3), mode="nearest")


def sobel_magnitude(x: np.ndarray) -> np.ndarray:
    """Per-sample Sobel gradient magnitude of (N, H, W) (``ndimage.sobel`` would smooth over N)."""
    smooth, derive = [1.0, 2.0, 1.0], [-1.0, 0.0, 1.0]
    gy = ndimage.correlate1d(ndimage.correlate1d(x, derive, axis=1), smooth, axis=2)
    gx = ndimage.correlate1d(ndimage.correlate1d(x, smooth, axis=1), derive, axis=2)
    return np.hypot(gx, gy)


def silhouette(m: np.ndarray) -> np.ndarray:
    """Soft garment mask: Fashion-MNIST backgrounds are (near) zero."""
    return np.clip((m - 0.02) / 0.1, 0.0, 1.0)


def random_colours(rng: np.random.Generator, count: int, saturation: tuple, value: tuple) -> np.ndarray:
    hsv = np.stack(
        [rng.random(count), rng.uniform(*saturation, size=count), rng.uniform(*value, size=count)], axis=1
    )
    return hsv_to_rgb(hsv).astype(np.float32)


def coordinate_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    ramp = np.linspace(-1.0, 1.0, size, dtype=np.float32)
    return ramp[None, :, None], ramp[None, None, :]


def stroke_noise(rng: np.random.Generator, shape: tuple, long: float, short: float) -> np.ndarray:
    """Zero-mean noise smeared into strokes; half the samples horizontal, half vertical."""
    noise = rng.standard_normal(shape, dtype=np.float32)
    vertical = rng.random(shape[0]) < 0.5
    noise[vertical] = blur(noise[vertical], (long, short))
    noise[~vertical] = blur(noise[~vertical], (short, long))
    return noise / (noise.std(axis=(1, 2), keepdims=True) + 1e-6)


@RENDERERS.register("photo")
def render_photo(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    count, size = m.shape[0], m.shape[1]
    alpha = silhouette(m)[..., None]
    fabric = random_colours(rng, count, (0.25, 0.9), (0.45, 1.0))
    garment = fabric[:, None, None, :] * (0.25 + 0.9 * m[..., None])
    ys, xs = coordinate_grid(size)
    angle = rng.uniform(0, 2 * np.pi, size=(count, 1, 1)).astype(np.float32)
    ramp = (np.cos(angle) * xs + np.sin(angle) * ys)[..., None] * 0.5 + 0.5
    wall = random_colours(rng, count, (0.05, 0.35), (0.55, 0.95))
    floor = random_colours(rng, count, (0.05, 0.35), (0.35, 0.8))
    background = wall[:, None, None] * (1 - ramp) + floor[:, None, None] * ramp
    texture = blur(rng.standard_normal((count, size, size), dtype=np.float32), 1.5) * 3.0
    background = background * (1 + 0.08 * texture)[..., None]
    offset = rng.integers(1, 3, size=2)
    shadow = blur(np.roll(alpha[..., 0], shift=tuple(offset), axis=(1, 2)), 1.5)[..., None]
    background = background * (1 - 0.45 * shadow)
    image = background * (1 - alpha) + garment * alpha
    light_y, light_x = rng.uniform(-0.8, 0.8, size=(2, count, 1, 1)).astype(np.float32)
    spot = np.exp(-((ys - light_y) ** 2 + (xs - light_x) ** 2) / 1.2)
    image = image * (0.6 + 0.55 * spot)[..., None]
    return image + 0.015 * rng.standard_normal(image.shape, dtype=np.float32)


@RENDERERS.register("art")
def render_art(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    count, size = m.shape[0], m.shape[1]
    alpha = blur(silhouette(m), 0.7)[..., None]
    dark = random_colours(rng, count, (0.7, 1.0), (0.25, 0.5))
    light = random_colours(rng, count, (0.5, 0.9), (0.8, 1.0))
    tone = blur(m, 0.6)[..., None]
    garment = dark[:, None, None] * (1 - tone) + light[:, None, None] * tone  # gradient map
    paper = random_colours(rng, count, (0.1, 0.45), (0.7, 0.95))
    wash = blur(rng.standard_normal((count, size, size, 3), dtype=np.float32), 4.0) * 3.0
    background = paper[:, None, None] + 0.07 * wash
    image = background * (1 - alpha) + garment * alpha
    image = image * rng.uniform(0.85, 1.15, size=(count, 1, 1, 3)).astype(np.float32)  # colour jitter
    strokes = stroke_noise(rng, (count, size, size), long=3.0, short=0.7)
    image = blur(image * (1 + 0.08 * strokes[..., None]), (0.8, 0.3))  # smudged, brushed strokes
    levels = 6
    image = np.round(np.clip(image, 0, 1) * (levels - 1)) / np.float32(levels - 1)  # posterised palette
    row, col = np.arange(size)[:, None], np.arange(size)[None, :]
    weave = (0.96 + 0.04 * ((row + col) % 2)).astype(np.float32)  # canvas threads
    grain = 1 + 0.03 * rng.standard_normal((count, size, size), dtype=np.float32)
    return image * (weave * grain)[..., None]


def boundary(mask: np.ndarray) -> np.ndarray:
    """Pixels of a boolean (N, H, W) mask that touch its outside (per sample, 4-neighbourhood)."""
    cross = np.zeros((1, 3, 3), dtype=bool)
    cross[0, 1, :] = cross[0, :, 1] = True
    # border_value=1: the image frame is not an edge of the shape.
    return mask & ~ndimage.binary_erosion(mask, structure=cross, border_value=1)


@RENDERERS.register("cartoon")
def render_cartoon(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    count = m.shape[0]
    inside = silhouette(blur(m, 0.5)) > 0.5
    inside = ndimage.binary_opening(inside, structure=np.ones((1, 2, 2), dtype=bool))
    fill = random_colours(rng, count, (0.6, 1.0), (0.85, 1.0))
    light_band = (blur(m, 1.2) > 0.4) & inside  # two flat tones instead of shading
    garment = np.where(light_band[..., None], fill[:, None, None], 0.6 * fill[:, None, None])
    backdrop = random_colours(rng, count, (0.0, 0.3), (0.92, 1.0))
    image = np.where(inside[..., None], garment, backdrop[:, None, None])
    # Thick outline: the silhouette's inner and outer boundary pixels; thin lines between tones.
    outline = boundary(inside) | boundary(~inside)
    detail = boundary(light_band) & ~boundary(inside)
    ink = np.float32(0.07)
    image = np.where(outline[..., None], ink, image)
    return np.where(detail[..., None], 0.35 * image, image)


@RENDERERS.register("sketch")
def render_sketch(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    count, size = m.shape[0], m.shape[1]
    edges = sobel_magnitude(blur(m, 0.7))
    edges = edges / (np.percentile(edges, 99, axis=(1, 2), keepdims=True) + 1e-6)
    pressure = rng.uniform(0.55, 0.9, size=(count, 1, 1)).astype(np.float32)
    texture = np.clip(0.75 + 0.35 * stroke_noise(rng, (count, size, size), long=1.5, short=0.3), 0.3, 1.0)
    graphite = np.clip(edges, 0, 1) ** 0.8 * pressure * texture
    paper = 0.97 + 0.02 * rng.standard_normal((count, size, size), dtype=np.float32)
    grey = paper - graphite
    return np.repeat(grey[..., None], 3, axis=-1)


def render_domain(domain: str, garments: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Render uint8 (N, 28, 28) garments as uint8 (N, 3, 32, 32) in the style of ``domain``."""
    renderer = RENDERERS.get(domain)
    pad = (BASE_RESOLUTION - garments.shape[-1]) // 2
    out = np.empty((len(garments), 3, BASE_RESOLUTION, BASE_RESOLUTION), dtype=np.uint8)
    for start in range(0, len(garments), CHUNK):
        chunk = garments[start : start + CHUNK]
        m = np.pad(chunk, ((0, 0), (pad, pad), (pad, pad))).astype(np.float32) / 255.0
        rgb = np.clip(renderer(m, rng), 0.0, 1.0)
        out[start : start + CHUNK] = (rgb * 255.0).round().astype(np.uint8).transpose(0, 3, 1, 2)
    return out


# ----------------------------------------------------------------------------- dataset


DOMAINS = ["photo", "art", "cartoon", "sketch"]


def _render_job(job: tuple[str, np.ndarray, np.random.SeedSequence]) -> np.ndarray:
    """One domain rendered at the base resolution (a worker process's job: its own seed, its own garments)."""
    domain, garments, seed_sequence = job
    return render_domain(domain, garments, np.random.default_rng(seed_sequence))


def _resize_job(job: tuple[np.ndarray, int]) -> tuple[np.ndarray, None]:
    """A chunk of base-resolution images resized (a worker process's job; see ``ChunkedImages.fill``)."""
    images, resolution = job
    return resize_uint8(images, resolution), None


def build_fashion4(
    files: dict[str, Path], seed: int = 0, resolution: int = BASE_RESOLUTION, per_class: int | None = None,
    workers: int = 1,
) -> DecodedArrays:
    """Split the 70k images into four stratified domains and render each (``per_class`` caps), a domain per
    worker process (each domain has its own seeded generator, so the pixels do not depend on ``workers``)."""
    garments, labels = read_fashion_mnist(files)
    split_seed, *render_seeds = np.random.SeedSequence(seed).spawn(1 + len(DOMAINS))
    parts = stratified_split(labels, len(DOMAINS), np.random.default_rng(split_seed))
    parts = [part[take_per_class(labels[part], per_class)] for part in parts]
    jobs = [(domain, garments[part], seeds) for domain, part, seeds in zip(DOMAINS, parts, render_seeds)]
    rendered = ordered_map(_render_job, jobs, min(workers, len(DOMAINS)))
    images = {domain: resize_uint8(out, resolution) for domain, out in zip(DOMAINS, rendered)}
    return DecodedArrays(
        domains=list(DOMAINS),
        classes=list(CLASSES),
        images=images,
        labels={domain: labels[part] for domain, part in zip(DOMAINS, parts)},
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        augment="crop_flip",
        info={
            "sources": {name: str(path) for name, path in files.items()},
            # Index into train (0..59999) followed by test (60000..69999).
            "source_indices": {domain: part.tolist() for domain, part in zip(DOMAINS, parts)},
        },
    )


#: base-resolution images resized per worker job (at 224 px: 38 MB of output)
RESIZE_CHUNK = 256


def build_resized(writer: ArrayWriter, base: DomainDataset, rows: list[torch.Tensor], resolution: int,
                  workers: int) -> DecodedArrays:
    """The rows ``rows[d]`` of the base-resolution ``base`` resized to ``resolution``, written a chunk at a
    time (memory bounded by a few chunks, whatever the count); resizing is per image, so the pixels do not
    depend on ``workers`` or on which other rows are resized."""
    images, labels, sources = {}, {}, {}
    for index, (domain, keep) in enumerate(zip(base.domains, rows)):
        out = writer.image_rows(index, len(keep), resolution, resolution)
        jobs = ((_resize_job, (base.images[domain][part].numpy(), resolution), len(part))
                for part in keep.split(RESIZE_CHUNK))
        try:
            for _ in out.fill(jobs, workers):
                pass
            images[domain] = writer.finish(index, out)
        finally:
            out.discard()
        labels[domain] = base.labels[domain][keep].numpy()
        sources[domain] = np.asarray(base.info["source_indices"][domain])[keep.numpy()].tolist()
    return DecodedArrays(
        domains=list(base.domains), classes=list(base.classes), images=images, labels=labels, mean=base.mean,
        std=base.std, augment=base.augment, info={"sources": base.info["sources"], "source_indices": sources},
    )


def load_fashion4(
    data_root: str | None = None,
    resolution: int | None = None,
    skip_bad_images: bool = False,
    seed: int = 0,
    progress: bool = True,
    per_class: int | None = None,
    pick_per_class: int | None = None,
    workers: int | None = None,
) -> DomainDataset:
    """Load (building and caching on first use) ``fashion4`` from the idx files in ``data_root``.

    ``per_class`` keeps the first images of each class (for tests). ``pick_per_class`` is a run's
    ``--per-class``: the dataset :meth:`DomainDataset.subset_per_class` would return, built without
    decoding the other images. Images are rendered at 32 px (cached, 215 MB for all 70,000); another
    resolution is an entry of the base's rows resized, written in chunks by ``workers`` processes
    (:func:`fedstyle.data.cache.decode_workers`).
    """
    resolution = check_build_options(NAME, resolution, BASE_RESOLUTION, per_class)
    workers = decode_workers(workers)
    files = find_source_files(data_root)
    recipe = {
        "name": NAME,
        "version": RECIPE_VERSION,
        "seed": int(seed),
        "resolution": BASE_RESOLUTION,
        "per_class": per_class,
        # Content digests, not paths: the same files anywhere give the same cache entry.
        "files": {key: file_digest(path) for key, path in sorted(files.items())},
    }
    base = cached_dataset(recipe, lambda _writer: build_fashion4(files, seed, BASE_RESOLUTION, per_class, workers),
                          progress, expected_bytes=FASHION_MNIST_COUNT * 3 * BASE_RESOLUTION**2)
    rows = [torch.arange(base.size(d)) for d in base.domains]
    if pick_per_class is not None:
        rows = pick_per_class_rows([base.labels[d] for d in base.domains], base.num_classes, pick_per_class)
    if resolution != BASE_RESOLUTION:
        # The same keys as a full build at this resolution had, plus the pick: old entries stay valid.
        recipe = {**recipe, "resolution": resolution, **({"pick_per_class": pick_per_class} if pick_per_class else {})}
        needed = sum(len(r) for r in rows) * 3 * resolution**2
        base = cached_dataset(recipe, lambda writer: build_resized(writer, base, rows, resolution, workers), progress,
                              expected_bytes=needed, too_big_fix="pass --per-class N or a smaller --resolution")
        if pick_per_class is not None:
            base.info.update(per_class=int(pick_per_class), per_class_seed=0)
        return base
    return base if pick_per_class is None else base.subset_per_class(pick_per_class)
