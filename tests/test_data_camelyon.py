"""Camelyon17-WILDS from a tiny fake tree in the real WILDS layout: hospitals as domains, WILDS's official splits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from fedstyle.data import load_dataset
from fedstyle.errors import ConfigError, DataError
from fedstyle.partition import make_split

HEADER = ",patient,node,x_coord,y_coord,tumor,slide,center,split"


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def fake_wilds(root, rows):
    """``root/camelyon17_v1.0/`` with metadata.csv and one 12 x 12 PNG per row, coloured by its row number;
    rows are (patient, node, x, y, tumor, slide, center, split) as WILDS writes them (zero-padded patients)."""
    folder = root / "camelyon17_v1.0"
    lines = [HEADER]
    for i, (patient, node, x, y, tumor, slide, center, split) in enumerate(rows):
        lines.append(f"{i},{patient},{node},{x},{y},{tumor},{slide},{center},{split}")
        patch = folder / "patches" / f"patient_{patient}_node_{node}"
        patch.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 12), (10 * i, 255 - 10 * i, 7)).save(
            patch / f"patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


# (patient, node, x, y, tumor, slide, center, split): hospitals 0, 3, 4 with train (0) and id_val (1) rows;
# hospital 1 (WILDS's OOD validation) and 2 (its test) keep the CSV's 0/1, which WILDS overrides
ROWS = [
    ("004", 4, 3328, 21792, 1, 0, 0, 0), ("004", 4, 3200, 22272, 0, 0, 0, 1), ("009", 1, 96, 96, 0, 1, 0, 0),
    ("010", 1, 1000, 2000, 0, 5, 1, 0), ("010", 1, 1096, 2000, 1, 5, 1, 1),
    ("051", 2, 640, 960, 1, 30, 2, 0), ("052", 0, 64, 64, 0, 31, 2, 0),
    ("061", 0, 512, 512, 0, 35, 3, 0), ("061", 0, 608, 512, 1, 35, 3, 1), ("062", 3, 10, 20, 1, 36, 3, 0),
    ("072", 3, 96, 192, 0, 40, 4, 1), ("072", 3, 192, 192, 1, 40, 4, 0), ("073", 2, 5, 5, 0, 41, 4, 0),
]


def test_wilds_layout_loads_with_hospitals_and_official_splits(tmp_path):
    fake_wilds(tmp_path, ROWS)
    dataset = load_dataset("camelyon17", data_root=str(tmp_path), resolution=8, progress=False)
    assert dataset.domains == [f"hospital_{c}" for c in range(5)] and dataset.classes == ["normal", "tumor"]
    assert [dataset.size(d) for d in dataset.domains] == [3, 2, 2, 3, 3]
    assert dataset.labels["hospital_0"].tolist() == [1, 0, 0] and dataset.labels["hospital_4"].tolist() == [0, 1, 0]
    # the patch of CSV row 8 (hospital 3, second of its rows) is where its colour says
    assert dataset.images["hospital_3"][1, :, 0, 0].tolist() == [80, 175, 7]
    assert {d: {s: t.tolist() for s, t in lists.items()} for d, lists in dataset.splits.items()} == {
        "hospital_0": {"train": [0, 2], "val": [1]},
        "hospital_3": {"train": [0, 2], "val": [1]},
        "hospital_4": {"train": [1, 2], "val": [0]},
    }  # hospitals 1 and 2: WILDS's OOD validation and test hospitals, used whole
    split = make_split(dataset, "ltdo", targets=["hospital_2"], val_domain="hospital_1", seed=0)
    assert split.sources == ["hospital_0", "hospital_3", "hospital_4"]
    assert split.train["hospital_4"].tolist() == [1, 2] and split.val["hospital_4"].tolist() == [0]
    assert split.heldout["hospital_2"].tolist() == [0, 1] and split.heldout["hospital_1"].tolist() == [0, 1]
    assert sorted(split.official) == ["hospital_0", "hospital_3", "hospital_4"]
    # a hospital without official lists that trains is split by the seeded rule, as any domain
    lodo = make_split(dataset, "lodo", targets=["hospital_0"], val_fraction=0.5, seed=0)
    assert sorted(lodo.train["hospital_1"].tolist() + lodo.val["hospital_1"].tolist()) == [0, 1]
    ignored = load_dataset("camelyon17", data_root=str(tmp_path / "camelyon17_v1.0"), resolution=8,
                           official_splits=False, progress=False)
    assert ignored.splits == {} and ignored.info["cache_dir"] == dataset.info["cache_dir"]


def test_skipping_a_hospitals_only_tumor_patch_is_refused(tmp_path):
    """hospital_0's one tumour patch unreadable: skipping it would leave the hospital without the class."""
    fake_wilds(tmp_path, ROWS)
    (tmp_path / "camelyon17_v1.0/patches/patient_004_node_4/patch_patient_004_node_4_x_3328_y_21792.png").unlink()
    with pytest.raises(DataError, match="every image of class 'tumor' in domain 'hospital_0' is unreadable"):
        load_dataset("camelyon17", data_root=str(tmp_path), resolution=8, skip_bad_images=True, progress=False)


