"""Camelyon17-WILDS (Koh et al., ICML 2021; Bandi et al., 2018) read from the WILDS layout, hospitals as domains.

Layout (what ``wilds.get_dataset("camelyon17", download=True)`` leaves, and the archive holds)::

    ROOT/camelyon17_v1.0/metadata.csv      ,patient,node,x_coord,y_coord,tumor,slide,center,split
    ROOT/camelyon17_v1.0/patches/patient_004_node_4/patch_patient_004_node_4_x_3328_y_21792.png

Each row is one 96 x 96 patch; ``tumor`` (0/1) is the label (``normal`` / ``tumor``: the central 32 x 32
region holds tumour tissue), ``center`` (0-4) the hospital: domain ``hospital_<center>``. Patient ids keep
their zero padding, as WILDS reads them (``dtype={'patient': 'str'}``).

Official splits, as ``wilds/datasets/camelyon17_dataset.py`` defines them (split scheme ``official``): the
metadata's ``split`` column marks ``train`` (0) and in-distribution validation ``id_val`` (1) rows; WILDS
then overrides every row of hospital 1 (``VAL_CENTER``) to the out-of-distribution ``val`` split and every
row of hospital 2 (``TEST_CENTER``) to ``test``. Here hospitals 0, 3 and 4 carry ``train`` / ``val`` lists
(the CSV's 0 / 1), and hospitals 1 and 2 none: held out, they are used whole, which is what WILDS evaluates.
WILDS's own setting is therefore ``--protocol ltdo --target hospital_2 --val-domain hospital_1``; a
leave-one-hospital-out run (``--protocol lodo``) that trains on hospital 1 or 2 splits it by the seeded rule.

The cache key covers ``metadata.csv`` (its SHA-256) and the resolution, not every patch's file time (stat-ing
455,954 files on each load would cost seconds): replacing patches in place needs ``fedstyle cache clear datasets``.
"""

from __future__ import annotations

import csv
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from fedstyle.data.cache import ArrayWriter, DecodedArrays, cached_dataset
from fedstyle.data.contract import DomainDataset, check_build_options
from fedstyle.data.folder import IMAGENET_MEAN, IMAGENET_STD, check_no_class_emptied, check_skipped, decode_domain
from fedstyle.errors import ConfigError, DataError

RECIPE_VERSION = 1
FOLDER = "camelyon17_v1.0"
COLUMNS = ("patient", "node", "x_coord", "y_coord", "tumor", "center", "split")
CLASSES = ["normal", "tumor"]
#: WILDS's hospital numbering (0-indexed): every row of these is its OOD validation / test split
VAL_CENTER, TEST_CENTER = 1, 2
#: the metadata's split codes (WILDS's ``_split_dict``) that its official scheme keeps per row
CSV_SPLITS = {"0": "train", "1": "val"}
ROOT_HINT = (f"pass --data-root the WILDS root holding {FOLDER}/ (metadata.csv and patches/), e.g. after "
             "`fedstyle data download camelyon17 --data-root DIR` or wilds' get_dataset('camelyon17', download=True)")


def find_metadata(data_root: str | os.PathLike | None) -> Path:
    """``metadata.csv`` under ``data_root`` (the WILDS root or the ``camelyon17_v1.0`` folder itself)."""
    if data_root is None:
        raise ConfigError(f"camelyon17 needs its patches: {ROOT_HINT}")
    root = Path(data_root).expanduser().resolve()
    for candidate in (root / FOLDER / "metadata.csv", root / "metadata.csv"):
        if candidate.is_file():
            return candidate
    raise DataError(f"no {FOLDER}/metadata.csv in {root}; {ROOT_HINT}")


def read_metadata(path: Path) -> dict[str, list]:
    """The columns of ``metadata.csv`` WILDS reads, as strings (one row per patch, file order)."""
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise DataError(f"{path} lacks column(s) {', '.join(missing)} (has: {', '.join(h for h in header if h)}); "
                            f"it is not Camelyon17-WILDS's metadata: {ROOT_HINT}")
        where = [header.index(c) for c in COLUMNS]
        columns = {c: [] for c in COLUMNS}
        for number, row in enumerate(reader, 2):
            if len(row) < len(header):
                raise DataError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}; restore the file")
            for c, i in zip(COLUMNS, where):
                columns[c].append(row[i].strip())
    for column, allowed in (("tumor", {"0", "1"}), ("split", set(CSV_SPLITS))):
        bad = set(columns[column]) - allowed
        if bad:
            raise DataError(f"{path}: column {column!r} holds {sorted(bad)[0]!r}, WILDS's metadata only "
                            f"{' / '.join(sorted(allowed))}; restore the file")
    if not all(c.isdigit() for c in set(columns["center"])) or not columns["center"]:
        raise DataError(f"{path}: column 'center' must hold hospital numbers (0-4) on every row; restore the file")
    return columns


