"""The leaderboard (issue 51): its tables come from the registry, its runs' results are merged into the kept
CSVs, its estimate is the measured seconds' arithmetic; and (below) its rendering from the CSVs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedstyle.algorithms import METHODS
from fedstyle.errors import ConfigError
from fedstyle.experiments.leaderboard.cost import CostModel
from fedstyle.experiments.leaderboard.run import (COLUMNS, LINE_KEY, TablePlan, csv_path, export_table, plan_table,
                                                  run_in_csv, table_only)
from fedstyle.experiments.leaderboard.tables import GRID_DIR, TABLES, load_table, load_tables
from fedstyle.experiments.report.per_seed import merge_rows, read_rows, write_rows

# ----------------------------------------------------------------------------- the tables


def test_every_registered_method_has_a_row_or_a_reason():
    """A method joins the table its topology belongs to from the registry: no list to edit."""
    star = load_table("multi_source")
    p2p = load_table("p2p")
    star_methods = {v["method"] for v in star.data["variant"]}
    p2p_methods = {v["method"] for v in p2p.data["variant"]}
    for name in METHODS.names():
        topologies = METHODS.get(name).topologies
        if "star" in topologies:
            assert name in star_methods or name in star.excluded, name
        if "complete" in topologies:
            assert name in p2p_methods or name in p2p.excluded, name
    # one row per method in the multi-source table: a file's [[variant]] replaces the method's default row
    names = [v["name"] for v in star.data["variant"]]
    assert len(names) == len(set(names)) == len(star_methods)


def test_a_new_method_joins_and_an_excluded_one_names_its_reason(tmp_path):
    text = (GRID_DIR / "p2p.toml").read_text().replace("[leaderboard.exclude]\n",
                                                       '[leaderboard.exclude]\nstyleddg = "not here"\n')
    (tmp_path / "p2p.toml").write_text(text)
    table = load_table("p2p", tmp_path)
    assert table.excluded == {"styleddg": "not here"}
    assert "styleddg" not in {v["method"] for v in table.data["variant"]}
    assert table.added == ["dsgd"]
    (tmp_path / "p2p.toml").write_text(text.replace('styleddg = "not here"', 'nosuch = "x"'))
    with pytest.raises(ConfigError, match="'nosuch', which is no registered method"):
        load_table("p2p", tmp_path)
    with pytest.raises(ConfigError, match="no leaderboard table"):
        load_table("nothing", tmp_path)


def test_rows_follow_the_registry_order_with_the_files_own_rows_in_place():
    methods = [v["method"] for v in load_table("p2p").data["variant"]]
    assert methods == ["dsgd", "dsgd", "dsgd", "styleddg"]
    star = [v["method"] for v in load_table("multi_source").data["variant"]]
    order = list(METHODS.names())
    assert star == sorted(star, key=order.index)


def test_the_tables_share_one_budget():
    for table in load_tables():
        base = table.data["base"]
        assert (base["rounds"], base["local_steps"], base["batch_size"], base["lr"], base["lr_schedule"]) == \
            (8, 15, 64, 0.05, "cosine"), table.key
        assert base["selection"] == "source_val"
        assert table.data["seeds"] == [0, 1, 2]


#: the benchmarks' domains, as the issue lists them (the datasets themselves are not built here: slow)
DOMAINS = {"digits4": ("mnist", "mnistm", "optdigits", "syn"), "fashion4": ("photo", "art", "cartoon", "sketch")}


def test_every_run_of_every_table_validates(tmp_path, monkeypatch):
    """What `fedstyle leaderboard run --dry-run` checks, through the sweep machinery: each run's settings, its
    method's hyperparameters and topology. (The dry run also builds each split on the data; that takes minutes
    with the tests' empty dataset cache, so the datasets are stood in for by their domain names here.)"""
    from fedstyle.experiments.grid import plan as grid_plan

    monkeypatch.setattr(grid_plan._Datasets, "get", lambda self, config: SimpleNamespace(domains=DOMAINS[config.dataset]))
    monkeypatch.setattr(grid_plan._Datasets, "check", lambda self, config: None)
    counts = {}
    for table in load_tables():
        planned = plan_table(table, tmp_path / "runs", csv_dir=tmp_path / "csv")
        counts[table.key] = len(planned.plan.runs)
        assert len(planned.to_run) == len(planned.plan.runs) and not planned.in_csv
    stars = len(load_table("multi_source").data["variant"])
    assert counts == {"multi_source": stars * 8 * 3, "p2p": 4 * 8 * 3, "single_source": 13 * 8 * 3}


def test_only_keeps_what_concerns_a_table():
    table = load_table("p2p")
    grid = table.grid()
    assert table_only(table, grid, [("variant", ["fedavg", "dsgd"])]) == [("variant", ["dsgd"])]
    assert table_only(table, grid, [("variant", ["fedavg"])]) is None
    assert table_only(table, grid, [("source_domain", ["digits4-mnist"])]) is None
    assert table_only(table, grid, [("dataset", ["digits4"]), ("seed", ["0"])]) == \
        [("dataset", ["digits4"]), ("seed", ["0"])]

