"""Image-folder datasets: ``root/<domain>/<class>/<image>``, named benchmarks or any folder.

Images (``.jpg``, ``.jpeg``, ``.png`` in any letter case) are decoded once with PIL, converted to
RGB (grey and palette images expanded, transparent images composited on white) and resized to
``resolution x resolution`` (default: the benchmark's; for the generic ``folder`` dataset the images' own
median size, capped at 224, so 32 px images are not upsampled 7x) with a plain antialiased bilinear resize
(no crop, so nothing of an off-centre object is lost; aspect ratios are not kept, as in DomainBed's
evaluation transform).
Within a domain, images are ordered by (class, file name); classes are sorted by name.

Domain folders of named benchmarks are matched ignoring case, spaces, ``-`` and ``_`` (so
``Real World`` is OfficeHome's ``Real_World``). A domain folder that holds only ``train`` /
``val`` / ``test`` folders (as Digits-DG ships) has its splits merged.

The cache recipe includes a fingerprint of the file list (relative paths, sizes, mtimes), so
adding, removing or touching an image rebuilds the cache.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import re
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from fedstyle.data.cache import ArrayWriter, DecodedArrays, cached_dataset, decode_workers
from fedstyle.data.contract import MIN_RESOLUTION, DomainDataset, check_build_options
from fedstyle.data.contract import pick_per_class as pick_per_class_rows
from fedstyle.errors import ConfigError, DataError
from fedstyle.registry import Registry

# Bump when decoding or resizing changes.
RECIPE_VERSION = 1
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
SPLIT_FOLDERS = {"train", "val", "test"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUT_HINT = "expected layout: ROOT/<domain>/<class>/<image>.jpg|.jpeg|.png"
DECODE_BLOCK = 512
#: a domain is cut so that each decode worker gets at least this many blocks: its last block leaves the
#: other workers idle, so that tail should be a small part of the domain's time (a 2,500-image domain in
#: 512-image blocks is 5 blocks, 3 rounds for 2 workers: 4 such domains decoded 1.52x faster on 2 cores, not 2x)
BLOCKS_PER_WORKER = 8
#: but never blocks smaller than this: each costs a job's round trip
MIN_DECODE_BLOCK = 32
#: raises PIL's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``) for images meant to be that large
MAX_PIXELS_ENV = "FEDSTYLE_MAX_IMAGE_PIXELS"
#: the largest default resolution of a folder of own images: the pretrained backbones' input size
MAX_DEFAULT_RESOLUTION = 224
#: images per domain whose size is read to choose the default resolution (headers only: no decoding)
SIZE_SAMPLE = 64
#: an explicit resolution this many times the images' own side warns: it costs compute and bytes, adds nothing
UPSCALE_WARNING = 2


@dataclass(frozen=True)
class FolderBenchmark:
    """A folder dataset's known shape: domain names (None: discovered), class count, defaults."""

    name: str
    description: str
    domains: tuple[str, ...] | None = None
    num_classes: int | None = None
    classes: tuple[str, ...] | None = None
    #: image side the images are resized to; None: their own size, capped (:func:`images_resolution`)
    resolution: int | None = 224
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    augment: str = "crop_flip"

    def root_hint(self) -> str:
        if self.domains is None:
            return (
                f"pass --data-root DIR with one folder per domain, each holding one folder per class "
                f"({LAYOUT_HINT})"
            )
        folders = " ".join(f"{d}/" for d in self.domains)
        return (
            f"pass --data-root DIR pointing at the {self.name.upper()} folder with {folders} "
            "(each holding one folder per class)"
        )