def patch_path(folder: Path, patient: str, node: str, x: str, y: str) -> Path:
    """A patch's file, named as WILDS names it."""
    slide = f"patient_{patient}_node_{node}"
    return folder / "patches" / slide / f"patch_{slide}_x_{x}_y_{y}.png"


def _build(writer: ArrayWriter, rows: dict[str, list[int]], paths: list[Path], labels: np.ndarray, resolution: int,
           skip_bad_images: bool, progress: bool) -> DecodedArrays:
    images, out_labels, bad_images = {}, {}, []
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as executor, tqdm(total=len(paths), desc="decoding camelyon17", unit="img",
                                                       disable=not progress) as bar:
        for index, (domain, members) in enumerate(rows.items()):
            domain_paths = [paths[i] for i in members]
            images[domain], kept, bad = decode_domain(writer, index, domain_paths, resolution, skip_bad_images,
                                                      executor, bar)
            if not kept:
                raise DataError(f"no patch of {domain} could be read (first: {bad[0][0]}); {ROOT_HINT}")
            out_labels[domain] = labels[np.asarray(members)][kept]
            check_no_class_emptied(domain, labels[np.asarray(members)], out_labels[domain], CLASSES,
                                   paths[0].parents[2])
            bad_images += bad
    return DecodedArrays(list(rows), CLASSES, images, out_labels, IMAGENET_MEAN, IMAGENET_STD, augment="none",
                         info={"root": str(paths[0].parents[2]), "skipped_images": len(bad_images),
                               "bad_images": bad_images, "split_scheme": "official"})


def wilds_splits(rows: dict[str, list[int]], split: list[str], paths: list[Path], dropped: set[str]
                    ) -> dict[str, dict[str, torch.Tensor]]:
    """WILDS's official splits of each hospital with train rows (see the module docstring), as decoded indices."""
    out = {}
    for domain, members in rows.items():
        if int(domain.rsplit("_", 1)[1]) in (VAL_CENTER, TEST_CENTER):
            continue
        kept = [i for i in members if str(paths[i]) not in dropped] if dropped else members
        codes = np.array([split[i] for i in kept])
        out[domain] = {name: torch.from_numpy(np.flatnonzero(codes == code).astype(np.int64))
                       for code, name in CSV_SPLITS.items()}
    return out


def load_camelyon17(data_root: str | os.PathLike | None = None, resolution: int | None = None,
                    skip_bad_images: bool = False, seed: int = 0, progress: bool = True,
                    official_splits: bool = True) -> DomainDataset:
    """Camelyon17-WILDS from its layout under ``data_root``: decoded once (cached), hospitals as domains,
    with WILDS's official splits unless ``official_splits=False``; ``seed`` is unused."""
    metadata = find_metadata(data_root)
    folder = metadata.parent
    resolution = check_build_options("camelyon17", resolution, 96)
    columns = read_metadata(metadata)
    where = zip(*(columns[c] for c in ("patient", "node", "x_coord", "y_coord")))
    paths = [patch_path(folder, *fields) for fields in where]
    labels = np.array(columns["tumor"], dtype=np.int64)
    rows: dict[str, list[int]] = {}
    for i, center in sorted(enumerate(columns["center"]), key=lambda item: (int(item[1]), item[0])):
        rows.setdefault(f"hospital_{int(center)}", []).append(i)
    recipe = {"name": "camelyon17", "version": RECIPE_VERSION, "resolution": resolution,
              "metadata": hashlib.sha256(metadata.read_bytes()).hexdigest()[:32]}
    dataset = cached_dataset(recipe, lambda writer: _build(writer, rows, paths, labels, resolution, skip_bad_images,
                                                           progress), progress)
    check_skipped(dataset, "camelyon17", skip_bad_images)
    if not official_splits:
        return dataset
    from fedstyle.data.split_lists import skipped_paths

    # the cache entry may have been built from another copy of the folder: its skipped patches named under it
    dropped = skipped_paths(dataset.info, folder)
    return dataset.with_splits(wilds_splits(rows, columns["split"], paths, dropped))
