"""``fedstyle data check DIR``: what a folder of own images holds, read before any training.

A run on a folder of images decodes every image once and then trains for minutes or hours; a class folder
missing from one domain, a few unreadable files or 32 px images about to be upsampled to 224 px are cheaper to
see first. :func:`check_folder` scans ``DIR/<domain>/<class>/<image>`` the way ``--dataset folder`` reads it
(:mod:`fedstyle.data.folder`), counts the images per domain and class, reads every image's size from its header
and decodes each one (at a reduced JPEG draft size) to find the unreadable ones; :func:`report_lines` prints it.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image
from tqdm.auto import tqdm

from fedstyle.data.contract import MIN_RESOLUTION
from fedstyle.data.folder import (BENCHMARKS, MAX_DEFAULT_RESOLUTION, find_domain_folders, scan_domain,
                                  to_rgb)

#: classes listed one per row; more are summarised in one line (DomainNet has 345)
MAX_CLASS_ROWS = 30
#: unreadable files named one per line; more are counted
MAX_NAMED_FILES = 10
#: the side an image is decoded at to prove it readable (JPEG decodes at 1/8 scale directly)
PROBE_SIDE = 32


@dataclass
class FolderCheck:
    """What :func:`check_folder` found."""

    root: Path
    #: domain -> class -> number of image files
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    #: (width, height) -> number of readable images of that size
    sizes: Counter = field(default_factory=Counter)
    #: (file relative to root, the reason) of each image that could not be decoded
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    #: files that are not images (.jpg, .jpeg, .png) inside class folders
    ignored: int = 0

    @property
    def classes(self) -> list[str]:
        return sorted({c for per_class in self.counts.values() for c in per_class})

    @property
    def images(self) -> int:
        return sum(n for per_class in self.counts.values() for n in per_class.values())

    def missing_classes(self) -> dict[str, list[str]]:
        """domain -> the classes other domains have and it lacks (``--dataset folder`` refuses these)."""
        every = self.classes
        return {d: [c for c in every if c not in per_class] for d, per_class in self.counts.items()
                if len(per_class) < len(every)}

    def resolution(self) -> int:
        """The resolution ``--dataset folder`` defaults to: the median longer side, capped at 224."""
        sides = sorted(side for (w, h), n in self.sizes.items() for side in [max(w, h)] * n)
        if not sides:
            return MAX_DEFAULT_RESOLUTION
        return max(MIN_RESOLUTION, min(sides[len(sides) // 2], MAX_DEFAULT_RESOLUTION))

    def all_unreadable(self) -> list[tuple[str, str]]:
        """(domain, class) whose every image is unreadable: ``--skip-bad-images`` would empty them, and a run
        refuses a class missing from a domain. A file is DOMAIN/[SPLIT/]CLASS/IMAGE below the root."""
        bad = Counter((Path(name).parts[0], Path(name).parts[-2]) for name, _ in self.unreadable)
        return [(d, c) for d, per_class in self.counts.items() for c, n in per_class.items()
                if n and bad.get((d, c), 0) >= n]

    def too_few(self) -> list[str]:
        """Why no run can train on the folder at all: fewer than 2 domains or 2 classes."""
        problems = []
        if len(self.counts) < 2:
            problems.append(f"{len(self.counts)} domain: a run needs at least 2 (one or more to train on, one held "
                            "out); add domain folders")
        if len(self.classes) < 2:
            problems.append(f"{len(self.classes)} class: a classifier needs at least 2; add class folders")
        return problems

    @property
    def ok(self) -> bool:
        """Whether ``fedstyle run --dataset folder`` would read the folder as it is."""
        return not self.unreadable and not self.missing_classes() and not self.too_few()


def _probe(path: Path) -> tuple[int, int] | str:
    """The image's (width, height), or why it cannot be decoded."""
    try:
        with Image.open(path) as image:
            size = image.size
            image.draft("RGB", (PROBE_SIDE, PROBE_SIDE))
            image.load()
            to_rgb(image)
        return size
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else 'cannot decode'}"