BENCHMARKS: Registry[FolderBenchmark] = Registry("folder benchmark")
for _benchmark in (
    FolderBenchmark(
        "pacs", "PACS (Li et al., 2017): 4 domains, 7 classes",
        ("art_painting", "cartoon", "photo", "sketch"), 7,
        ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"),
    ),
    FolderBenchmark(
        "officehome", "Office-Home (Venkateswara et al., 2017): 4 domains, 65 classes",
        ("Art", "Clipart", "Product", "Real_World"), 65,
    ),
    FolderBenchmark(
        "vlcs", "VLCS (Fang et al., 2013): 4 domains, 5 classes",
        ("Caltech101", "LabelMe", "SUN09", "VOC2007"), 5, ("bird", "car", "chair", "dog", "person"),
    ),
    FolderBenchmark(
        "domainnet", "DomainNet (Peng et al., 2019): 6 domains, 345 classes",
        ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"), 345,
    ),
    FolderBenchmark(
        "digits_dg", "Digits-DG (Zhou et al., 2020): 4 domains, 10 classes, 32 x 32",
        ("mnist", "mnist_m", "svhn", "syn"), 10, tuple(str(d) for d in range(10)),
        resolution=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), augment="crop",
    ),
    FolderBenchmark("folder", "any ROOT/<domain>/<class>/<image> tree (domains and classes from folder names)",
                    resolution=None),
):
    BENCHMARKS.add(_benchmark.name, _benchmark)


# ----------------------------------------------------------------------------- scanning


@dataclass
class DomainListing:
    """The image files of one domain folder, grouped by class name."""

    folder: Path
    files: dict[str, list[Path]] = field(default_factory=dict)
    ignored: int = 0


def _visible_entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as entries:
        visible = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    for entry in visible:
        try:
            entry.is_dir()
        except OSError as err:  # a symbolic link that loops (ELOOP) or cannot be followed
            raise DataError(f"{entry.path} cannot be followed ({err.strerror}); remove or fix that link") from None
    return visible


def _loose_key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).lower()


def find_domain_folders(root: Path, benchmark: FolderBenchmark) -> dict[str, Path]:
    """Map each domain name to its folder (discovered for the generic ``folder`` dataset)."""
    if not root.is_dir():
        raise DataError(f"dataset root {root} does not exist or is not a folder; {benchmark.root_hint()}")
    subfolders = {e.name: Path(e.path) for e in _visible_entries(root) if e.is_dir()}
    if benchmark.domains is None:
        if not subfolders:
            raise DataError(f"{root} has no domain folders; {LAYOUT_HINT}")
        return subfolders
    by_key = {_loose_key(name): path for name, path in subfolders.items()}
    folders, missing = {}, []
    for domain in benchmark.domains:
        path = subfolders.get(domain) or by_key.get(_loose_key(domain))
        if path is None:
            missing.append(domain)
        else:
            folders[domain] = path
    if missing:
        found = ", ".join(sorted(subfolders)) or "nothing"
        raise DataError(
            f"{benchmark.name}: domain folder(s) {', '.join(missing)} missing in {root} (found: {found}); "
            f"{benchmark.root_hint()}"
        )
    return folders


def _class_folders(domain_folder: Path) -> list[Path]:
    entries = _visible_entries(domain_folder)
    loose_images = [e.name for e in entries if e.is_file() and Path(e.name).suffix.lower() in IMAGE_SUFFIXES]
    if loose_images:
        raise DataError(
            f"{domain_folder} holds images directly ({loose_images[0]} ...); images must sit in one folder "
            f"per class; {LAYOUT_HINT}"
        )
    folders = [Path(e.path) for e in entries if e.is_dir()]
    if folders and all(f.name.lower() in SPLIT_FOLDERS for f in folders):
        return [c for split in folders for c in _class_folders(split)]
    return folders


def scan_domain(domain_folder: Path) -> DomainListing:
    """List the images of one domain; class folders of merged splits share their class name."""
    listing = DomainListing(domain_folder)
    for class_folder in _class_folders(domain_folder):
        images = listing.files.setdefault(class_folder.name, [])
        for entry in _visible_entries(class_folder):
            if entry.is_file() and Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                images.append(Path(entry.path))
            else:
                listing.ignored += 1
    if not listing.files:
        raise DataError(f"domain folder {domain_folder} has no class folders; {LAYOUT_HINT}")
    for class_name, images in listing.files.items():
        if not images:
            raise DataError(
                f"class folder {domain_folder / class_name} has no .jpg/.jpeg/.png images; "
                "add images or remove the folder from every domain"
            )
        images.sort(key=lambda p: (p.name, str(p)))
    return listing