def test_missing_patch_is_named_and_skipping_renumbers_the_splits(tmp_path):
    fake_wilds(tmp_path, ROWS)
    missing = tmp_path / "camelyon17_v1.0/patches/patient_073_node_2/patch_patient_073_node_2_x_5_y_5.png"
    missing.unlink()
    with pytest.raises(DataError, match="patch_patient_073_node_2_x_5_y_5.png .*skip_bad_images"):
        load_dataset("camelyon17", data_root=str(tmp_path), resolution=8, progress=False)
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        dataset = load_dataset("camelyon17", data_root=str(tmp_path), resolution=8, skip_bad_images=True,
                               progress=False)
    assert dataset.size("hospital_4") == 2
    assert {s: t.tolist() for s, t in dataset.splits["hospital_4"].items()} == {"train": [1], "val": [0]}
    # a copy of the folder shares the cache entry (keyed by metadata.csv), whose skipped patch is named under the
    # original: the copy's splits must leave out the same patch (they were refused as out of range)
    shutil.copytree(tmp_path / "camelyon17_v1.0", tmp_path / "copy" / "camelyon17_v1.0")
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        copy = load_dataset("camelyon17", data_root=str(tmp_path / "copy"), resolution=8, skip_bad_images=True,
                            progress=False)
    assert copy.info["cache_dir"] == dataset.info["cache_dir"]
    assert {d: {s: t.tolist() for s, t in lists.items()} for d, lists in copy.splits.items()} == {
        d: {s: t.tolist() for s, t in lists.items()} for d, lists in dataset.splits.items()}


def test_bad_trees_get_one_line_naming_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="--data-root the WILDS root"):
        load_dataset("camelyon17", progress=False)
    with pytest.raises(DataError, match="no camelyon17_v1.0/metadata.csv in .*--data-root the WILDS root"):
        load_dataset("camelyon17", data_root=str(tmp_path), progress=False)
    fake_wilds(tmp_path, ROWS[:2])
    csv = tmp_path / "camelyon17_v1.0" / "metadata.csv"
    csv.write_text(csv.read_text().replace(",center,", ",hospital,"))
    with pytest.raises(DataError, match="lacks column\\(s\\) center"):
        load_dataset("camelyon17", data_root=str(tmp_path), progress=False)
    csv.write_text(HEADER + "\n0,004,4,3328,21792,1,0,0,2\n")
    with pytest.raises(DataError, match="column 'split' holds '2'"):
        load_dataset("camelyon17", data_root=str(tmp_path), progress=False)


def test_patient_ids_keep_their_zero_padding(tmp_path):
    fake_wilds(tmp_path, [("004", 4, 1, 1, 0, 0, 0, 0), ("004", 4, 2, 1, 1, 0, 0, 0)])
    dataset = load_dataset("camelyon17", data_root=str(tmp_path), resolution=8, progress=False)
    assert dataset.domains == ["hospital_0"] and np.array_equal(dataset.labels["hospital_0"].numpy(), [0, 1])