def check_folder(root: str | os.PathLike, progress: bool = False) -> FolderCheck:
    """Scan and probe every image of ``root`` (``root/<domain>/<class>/<image>``); a layout error (no domain
    folders, images outside class folders) is raised as ``--dataset folder`` raises it."""
    root = Path(root).expanduser().resolve()
    folders = find_domain_folders(root, BENCHMARKS.get("folder"))
    check = FolderCheck(root)
    paths: list[Path] = []
    for domain, folder in folders.items():
        listing = scan_domain(folder)
        check.counts[domain] = {c: len(files) for c, files in sorted(listing.files.items())}
        check.ignored += listing.ignored
        paths += [p for c in sorted(listing.files) for p in listing.files[c]]
    workers = max(1, min(8, os.cpu_count() or 1))  # PIL releases the GIL while decoding
    with ThreadPoolExecutor(workers) as executor, tqdm(total=len(paths), desc="checking images", unit="img",
                                                       disable=not progress) as bar:
        for path, result in zip(paths, executor.map(_probe, paths)):
            if isinstance(result, str):
                check.unreadable.append((str(path.relative_to(root)), result))
            else:
                check.sizes[result] += 1
            bar.update(1)
    return check


def _table(check: FolderCheck) -> list[str]:
    """Classes as rows, domains as columns, a total row."""
    domains = list(check.counts)
    classes = check.classes
    shown = classes[:MAX_CLASS_ROWS]
    rows = [["class", *domains]]
    rows += [[c, *(str(check.counts[d].get(c, 0)) for d in domains)] for c in shown]
    if len(classes) > len(shown):
        rest = classes[len(shown):]
        rows.append([f"({len(rest)} more)", *(str(sum(check.counts[d].get(c, 0) for c in rest)) for d in domains)])
    rows.append(["total", *(str(sum(check.counts[d].values())) for d in domains)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))])
            for row in rows]


def _sizes(check: FolderCheck) -> str:
    if not check.sizes:
        return "image sizes: none readable"
    common = ", ".join(f"{w}x{h} ({n})" for (w, h), n in check.sizes.most_common(3))
    if len(check.sizes) <= 3:
        return f"image sizes: {common}"
    sides = [max(size) for size in check.sizes]
    return f"image sizes: {len(check.sizes)} sizes, longer side {min(sides)} to {max(sides)} px; most common {common}"


def report_lines(check: FolderCheck) -> list[str]:
    """The check as lines for the terminal: counts, sizes, unreadable files, and what a run would do."""
    ignored = f"; {check.ignored} other files ignored" if check.ignored else ""
    lines = [f"{check.root}: {len(check.counts)} domains, {len(check.classes)} classes, {check.images} images"
             f"{ignored}", *_table(check), _sizes(check)]
    lines += [f"too few: {problem}" for problem in check.too_few()]
    for domain, classes in check.missing_classes().items():
        lines.append(f"missing: domain {domain} has no folder for class(es) {', '.join(classes)}; every domain needs "
                     "the same class folders")
    if check.unreadable:
        lines.append(f"unreadable: {len(check.unreadable)} file(s); replace or delete them, or run with "
                     "--skip-bad-images to leave them out")
        lines += [f"  {name}: {reason}" for name, reason in check.unreadable[:MAX_NAMED_FILES]]
        if len(check.unreadable) > MAX_NAMED_FILES:
            lines.append(f"  ... and {len(check.unreadable) - MAX_NAMED_FILES} more")
        lines += [f"  every image of class {c} in domain {d} is unreadable: --skip-bad-images would leave the class "
                  "out of that domain, which a run refuses" for d, c in check.all_unreadable()]
    else:
        lines.append("unreadable: none")
    resolution = check.resolution()
    lines.append(f"--dataset folder --data-root {check.root} trains at {resolution} px (the images' median size, "
                 f"at most {MAX_DEFAULT_RESOLUTION}; --resolution N to change it)")
    return lines