def check_same_classes(listings: dict[str, DomainListing]) -> list[str]:
    """The sorted class list shared by all domains, or a DataError naming the differences."""
    reference_domain = next(iter(listings))
    reference = set(listings[reference_domain].files)
    for domain, listing in listings.items():
        classes = set(listing.files)
        if classes != reference:
            missing, extra = sorted(reference - classes), sorted(classes - reference)
            raise DataError(
                f"domain {domain!r} ({listing.folder}) has different classes than {reference_domain!r}: "
                f"missing {missing or 'none'}, extra {extra or 'none'}; every domain needs the same class folders"
            )
    return sorted(reference)


def sampled_files(listing: DomainListing, count: int) -> list[Path]:
    """Up to ``count`` files of a domain, spread evenly over its classes' files in order."""
    files = [p for c in sorted(listing.files) for p in listing.files[c]]
    step = max(1, len(files) // count)
    return files[::step][:count]


def image_side(path: Path) -> int | None:
    """The longer side of an image from its header (PIL reads no pixels), None when unreadable."""
    try:
        # a header read only: a very large image is said once, in one line, when it is decoded (not here)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                return max(image.size)
    except Exception:  # PIL raises many types; unreadable files are reported by `fedstyle data check`
        return None


def images_resolution(listings: dict[str, DomainListing]) -> int | None:
    """The median longer side of a sample of the images, capped at :data:`MAX_DEFAULT_RESOLUTION`: a folder
    of 32 px images trains at 32 px (and with ``--backbone auto``, the small ConvNet), not upsampled to 224.
    None when no sampled image could be read."""
    sides = sorted(side for listing in listings.values() for path in sampled_files(listing, SIZE_SAMPLE)
                   if (side := image_side(path)) is not None)
    if not sides:
        return None
    return min(sides[len(sides) // 2], MAX_DEFAULT_RESOLUTION)


def file_fingerprint(root: Path, listings: dict[str, DomainListing]) -> str:
    """SHA-256 over every image's relative path, size and modification time."""
    digest = hashlib.sha256()
    for domain, listing in listings.items():
        for class_name in sorted(listing.files):
            for path in listing.files[class_name]:
                stat = path.stat()
                digest.update(f"{domain}\0{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


# ----------------------------------------------------------------------------- decoding


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB version of any PIL image; transparency is composited over white."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    if image.mode.startswith("I") or image.mode == "F":
        # 16-bit / integer / float grey: PIL's convert would clip everything above 255 to white.
        values = np.asarray(image, dtype=np.float64)
        scale = 257.0 if image.mode.startswith("I") and values.max(initial=0) > 255 else 1.0
        return Image.fromarray(np.clip(values / scale, 0, 255).astype(np.uint8), "L").convert("RGB")
    return image.convert("RGB")


def decode_image(path: Path | BinaryIO, resolution: int,
                 on_large: Callable[[tuple[int, int]], None] | None = None) -> np.ndarray:
    """Decode ``path`` (a file name, or an open binary file such as the bytes of a parquet row) to uint8
    (resolution, resolution, 3). ``on_large(size)`` is called for an image above PIL's decompression-bomb
    limit (``Image.MAX_IMAGE_PIXELS``) that PIL still decodes (up to twice the limit)."""
    with Image.open(path) as image:
        limit = Image.MAX_IMAGE_PIXELS
        if on_large is not None and limit and image.size[0] * image.size[1] > limit:
            on_large(image.size)
        # JPEG can decode at 1/2, 1/4 or 1/8 scale directly; draft keeps both sides >= resolution.
        image.draft("RGB", (resolution, resolution))
        image.load()
        rgb = to_rgb(image)
    if rgb.size != (resolution, resolution):
        rgb = rgb.resize((resolution, resolution), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def pixel_limit() -> int | None:
    """PIL's decompression-bomb limit, raised by ``$FEDSTYLE_MAX_IMAGE_PIXELS`` where set (PIL warns above
    the limit and refuses above twice it; an image that large is more often a mistake than a photo)."""
    given = os.environ.get(MAX_PIXELS_ENV)
    if given:
        if not given.isdigit() or int(given) <= 0:
            raise ConfigError(f"{MAX_PIXELS_ENV}={given!r} is not a pixel count; give a whole number such as "
                              "200000000, or unset it")
        Image.MAX_IMAGE_PIXELS = int(given)
    return Image.MAX_IMAGE_PIXELS


def _decode_or_error(path: Path, resolution: int) -> tuple[np.ndarray | str, tuple[int, int] | None]:
    """(pixels or the reason they cannot be read, the size of an image above PIL's limit or None)."""
    large = []
    try:
        return decode_image(path, resolution, large.append), (large[0] if large else None)
    except Image.DecompressionBombError as err:
        return f"{type(err).__name__}: {err}; if images that large are intended, set {MAX_PIXELS_ENV}=N", None
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
        return f"{type(err).__name__}: {err}", None


def _pixels(count: int) -> str:
    return f"{count / 1e6:.1f} Mpixel" if count >= 100_000 else f"{count:,} pixels"


def _say_large(item, size: tuple[int, int], limit: int) -> None:
    print(f"fedstyle: image {item} is {size[0]}x{size[1]} = {_pixels(size[0] * size[1])}, above PIL's "
          f"decompression-bomb limit of {_pixels(limit)}; decoded (if images that large are intended, set "
          f"{MAX_PIXELS_ENV}=N above it to silence this)", file=sys.stderr)


def bad_image_error(path: Path | str, reason: str) -> DataError:
    return DataError(
        f"cannot read image {path} ({reason}); replace or delete it, or pass skip_bad_images=True "
        "(CLI: --skip-bad-images) to leave unreadable images out"
    )


#: decodes blocks of images (sequences of what :func:`decode_image` opens) to lists of arrays or error strings
BlockDecoder = Callable[[Iterable[Sequence]], Iterator[list]]


def _decode_block(block: Sequence, resolution: int) -> list[tuple[np.ndarray | str, tuple[int, int] | None]]:
    """A block of images decoded in order, each as :func:`_decode_or_error` gives it."""
    return [_decode_or_error(item, resolution) for item in block]


def _decode_rows(block: Sequence, resolution: int
                 ) -> tuple[np.ndarray, tuple[list[tuple[int, str]], list[tuple[int, tuple[int, int]]]]]:
    """A block decoded to (n, 3, resolution, resolution) rows, an unreadable image's row left 0, with the
    (offset, reason) of those and the (offset, size) of images above PIL's limit (a worker process's job: it
    writes the rows itself, ``ChunkedImages.fill``, and the parent says what went wrong)."""
    rows = np.zeros((len(block), 3, resolution, resolution), dtype=np.uint8)
    errors, larges = [], []
    with warnings.catch_warnings():  # this process's own: the parent names the large files in one line each
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        decoded = _decode_block(block, resolution)
    for offset, (result, large) in enumerate(decoded):
        if large is not None:
            larges.append((offset, large))
        if isinstance(result, str):
            errors.append((offset, result))
        else:
            rows[offset] = result.transpose(2, 0, 1)
    return rows, (errors, larges)


class ProcessDecoder:
    """Blocks decoded in ``workers`` processes that write their rows into the cache file themselves
    (:meth:`fedstyle.data.cache.ChunkedImages.fill`): PIL's resize and colour conversion hold the GIL, so
    threads do not scale past one core, and no decoded image crosses a pipe."""

    def __init__(self, workers: int, resolution: int):
        self.workers, self.resolution = workers, resolution


def thread_decoder(executor: ThreadPoolExecutor, resolution: int) -> BlockDecoder:
    """Blocks decoded by ``executor``'s threads, one block at a time (for sources that cannot be sent to
    another process, such as open files of a parquet table)."""
    return lambda blocks: (list(executor.map(lambda item: _decode_or_error(item, resolution), block))
                           for block in blocks)


def decode_block_size(count: int, workers: int) -> int:
    """Images per decode job for a domain of ``count`` images: :data:`DECODE_BLOCK`, or less when ``workers``
    processes would otherwise get fewer than :data:`BLOCKS_PER_WORKER` blocks each (not below
    :data:`MIN_DECODE_BLOCK`). The bytes written do not depend on it: each image is decoded on its own."""
    if workers <= 1:
        return DECODE_BLOCK
    even_share = -(-count // (BLOCKS_PER_WORKER * workers))
    return min(DECODE_BLOCK, max(MIN_DECODE_BLOCK, even_share))


def decode_domain(
    writer: ArrayWriter,
    domain_index: int,
    paths: Sequence[Path | BinaryIO],
    resolution: int,
    skip_bad_images: bool,
    decode_blocks: "ProcessDecoder | BlockDecoder | ThreadPoolExecutor",
    bar: tqdm,
) -> tuple[np.ndarray, list[int], list[list[str]]]:
    """Decode into the cache file of one domain, a block at a time (memory bounded by a few blocks);
    returns (images, kept indices, [file, reason]s).

    ``paths`` may be any sequence of what :func:`decode_image` opens, read a block at a time (a lazy
    sequence keeps only one block of encoded images in memory); ``str(item)`` names an item in errors.
    ``decode_blocks``: a :class:`ProcessDecoder` or :func:`thread_decoder` (an executor: its threads).
    """
    if isinstance(decode_blocks, ThreadPoolExecutor):
        decode_blocks = thread_decoder(decode_blocks, resolution)
    out = writer.image_rows(domain_index, len(paths), resolution, resolution)
    kept, bad = [], []
    limit = pixel_limit()
    per_block = decode_block_size(len(paths), decode_blocks.workers if isinstance(decode_blocks, ProcessDecoder) else 1)
    blocks = (paths[start : start + per_block] for start in range(0, len(paths), per_block))

    def note(index: int, reason: str | None, large: tuple[int, int] | None) -> None:
        if large is not None:
            _say_large(paths[index], large, limit)
        if reason is None:
            kept.append(index)
        elif not skip_bad_images:
            raise bad_image_error(paths[index], reason)
        else:
            bad.append([str(paths[index]), reason])

    try:
        # PIL's raw warning is silenced here (and in worker processes) and said in one line naming the file
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            if isinstance(decode_blocks, ProcessDecoder):
                jobs = ((partial(_decode_rows, resolution=resolution), block, len(block)) for block in blocks)
                for number, (errors, larges) in enumerate(out.fill(jobs, decode_blocks.workers)):
                    start, failed, big = number * per_block, dict(errors), dict(larges)
                    size = min(per_block, len(paths) - start)
                    for offset in range(size):
                        note(start + offset, failed.get(offset), big.get(offset))
                    bar.update(size)
            else:
                for number, results in enumerate(decode_blocks(blocks)):
                    start = number * per_block
                    rows = np.zeros((len(results), 3, resolution, resolution), dtype=np.uint8)  # a bad row stays 0
                    for offset, (result, large) in enumerate(results):
                        if not isinstance(result, str):
                            rows[offset] = result.transpose(2, 0, 1)
                        note(start + offset, result if isinstance(result, str) else None, large)
                    out.append(rows)
                    bar.update(len(results))
        images = writer.finish(domain_index, out)
    finally:
        out.discard()
    if bad:
        images = writer.keep_images(domain_index, np.asarray(kept, dtype=np.int64))
    return images, kept, bad


def build_folder_dataset(
    writer: ArrayWriter,
    benchmark: FolderBenchmark,
    root: Path,
    listings: dict[str, DomainListing],
    classes: list[str],
    resolution: int,
    skip_bad_images: bool,
    progress: bool,
    workers: int = 1,
) -> DecodedArrays:
    total = sum(len(files) for listing in listings.values() for files in listing.files.values())
    images, labels, bad_images = {}, {}, []
    with tqdm(total=total, desc=f"decoding {benchmark.name}", unit="img", disable=not progress) as bar:
        for domain_index, (domain, listing) in enumerate(listings.items()):
            paths = [p for c in classes for p in listing.files[c]]
            domain_labels = np.repeat(np.arange(len(classes)), [len(listing.files[c]) for c in classes])
            images[domain], kept, bad = decode_domain(
                writer, domain_index, paths, resolution, skip_bad_images, ProcessDecoder(workers, resolution), bar
            )
            labels[domain] = domain_labels[kept]
            bad_images += bad
            if len(kept) == 0:
                raise DataError(f"no image of domain {domain!r} ({listing.folder}) could be read")
            check_no_class_emptied(domain, domain_labels, labels[domain], classes, listing.folder)
    return DecodedArrays(
        domains=list(listings),
        classes=classes,
        images=images,
        labels=labels,
        mean=benchmark.mean,
        std=benchmark.std,
        augment=benchmark.augment,
        info={
            "root": str(root),
            "domain_folders": {d: str(listing.folder) for d, listing in listings.items()},
            "skipped_images": len(bad_images),
            "bad_images": bad_images,
            "ignored_files": sum(listing.ignored for listing in listings.values()),
        },
    )


def load_folder_benchmark(
    benchmark: FolderBenchmark | str,
    data_root: str | os.PathLike | None,
    resolution: int | None = None,
    skip_bad_images: bool = False,
    progress: bool = True,
    official_splits: bool = True,
    pick_per_class: int | None = None,
    workers: int | None = None,
) -> DomainDataset:
    """Scan, decode (once, cached) and return a folder dataset, with the benchmark's official split lists
    (PACS, DomainNet: :mod:`fedstyle.data.split_lists`) when they are present and ``official_splits``.

    ``pick_per_class`` (a run's ``--per-class``): only the images :meth:`DomainDataset.subset_per_class`
    would keep are decoded, into an entry of their own (picked from the listing's labels, so an unreadable
    image skipped by ``skip_bad_images`` is one fewer, not replaced). ``workers``: decoding processes
    (:func:`fedstyle.data.cache.decode_workers`).
    """
    if isinstance(benchmark, str):
        benchmark = BENCHMARKS.get(benchmark)
    if data_root is None:
        raise ConfigError(f"{benchmark.name} needs its images: {benchmark.root_hint()}")
    root = Path(data_root).expanduser().resolve()
    folders = find_domain_folders(root, benchmark)
    listings = {domain: scan_domain(folder) for domain, folder in folders.items()}
    classes = check_same_classes(listings)
    resolution = _folder_resolution(benchmark, resolution, listings)
    if benchmark.num_classes is not None and len(classes) != benchmark.num_classes:
        warnings.warn(
            f"{benchmark.name} has {benchmark.num_classes} classes but {root} holds {len(classes)}; "
            "using the class folders found",
            stacklevel=2,
        )
    workers = decode_workers(workers)
    all_files = {d: listing.files for d, listing in listings.items()}
    recipe = {
        "name": benchmark.name,
        "version": RECIPE_VERSION,
        "resolution": resolution,
        "domains": {d: str(f.relative_to(root)) for d, f in folders.items()},
        "classes": classes,
        "files": file_fingerprint(root, listings),
    }
    left_out: set[str] = set()
    if pick_per_class is not None:
        listings, left_out = picked_listings(listings, classes, pick_per_class)
        recipe["pick_per_class"] = int(pick_per_class)
    count = sum(len(files) for listing in listings.values() for files in listing.files.values())
    dataset = cached_dataset(
        recipe,
        lambda writer: build_folder_dataset(
            writer, benchmark, root, listings, classes, resolution, skip_bad_images, progress, workers
        ),
        progress,
        expected_bytes=count * 3 * resolution**2,
        too_big_fix="pass --per-class N or a smaller --resolution",
    )
    if pick_per_class is not None:
        dataset.info.update(per_class=int(pick_per_class), per_class_seed=0)
    # `data check` reads the generic layout (a named benchmark's root may hold split lists it does not know)
    listed_by = f"fedstyle data check {shlex.quote(str(root))}" if benchmark.name == "folder" else ""
    check_skipped(dataset, benchmark.name, skip_bad_images, listed_by=listed_by)
    if official_splits:
        from fedstyle.data.split_lists import attach_split_lists

        dataset = attach_split_lists(dataset, benchmark.name, root, all_files, classes, left_out)
    return dataset


def picked_listings(listings: dict[str, DomainListing], classes: list[str], per_class: int
                    ) -> tuple[dict[str, DomainListing], set[str]]:
    """The listings reduced to the seeded per-class pick of :func:`fedstyle.data.contract.pick_per_class`
    (made from the listing's labels, in decoding order), and the paths left out."""
    counts = {d: [len(listing.files[c]) for c in classes] for d, listing in listings.items()}
    labels = [torch.from_numpy(np.repeat(np.arange(len(classes)), counts[d])) for d in listings]
    picks = pick_per_class_rows(labels, len(classes), per_class)
    reduced, left_out = {}, set()
    for (domain, listing), keep in zip(listings.items(), picks):
        ordered = [p for c in classes for p in listing.files[c]]
        chosen = set(keep.tolist())
        files = {c: [] for c in classes}
        for row, (path, label) in enumerate(zip(ordered, labels[len(reduced)].tolist())):
            if row in chosen:
                files[classes[label]].append(path)
            else:
                left_out.add(str(path))
        reduced[domain] = DomainListing(listing.folder, files, listing.ignored)
    return reduced, left_out


def _folder_resolution(benchmark: FolderBenchmark, resolution: int | None,
                       listings: dict[str, DomainListing]) -> int:
    """The resolution to decode at: the one given, the benchmark's, or (own images) the images' own size."""
    if resolution is None and benchmark.resolution is not None:
        return check_build_options(benchmark.name, None, benchmark.resolution)
    own = images_resolution(listings)
    if resolution is None:
        return check_build_options(benchmark.name, None, max(own or MAX_DEFAULT_RESOLUTION, MIN_RESOLUTION))
    resolution = check_build_options(benchmark.name, resolution, resolution)
    if own is not None and resolution >= UPSCALE_WARNING * own and benchmark.resolution is None:
        warnings.warn(f"{benchmark.name}: --resolution {resolution} upsamples {own} px images {resolution / own:.0g}x "
                      f"per side, which costs compute and traffic and adds no detail; --resolution {own} "
                      f"(with --backbone auto) trains at their own size", stacklevel=3)
    return resolution


def check_no_class_emptied(domain: str, before: np.ndarray, after: np.ndarray, classes: Sequence[str],
                           where) -> None:
    """A DataError when skipping unreadable images took every image of a class out of ``domain`` (labels
    ``before`` and ``after`` skipping): the class sets would then differ across domains."""
    lost = sorted(set(np.unique(before).tolist()) - set(np.unique(after).tolist()))
    if lost:
        raise DataError(f"every image of class {classes[lost[0]]!r} in domain {domain!r} is unreadable ({where}); "
                        "replace them, or remove that class from every domain (a class must be in every domain)")


def check_skipped(dataset: DomainDataset, name: str, skip_bad_images: bool, listed_by: str = "") -> None:
    """Refuse a cache built by a run that skipped unreadable images unless skipping now; warn when skipping,
    naming the first few (``listed_by``: the command that lists them all, for the warning)."""
    skipped = dataset.info.get("skipped_images", 0)
    if skipped and not skip_bad_images:
        # The cache was built by an earlier run that skipped them; be as strict as a fresh decode.
        raise bad_image_error(*dataset.info["bad_images"][0])
    if skipped:
        shown = "; ".join(f"{path} ({reason})" for path, reason in dataset.info["bad_images"][:3])
        listing = f" (`{listed_by}` lists them all)" if listed_by else ""
        warnings.warn(
            f"{name}: skipped {skipped} unreadable image(s): {shown}{'; ...' if skipped > 3 else ''}{listing}",
            stacklevel=3,
        )
