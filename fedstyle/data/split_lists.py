"""Official split lists of folder benchmarks: PACS's k-fold files and DomainNet's train/test lists.

PACS (Li et al., ICCV 2017) ships per domain ``<domain>_train_kfold.txt``, ``<domain>_crossval_kfold.txt``
and ``<domain>_test_kfold.txt`` (the test list is the whole domain: train + crossval); the papers train
a source domain on its train list, select on its crossval list and test a target on its test list.
DomainNet (Peng et al., ICCV 2019) ships ``<domain>_train.txt`` and ``<domain>_test.txt``; sources train
on the train list (validation: a seeded share of it) and targets are tested on the test list.

Each line is ``<path> [label]`` with ``path`` ending in ``<domain>/<class>/<file>`` (any prefix: the lists
of some repositories hold absolute paths); a line is matched to an image by its class folder and file
name within the domain's folder. The label column (1-based in PACS, 0-based in DomainNet) is not read:
a class is the index of its folder name among the sorted class names, as DomainBed numbers them. For
DomainNet this differs from the lists' own ids for 328 of the 345 classes (the lists number classes in
another order); the images and their class names are the same, only the numbering differs.

The lists are looked for in the data root, its parent, and their ``splits`` / ``pacs_label`` /
``txt_lists`` / ``correct_txt_lists`` subfolders (the PACS release keeps them in ``pacs_label/`` beside
``pacs_data/``; several FedDG repositories keep corrected PACS lists in ``correct_txt_lists/``).
DomainBed's PACS archive (``fedstyle data download pacs``) holds no lists: without them, PACS's domains
are split by the seeded rule, and ``describe_split_source`` says so.

``fedstyle data download domainnet`` deletes DomainBed's 9,431 duplicate images
(``download/lists/domain_net_duplicates.txt``), which the official lists still name: a line naming one
of those images, when it is absent, is skipped rather than refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import DataError

LIST_FOLDERS = ("", "splits", "pacs_label", "txt_lists", "correct_txt_lists")
IGNORE_HINT = "or pass --no-official-splits (Python: official_splits=False) to split domains by the seeded rule"


@dataclass(frozen=True)
class SplitListFormat:
    """The file names of one benchmark's lists: split name -> pattern with ``{domain}``."""

    files: dict[str, str]
    required: tuple[str, ...]
    #: a list shipped in ``download/lists/`` of images the download deletes: their lines are skipped when absent
    removed: str = ""


SPLIT_LIST_FORMATS = {
    "pacs": SplitListFormat(
        {"train": "{domain}_train_kfold.txt", "val": "{domain}_crossval_kfold.txt", "test": "{domain}_test_kfold.txt"},
        required=("train", "val"),
    ),
    "domainnet": SplitListFormat({"train": "{domain}_train.txt", "test": "{domain}_test.txt"},
                                 required=("train", "test"), removed="domain_net_duplicates.txt"),
}


def find_split_lists(benchmark: str, root: Path, domains: list[str]) -> dict[str, dict[str, Path]]:
    """domain -> {split name -> list file} of the first folder holding lists for any domain ({} if none).

    A domain with some but not all required lists, or with none while other domains have theirs, is an error.
    """
    fmt = SPLIT_LIST_FORMATS.get(benchmark)
    if fmt is None:
        return {}
    for base in (root, root.parent):
        for sub in LIST_FOLDERS:
            folder = base / sub
            found = {d: {s: folder / p.format(domain=d) for s, p in fmt.files.items()} for d in domains}
            found = {d: {s: f for s, f in files.items() if f.is_file()} for d, files in found.items()}
            if any(found.values()):
                return _complete(benchmark, folder, found, fmt)
    return {}


def _complete(benchmark: str, folder: Path, found: dict[str, dict[str, Path]], fmt: SplitListFormat
              ) -> dict[str, dict[str, Path]]:
    for domain, files in found.items():
        missing = [fmt.files[s].format(domain=domain) for s in fmt.required if s not in files]
        if missing:
            raise DataError(f"{benchmark}: official split lists in {folder} lack {', '.join(missing)}; add the "
                            f"release's file(s) {IGNORE_HINT}")
    return found


def read_split_list(path: Path) -> list[tuple[str, str]]:
    """The (class folder, file name) of every line of a list file."""
    entries = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()[0].replace("\\", "/").split("/")
        if len(parts) < 2:
            raise DataError(f"{path}:{number}: {line.strip()!r} is not '<domain>/<class>/<file> [label]'; "
                            f"replace the file with the release's {IGNORE_HINT}")
        entries.append((parts[-2], parts[-1]))
    return entries


