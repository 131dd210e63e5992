"""One dataset, three shapes, one result (issue 37 section 5): a tiny PACS written as the PACS release lays it out
(``pacs_data/<domain>/<class>/<file>`` beside ``pacs_label/<domain>_{train,crossval,test}_kfold.txt``), as a
parquet Hugging Face dataset (``train`` / ``validation`` splits, loaded offline through ``datasets.load_dataset``
from the datasets cache, the path a Hub dataset takes), and as that same tree zipped, served on 127.0.0.1 and
installed by ``fedstyle data download pacs``. All three must give the same pixels, labels, domains, classes and
splits; the folder and the download the same cache entry (the key hashes relative paths, sizes and file times, so
the download must keep the archive's times), and the Hugging Face dataset one entry over two loads.

The Hugging Face shape has no ``test`` split: a row sits in one split, and PACS's test list is the whole domain
(train + crossval), which is what a held-out domain without a test list is tested on; so its ``splits`` lack the
``test`` key the lists give, and every fold of ``make_split`` is compared instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile

import numpy as np
import pytest

pytest.importorskip("datasets")

from archive_server import ArchiveServer  # noqa: E402
from fedstyle.cli.main import main  # noqa: E402
from fedstyle.data import folder as folder_module  # noqa: E402
from fedstyle.data import hub as hub_module  # noqa: E402
from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.data.download.table import SOURCES_ENV  # noqa: E402
from fedstyle.data.folder import decode_image  # noqa: E402
from fedstyle.partition import make_split  # noqa: E402
from hub_fixtures import (  # noqa: E402
    PACS_CLASSES, PACS_DOMAINS, cache_as_hub, offline_hf, tiny_pacs_rows, write_folder, write_parquet,
)

PER_CLASS = 3
RESOLUTION = 16
#: fixed file times, even seconds (a zip keeps times to 2 s), one per file so a mix-up shows
FIRST_MTIME = 1_578_000_000  # 2020-01-02


def in_crossval(row: dict) -> bool:
    """The crossval (validation) images: per domain and class one of the three, a different one per cell."""
    d, k = PACS_DOMAINS.index(row["domain"]), int(row["image"]["path"].rsplit("_", 1)[1].split(".")[0])
    return k == (row["label"] + d) % PER_CLASS


def list_line(row: dict) -> str:
    """A PACS list line: ``<domain>/<class>/<file> <1-based label>``."""
    return f"{row['domain']}/{PACS_CLASSES[row['label']]}/{row['image']['path']} {row['label'] + 1}\n"


def pacs_release(base, rows) -> dict[str, int]:
    """base/pacs_data/<domain>/<class>/<file> and base/pacs_label/*_kfold.txt; returns relative path -> mtime."""
    write_folder(base / "pacs_data", rows)
    for domain in PACS_DOMAINS:
        mine = [r for r in rows if r["domain"] == domain]
        lists = {"train": [r for r in mine if not in_crossval(r)], "crossval": [r for r in mine if in_crossval(r)],
                 "test": mine}
        for name, members in lists.items():
            path = base / "pacs_label" / f"{domain}_{name}_kfold.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(list_line(r) for r in members))
    times = {}
    for index, path in enumerate(sorted(p for p in base.rglob("*") if p.is_file())):
        stamp = FIRST_MTIME + 2 * index
        os.utime(path, (stamp, stamp))
        times[path.relative_to(base).as_posix()] = stamp
    return times


def zip_tree(base) -> bytes:
    """The tree as a zip, each member stamped with its file's time (as ``zip -r`` stamps it)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as handle:
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            handle.write(path, path.relative_to(base).as_posix())
    return out.getvalue()


def counting(function, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(function.__name__)
        return function(*args, **kwargs)

    return wrapped


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """The three shapes loaded (each twice where the cache is checked), with the builds each load ran."""
    tmp = tmp_path_factory.mktemp("three-shapes")
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv("FEDSTYLE_CACHE", str(tmp / "fedstyle-cache"))
        offline_hf(patch, tmp / "hf")
        builds: list[str] = []
        patch.setattr(folder_module, "build_folder_dataset", counting(folder_module.build_folder_dataset, builds))
        patch.setattr(hub_module, "_build", counting(hub_module._build, builds))
        rows = tiny_pacs_rows(per_class=PER_CLASS, size=12, seed=5)
        times = pacs_release(tmp / "release", rows)
        options = dict(resolution=RESOLUTION, progress=False)
        out = {"rows": rows, "times": times}

        out["folder"] = load_dataset("pacs", data_root=str(tmp / "release" / "pacs_data"), **options)
        out["folder_builds"] = list(builds)

        with ArchiveServer() as server:
            archive = zip_tree(tmp / "release")
            server.behaviour.files["/PACS.zip"] = archive
            sources = tmp / "sources.json"
            sources.write_text(json.dumps({"PACS.zip": {"urls": [server.url("/PACS.zip")],
                                                        "sha256": hashlib.sha256(archive).hexdigest()}}))
            patch.setenv(SOURCES_ENV, str(sources))
            code = main(["data", "download", "pacs", "--data-root", str(tmp / "data"), "--quiet"])
        assert code == 0
        out["download_root"] = tmp / "data" / "PACS"
        out["downloaded"] = load_dataset("pacs", data_root=str(out["download_root"]), **options)
        out["download_builds"] = builds[len(out["folder_builds"]):]

        shuffled = np.random.default_rng(0).permutation(len(rows))  # the parquet's row order must not matter
        splits = {"train": [rows[i] for i in shuffled if not in_crossval(rows[i])],
                  "validation": [rows[i] for i in shuffled if in_crossval(rows[i])]}
        cache_as_hub("flwrlabs/pacs", write_parquet(tmp / "repo", splits))
        start = len(builds)
        out["hub"] = load_dataset("hf:flwrlabs/pacs", **options)
        out["hub_again"] = load_dataset("hf:flwrlabs/pacs", **options)
        out["hub_builds"] = builds[start:]
        yield out
    finally:
        patch.undo()


def three(shapes):
    return {"folder": shapes["folder"], "download": shapes["downloaded"], "hf": shapes["hub"]}


def test_same_domains_classes_labels_and_pixels(shapes):
    datasets = three(shapes)
    encoded = {(r["domain"], r["label"], r["image"]["path"]): r["image"]["bytes"] for r in shapes["rows"]}
    for name, dataset in datasets.items():
        assert dataset.domains == list(PACS_DOMAINS) and dataset.classes == list(PACS_CLASSES), name
        assert (dataset.mean, dataset.std, dataset.augment, dataset.resolution) == (
            shapes["folder"].mean, shapes["folder"].std, shapes["folder"].augment, RESOLUTION), name
    for d in PACS_DOMAINS:
        # decoded order within a domain: by class, then file name (<domain>_<class>_<k>.<ext>, k = 0, 1, 2)
        names = [f"{d}_{c}_{k}" for c in PACS_CLASSES for k in range(PER_CLASS)]
        expected = np.stack([decode_image(io.BytesIO(next(v for (dd, _, p), v in encoded.items()
                                                              if dd == d and p.startswith(n + "."))), RESOLUTION)
                             for n in names]).transpose(0, 3, 1, 2)
        for name, dataset in datasets.items():
            assert dataset.labels[d].tolist() == [c for c in range(7) for _ in range(PER_CLASS)], (name, d)
            assert np.array_equal(dataset.images[d].numpy(), expected), (name, d)


def test_same_official_splits_and_every_fold_the_same(shapes):
    datasets = three(shapes)
    for d_index, d in enumerate(PACS_DOMAINS):
        val = [c * PER_CLASS + (c + d_index) % PER_CLASS for c in range(7)]  # hand-computed from in_crossval
        train = sorted(set(range(7 * PER_CLASS)) - set(val))
        whole = list(range(7 * PER_CLASS))
        lists = {"train": train, "val": val, "test": whole}
        assert {s: t.tolist() for s, t in shapes["folder"].splits[d].items()} == lists, d
        assert {s: t.tolist() for s, t in shapes["downloaded"].splits[d].items()} == lists, d  # lists kept
        assert {s: t.tolist() for s, t in shapes["hub"].splits[d].items()} == {"train": train, "val": val}, d
    folds = [dict(protocol="lodo", targets=[d]) for d in PACS_DOMAINS]
    folds += [dict(protocol="ltdo", targets=["sketch"], val_domain="photo"),
              dict(protocol="single_source", source="cartoon")]
    for fold in folds:
        splits = {name: make_split(dataset, seed=7, **fold) for name, dataset in datasets.items()}
        reference = splits["folder"]
        for name, split in splits.items():
            assert (split.sources, split.targets, split.val_domain) == (
                reference.sources, reference.targets, reference.val_domain), (name, fold)
            for part in ("train", "val", "heldout"):
                got, want = getattr(split, part), getattr(reference, part)
                assert {d: t.tolist() for d, t in got.items()} == {d: t.tolist() for d, t in want.items()}, (
                    name, fold, part)


def test_cache_keys_folder_and_download_share_one_entry_hub_is_stable(shapes):
    root = shapes["download_root"]
    downloaded = {p.relative_to(root).as_posix(): int(p.stat().st_mtime)
                  for p in root.rglob("*") if p.is_file() and len(p.relative_to(root).parts) == 3}  # the images
    originals = {path.removeprefix("pacs_data/"): stamp for path, stamp in shapes["times"].items()
                 if path.startswith("pacs_data/")}
    assert downloaded == originals  # the zip's member times were restored: same relative paths, sizes, times
    assert shapes["folder_builds"] == ["build_folder_dataset"]
    assert shapes["download_builds"] == []  # the downloaded tree hit the folder's cache entry
    assert shapes["downloaded"].info["cache_dir"] == shapes["folder"].info["cache_dir"]
    assert shapes["downloaded"].info["recipe"] == shapes["folder"].info["recipe"]
    assert shapes["hub_builds"] == ["_build"]  # decoded once over two loads
    assert shapes["hub_again"].info["cache_dir"] == shapes["hub"].info["cache_dir"]
    assert all(shapes["hub"].info["recipe"]["fingerprints"].values())
    for d in PACS_DOMAINS:
        assert np.array_equal(shapes["hub_again"].images[d].numpy(), shapes["hub"].images[d].numpy())


def test_zip_members_keep_their_times_as_unzip_restores_them(tmp_path):
    """The extended-timestamp field (0x5455, UTC seconds, written by Info-ZIP's zip) wins over the DOS time,
    which is read as local time; either way the unpacked file has the archive's time, not the unpacking's."""
    import struct
    import time

    from fedstyle.data.download.layout import unpack

    utc = 1_600_000_123
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as handle:
        stamped = zipfile.ZipInfo("d/c/stamped.png", date_time=(2001, 2, 3, 4, 5, 6))
        stamped.extra = struct.pack("<HHBl", 0x5455, 5, 1, utc)
        handle.writestr(stamped, b"x")
        handle.writestr(zipfile.ZipInfo("d/c/plain.png", date_time=(2001, 2, 3, 4, 5, 6)), b"y")
    (tmp_path / "a.zip").write_bytes(out.getvalue())
    unpack(tmp_path / "a.zip", tmp_path / "out")
    assert (tmp_path / "out/d/c/stamped.png").stat().st_mtime == utc
    assert (tmp_path / "out/d/c/plain.png").stat().st_mtime == time.mktime((2001, 2, 3, 4, 5, 6, 0, 0, -1))
    assert (tmp_path / "out/d/c/plain.png").read_bytes() == b"y"
