"""`fedstyle reproduce PAPER --data-root DIR` / `--dataset NAME`: the paper's own setting (its paper-<dataset>
track: backbone, resolution, rounds) on the real data; the dry run is tested on a tiny PACS-like tree."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.grid import parse_grid, read_toml
from fedstyle.experiments.paper import list_presets, preset_path
from fedstyle.experiments.real_data import paper_tracks, select_paper_runs

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


@pytest.fixture(scope="module")
def fake_data_root(tmp_path_factory):
    """DATA_ROOT/PACS/<domain>/<class>/<image>.png as `fedstyle data download pacs` leaves it, 3 images a cell."""
    root = tmp_path_factory.mktemp("real-data")
    rng = np.random.default_rng(0)
    for domain in PACS_DOMAINS:
        for cls in PACS_CLASSES:
            folder = root / "PACS" / domain / cls
            folder.mkdir(parents=True)
            for k in range(3):
                Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    return root


@pytest.mark.parametrize("name", [name for name, _ in list_presets()])
def test_every_preset_has_a_paper_track_with_the_papers_backbone_at_224_px(name):
    data = read_toml(preset_path(name))
    tracks = paper_tracks(data)
    assert tracks and all(d in ("pacs", "officehome", "vlcs") for d in tracks.values())
    papers = {r["dataset"].lower().replace("-", "") for r in data["paper"]["results"]}
    assert set(tracks.values()) <= papers | {"vlcs"}  # StyleDDG's VLCS numbers are not in the preset
    for track in tracks:
        full = parse_grid(data, name, scale="full", track=track)
        assert full.base["resolution"] == 224 and full.base["pretrained"] is True
        assert full.base["backbone"] in ("resnet18", "resnet50")
        parse_grid(data, name, scale="smoke", track=track)


def test_the_papers_own_numbers_are_in_the_tracks():
    ccst = read_toml(preset_path("ccst"))["tracks"]
    assert (ccst["paper-pacs"]["base"]["backbone"], ccst["paper-officehome"]["base"]["backbone"]) == \
        ("resnet50", "resnet18")
    assert ccst["paper-pacs"]["base"]["rounds"] == 500 and ccst["paper-pacs"]["base"]["lr"] == 0.001
    sfdg = read_toml(preset_path("stablefdg"))["tracks"]["paper-pacs"]["base"]
    assert (sfdg["rounds"], sfdg["local_epochs"], sfdg["batch_size"]) == (50, 5, 32)
    pardon = read_toml(preset_path("pardon"))["tracks"]["paper-pacs"]["base"]
    assert (pardon["rounds"], pardon["selection"]) == (50, "last")


def test_dry_run_on_a_pacs_like_tree_lists_the_papers_runs(fake_data_root, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["reproduce", "ccst", "--data-root", str(fake_data_root), "--dry-run", "--out", str(out),
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    pacs = fake_data_root / "PACS"
    assert lines[0] == (f"paper-pacs (full): ImageNet-pretrained resnet50 at 224 px, 500 rounds x 1 local epoch(s) of "
                        f"batch 32, sgd lr 0.001; data: pacs from {pacs}; splits: seeded per-class split of each "
                        f"domain (--val-fraction): no official pacs lists found; to use them put "
                        f"<domain>_train_kfold.txt, <domain>_crossval_kfold.txt, <domain>_test_kfold.txt for each "
                        f"domain in {pacs / 'splits'} (or {pacs} or {pacs / 'correct_txt_lists'})")
    assert "144 runs" in lines[1] and "144 new" in lines[1]
    runs = [line.split() for line in lines[2:]]
    assert len(runs) == 144 and all(r[0] == "new" for r in runs)
    assert {r[1].split("/")[-1] for r in runs} == set(PACS_DOMAINS)  # every domain held out
    assert f"left out paper-officehome: no officehome in {fake_data_root} (fedstyle data download officehome " \
           f"--data-root {fake_data_root})" in captured.err
    assert not out.exists()  # a dry run writes nothing


def test_dry_run_at_smoke_scale_and_with_the_data_folder_itself(fake_data_root, tmp_path, capsys):
    assert main(["reproduce", "pardon", "--data-root", str(fake_data_root / "PACS"), "--track", "paper-pacs",
                 "--scale", "smoke", "--dry-run", "--out", str(tmp_path / "r"), "--set", "clients=4",
                 "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("paper-pacs (smoke): ImageNet-pretrained resnet50 at 224 px, 1 rounds x 2 local steps")
    assert "2 runs" in lines[1] and len(lines) == 4


def test_the_setting_line_names_official_lists_when_the_folder_has_them(fake_data_root, tmp_path, capsys):
    import shutil

    pacs = shutil.copytree(fake_data_root / "PACS", tmp_path / "PACS")
    for domain in PACS_DOMAINS:
        every = [f"{domain}/{cls}/{k}.png {i + 1}" for i, cls in enumerate(PACS_CLASSES) for k in range(3)]
        for name, lines in (("train", every[1:]), ("crossval", every[:1]), ("test", every)):
            path = pacs / "correct_txt_lists" / f"{domain}_{name}_kfold.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
    assert main(["reproduce", "pardon", "--data-root", str(tmp_path), "--track", "paper-pacs", "--scale", "smoke",
                 "--dry-run", "--out", str(tmp_path / "r"), "--set", "clients=4", "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(f"; splits: official pacs lists from {pacs / 'correct_txt_lists'}")
    assert main(["reproduce", "pardon", "--data-root", str(tmp_path), "--track", "paper-pacs", "--scale", "smoke",
                 "--dry-run", "--out", str(tmp_path / "r"), "--set", "clients=4", "--set", "official_splits=false",
                 "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("official lists off (--no-official-splits)")


def test_no_paper_data_names_the_downloads(tmp_path):
    with pytest.raises(ConfigError) as nothing:
        select_paper_runs(read_toml(preset_path("ccst")), "preset ccst", data_root=tmp_path)
    message = str(nothing.value)
    assert f"none of the paper's datasets is in {tmp_path}" in message
    assert f"fedstyle data download pacs --data-root {tmp_path}" in message
    assert f"fedstyle data download officehome --data-root {tmp_path}" in message


def test_a_dataset_name_is_passed_through_to_the_track_it_names():
    data = read_toml(preset_path("ccst"))
    runs, missing = select_paper_runs(data, "ccst", dataset="hf:flwrlabs/office-home")
    assert [r.track for r in runs] == ["paper-officehome"] and not missing
    assert runs[0].data["tracks"]["paper-officehome"]["base"]["dataset"] == "hf:flwrlabs/office-home"
    grid = parse_grid(runs[0].data, "ccst", scale="full", track="paper-officehome")
    assert grid.base["dataset"] == "hf:flwrlabs/office-home" and grid.base["backbone"] == "resnet18"
    fedgca = select_paper_runs(read_toml(preset_path("fedgca")), "fedgca", dataset="hf:flwrlabs/pacs")[0][0]
    assert fedgca.data["tracks"]["paper-pacs"]["source_domain"][0]["dataset"] == "hf:flwrlabs/pacs"
    with pytest.raises(ConfigError, match="say which of the paper's settings it is: --track paper-pacs or"):
        select_paper_runs(data, "ccst", dataset="hf:someone/other")
