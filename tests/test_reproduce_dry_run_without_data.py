"""`reproduce --dry-run` / `sweep --dry-run` list the runs before the data is there, each marked "data missing";
without --dry-run the missing data is refused as before."""

from __future__ import annotations

import pytest

from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.grid import parse_grid
from fedstyle.experiments.sweep import plan_grid

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")


def test_reproduce_dry_run_lists_the_papers_runs_with_the_data_missing(tmp_path, capsys):
    absent = tmp_path / "not-downloaded-yet"
    out = tmp_path / "runs"
    assert main(["reproduce", "pardon", "--data-root", str(absent), "--track", "paper-pacs", "--dry-run", "--out",
                 str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("paper-pacs (full):") and lines[0].endswith(f"data: pacs from {absent / 'PACS'}")
    assert "72 runs" in lines[1] and "72 new" in lines[1]
    assert lines[2].startswith(f"data missing: pacs: dataset root {absent / 'PACS'} does not exist")
    runs = lines[3:]
    assert len(runs) == 72 and all(line.endswith("(data missing)") for line in runs)
    assert {line.split()[1].split("/")[-1] for line in runs} == set(PACS_DOMAINS)  # "each" from PACS's own domains
    assert not out.exists() and not absent.exists()  # a dry run writes nothing


def test_without_dry_run_the_missing_data_is_refused(tmp_path, capsys):
    assert main(["reproduce", "pardon", "--data-root", str(tmp_path / "none"), "--quiet"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["reproduce", "pardon", "--dataset", "pacs", "--quiet", "--out", str(tmp_path / "r")]) == 2
    assert "pacs needs its images" in capsys.readouterr().err


def test_a_named_dataset_without_its_images_is_listed_by_reproduce_dry_run(tmp_path, capsys):
    assert main(["reproduce", "pardon", "--dataset", "pacs", "--dry-run", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "data missing: pacs: pacs needs its images" in out and out.count("(data missing)") == 72


def grid(tmp_path, dataset: str, data_root: str):
    data = {"base": {"dataset": dataset, "data_root": data_root, "rounds": 1}, "targets": "each", "seeds": [0],
            "variant": [{"name": "fedavg", "method": "fedavg"}]}
    return parse_grid(data, "grid.toml")


def test_plan_without_data_marks_each_run_and_a_plan_with_data_refuses(tmp_path):
    missing = grid(tmp_path, "vlcs", str(tmp_path / "VLCS"))
    plan = plan_grid(missing, tmp_path / "out", without_data=True)
    assert [r.rel for r in plan.runs] == [f"fedavg/seed0/{d}" for d in ("Caltech101", "LabelMe", "SUN09", "VOC2007")]
    assert all("does not exist" in r.data_missing for r in plan.runs)
    with pytest.raises(ConfigError, match="does not exist"):
        plan_grid(missing, tmp_path / "out")


def test_a_dataset_whose_domains_are_unknown_is_still_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):  # `folder`: its domains are its folders' names
        plan_grid(grid(tmp_path, "folder", str(tmp_path / "mine")), tmp_path / "out", without_data=True)