def shipped_list(name: str) -> list[str]:
    """The lines of a list shipped in ``fedstyle/data/download/lists/`` (package data; its README says whence)."""
    from importlib.resources import files

    text = files("fedstyle.data").joinpath("download", "lists", name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def removed_images(benchmark: str, domain: str) -> set[tuple[str, str]]:
    """(class folder, file name) of ``domain``'s images that ``fedstyle data download`` deletes (see above)."""
    fmt = SPLIT_LIST_FORMATS.get(benchmark)
    if fmt is None or not fmt.removed:
        return set()
    parts = (line.split("/") for line in shipped_list(fmt.removed))
    return {(p[-2], p[-1]) for p in parts if len(p) >= 3 and p[-3] == domain}


def split_indices(benchmark: str, domain: str, files: dict[str, Path], ordered: list[Path],
                  dropped: set[str]) -> dict[str, torch.Tensor]:
    """Each list of ``domain`` as sorted indices into its decoded images.

    ``ordered``: the domain's image files in decoding order; ``dropped``: the files left out as unreadable
    (their lines are skipped). A listed image the folder does not hold is an error, unless the download
    deletes it (:func:`removed_images`: its line is skipped).
    """
    position, row = {}, 0
    for path in ordered:
        if str(path) in dropped:
            position[(path.parent.name, path.name)] = None
            continue
        position[(path.parent.name, path.name)] = row
        row += 1
    out = {}
    for split_name, list_file in files.items():
        entries = read_split_list(list_file)
        if any(e not in position for e in entries):
            removed = removed_images(benchmark, domain)
            entries = [e for e in entries if e in position or e not in removed]
        absent = [e for e in entries if e not in position]
        if absent:
            raise DataError(f"{benchmark}: {len(absent)} image(s) of {list_file.name} are not in the {domain} folder "
                            f"(first: {'/'.join(absent[0])}); use the images the lists were made for {IGNORE_HINT}")
        index = np.unique(np.array([position[e] for e in entries if position[e] is not None], dtype=np.int64))
        out[split_name] = torch.from_numpy(index)
    return out


def skipped_paths(info: dict, root: Path) -> set[str]:
    """The images the decoding left out (``info['bad_images']``) as paths under ``root``, the folder read now.

    A cache entry's key holds paths relative to the dataset folder, so one entry serves every copy of a tree
    (moved, downloaded again, unpacked elsewhere) and its ``bad_images`` name files under the folder it was
    built from (``info['root']``); compared as they are, they matched nothing and every split was shifted.
    """
    built = Path(info["root"]) if info.get("root") else None
    out = set()
    for path, _ in info.get("bad_images", []):
        if built is not None and Path(path).is_relative_to(built):
            path = str(root / Path(path).relative_to(built))
        out.add(path)
    return out


def attach_split_lists(dataset: DomainDataset, benchmark: str, root: Path, files: dict[str, dict[str, list[Path]]],
                       classes: list[str]) -> DomainDataset:
    """``dataset`` with the official splits of the lists found for ``benchmark`` near ``root`` (unchanged if none).

    ``files``: domain -> class -> image files, as scanned (the decoding order is class by class).
    """
    lists = find_split_lists(benchmark, root, dataset.domains)
    if not lists:
        return dataset
    dropped = skipped_paths(dataset.info, root)
    splits = {d: split_indices(benchmark, d, lists[d], [p for c in classes for p in files[d][c]], dropped)
              for d in lists}
    out = dataset.with_splits(splits)
    out.info = {**dataset.info, "official_splits": {d: {s: str(f) for s, f in lists[d].items()} for d in lists}}
    return out


def describe_split_source(benchmark: str, root: Path | None, domains: list[str] | None,
                          official_splits: bool = True) -> str:
    """Which split a benchmark's runs use: its official lists (and where), or the seeded rule.

    Looks for the lists as the loader does (:func:`find_split_lists`) without decoding an image, so
    ``reproduce --dry-run`` can say it; where a benchmark has lists and none are found, says where to
    put them. ``root``: the benchmark's folder (None: not known here); ``domains``: its domain folders
    (None: not a folder benchmark, its splits are known once it is read)."""
    seeded = "seeded per-class split of each domain (--val-fraction)"
    fmt = SPLIT_LIST_FORMATS.get(benchmark)
    if not official_splits:
        return f"{seeded}, official lists off (--no-official-splits)"
    if domains is None:  # camelyon17's metadata, a Hub dataset's splits
        return f"{benchmark}'s own splits where it has them, else the {seeded}"
    if fmt is None:
        return f"{seeded}; {benchmark} has no official split lists"
    if root is None:
        return f"official {benchmark} lists where the data folder holds them, else the {seeded}"
    found = find_split_lists(benchmark, root, list(domains))
    if found:
        folders = sorted({str(path.parent) for files in found.values() for path in files.values()})
        return f"official {benchmark} lists from {', '.join(folders)}"
    names = ", ".join(fmt.files[s].format(domain="<domain>") for s in fmt.files)
    return (f"{seeded}: no official {benchmark} lists found; to use them put {names} for each domain in "
            f"{root / 'splits'} (or {root} or {root / 'correct_txt_lists'})")