# ----------------------------------------------------------------------------- the CSVs


def _line(variant="fedavg", dataset="digits4", source="", target="mnist", seed=0, acc="50.00", label="FedAvg"):
    return {"label": label, "method": variant, "variant": variant, "dataset": dataset, "source": source,
            "target": target, "seed": str(seed), "target_acc": acc, "source_val": "80.00", "device": "cpu",
            "seconds": "1"}


def _run(variant, dataset, seed, targets=("mnist",), source=None, run_dir=Path("nowhere")):
    config = SimpleNamespace(dataset=dataset, seed=seed, targets=list(targets), source=source)
    return SimpleNamespace(variant=variant, config=config, run_dir=run_dir, status="new")


def test_a_run_is_in_the_csv_when_every_target_of_it_is():
    from fedstyle.experiments.leaderboard.run import _held

    held = _held([_line(), _line(seed=1), _line(variant="fedgca", source="mnist", target="syn")])
    assert run_in_csv(_run("fedavg", "digits4", 0), held)
    assert not run_in_csv(_run("fedavg", "digits4", 2), held)
    assert not run_in_csv(_run("fedavg", "digits4", 0, targets=("mnist", "syn")), held)
    assert not run_in_csv(_run("fedavg", "fashion4", 0), held)
    # single source: the protocol picks the targets (none in the config); any line of that source will do
    assert run_in_csv(_run("fedgca", "digits4", 0, targets=(), source="mnist"), held)
    assert not run_in_csv(_run("fedgca", "digits4", 0, targets=(), source="syn"), held)


def test_merging_replaces_a_run_made_again_and_keeps_the_others():
    kept = [_line(acc="50.00"), _line(seed=1, acc="60.00")]
    merged = merge_rows(kept, [_line(acc="55.00"), _line(seed=2, acc="70.00")], LINE_KEY)
    assert sorted((m["seed"], m["target_acc"]) for m in merged) == [("0", "55.00"), ("1", "60.00"), ("2", "70.00")]


def _finished_run(root: Path, target: str, seed: int, acc: float) -> Path:
    run = root / f"seed{seed}" / target
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": "dsgd", "dataset": "digits4", "seed": seed,
                                                 "targets": [target], "device": "cpu", "source": None}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "source_val_acc": {"syn": 0.8, "optdigits": 0.6},
                                                   "target_acc": {target: acc}}) + "\n")
    (run / "summary.json").write_text(json.dumps({
        "method": "dsgd", "label": "DSGD", "dataset": "digits4", "seed": seed, "selection": "source_val",
        "selected_round": 1, "targets": {target: {"selected": acc, "last": acc}}, "seconds": 2.5}))
    (run / "done").touch()
    return run


def test_export_merges_finished_runs_into_the_tables_csv(tmp_path):
    table = load_table("p2p")
    csv_dir = tmp_path / "csv"
    write_rows(csv_path(table, csv_dir), [_line(variant="dsgd", seed=5, acc="10.00", label="DSGD")], COLUMNS)
    done = _finished_run(tmp_path / "runs", "mnist", 0, 0.625)
    unfinished = tmp_path / "runs" / "seed1" / "mnist"
    unfinished.mkdir(parents=True)
    planned = TablePlan(table, plan=None, to_run=[_run("dsgd", "digits4", 0, run_dir=done),
                                                  _run("dsgd", "digits4", 1, run_dir=unfinished)])
    path, added = export_table(planned, csv_dir)
    assert added == 1
    lines = read_rows(path)
    assert [(l["seed"], l["target_acc"], l["source_val"], l["variant"]) for l in lines] == \
        [("0", "62.50", "70.00", "dsgd"), ("5", "10.00", "80.00", "dsgd")]
    assert list(lines[0]) == list(COLUMNS)


def test_the_estimate_scales_each_row_by_the_references_whole_run():
    cost = CostModel({"tables": {"t": {"rows_one_round": {"fedavg": 2.0, "ccst": 6.0, "dsu": 3.0},
                                       "reference": "fedavg", "reference_whole": 20.0, "reference_one_round": 2.0}}})
    assert cost.seconds("t", "ccst") == pytest.approx(60.0)
    unmeasured: set[str] = set()
    assert cost.seconds("t", "newmethod", unmeasured) == pytest.approx(30.0)  # the median row, 3.0 x 10
    assert unmeasured == {"newmethod"}
    with pytest.raises(ConfigError, match="no measurement of table 'p2p'"):
        cost.seconds("p2p", "dsgd")


def test_the_committed_estimate_measures_every_row():
    cost = CostModel.load(GRID_DIR / "cost.json")
    for table in load_tables():
        for variant in table.data["variant"]:
            assert variant["name"] in cost.tables[table.key]["rows_one_round"], (table.key, variant["name"])
    assert set(cost.tables) == set(TABLES)
