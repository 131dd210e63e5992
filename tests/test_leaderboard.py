"""The leaderboard (issue 51): its tables come from the registry, its runs' results are merged into the kept
CSVs, its estimate is the measured seconds' arithmetic; and (below) its rendering from the CSVs."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedstyle.algorithms import METHODS
from fedstyle.errors import ConfigError
from fedstyle.experiments.leaderboard.cost import CostModel
from fedstyle.experiments.leaderboard.run import (COLUMNS, LINE_KEY, csv_path, export_runs, plan_table, run_in_csv,
                                                  table_only)
from fedstyle.experiments.leaderboard.tables import (CSV_DIR, GRID_DIR, REGISTRY_MARKER, load_table, load_tables,
                                                     read_datasets, read_meta)
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
    # every method has its default row, named after it (a file's [[variant]] of that name replaces it); other rows of
    # a method (FedDG's episodic mode of feddg_fft) carry names of their own
    names = [v["name"] for v in star.data["variant"]]
    assert len(names) == len(set(names)) and star_methods <= set(names)


def _copy_grid(tmp_path: Path) -> Path:
    for path in GRID_DIR.glob("*.toml"):
        (tmp_path / path.name).write_text(path.read_text())
    return tmp_path


def test_a_new_method_joins_and_an_excluded_one_names_its_reason(tmp_path, monkeypatch):
    grid_dir = _copy_grid(tmp_path)
    meta = (grid_dir / "tables.toml").read_text()
    (grid_dir / "tables.toml").write_text(meta.replace("[p2p.exclude]\n", '[p2p.exclude]\nstyleddg = "not here"\n'))
    table = load_table("p2p", grid_dir)
    assert table.excluded == {"styleddg": "not here"}
    assert "styleddg" not in {method for _, method, _ in table.rows()}
    assert table.added == ["dsgd"] and table.stale  # the file still has StyleDDG's row
    from fedstyle.experiments.leaderboard.tables import write_tables

    assert write_tables(grid_dir) == [grid_dir / "p2p.toml"]
    assert not load_table("p2p", grid_dir).stale and 'name = "styleddg"' not in (grid_dir / "p2p.toml").read_text()
    # a method registered later gets its row in memory at once, and in the file with --write
    from fedstyle.algorithms.dsgd import DSGD

    class NewDecentralised(DSGD):
        name = "newp2p"
        label = "New P2P"

    monkeypatch.setitem(METHODS._items, "newp2p", NewDecentralised)
    table = load_table("p2p", grid_dir)
    assert ("newp2p", "newp2p", "New P2P") in table.rows() and table.stale
    (grid_dir / "tables.toml").write_text(meta.replace("[p2p.exclude]\n", '[p2p.exclude]\nnosuch = "x"\n'))
    with pytest.raises(ConfigError, match="'nosuch', which is no registered method"):
        load_table("p2p", grid_dir)
    with pytest.raises(ConfigError, match="no leaderboard table 'nothing'"):
        load_table("nothing", grid_dir)


def test_the_committed_sweep_files_have_the_registrys_rows():
    """`fedstyle sweep benchmarks/leaderboard/<table>.toml` runs what `fedstyle leaderboard run` runs."""
    for table in load_tables():
        assert not table.stale, f"{table.path} lags behind the registry: run `fedstyle leaderboard grid --write`"
        assert table.text.count(REGISTRY_MARKER) == 1


def test_the_tables_share_one_budget():
    budgets = set()
    for table in load_tables():
        base = table.data["base"]
        budgets.add((base["rounds"], base["local_steps"], base["batch_size"], base["lr"], base["lr_schedule"],
                     base["momentum"], base["weight_decay"], base["backbone"]))
        # --set rounds=8, 16 or 32 evaluates the last round
        assert all(rounds % base["eval_every"] == 0 for rounds in (8, 16, 32))
        assert base["selection"] == "source_val"
        assert table.data["seeds"] == [0, 1, 2]
    assert len(budgets) == 1


#: the benchmarks' domains, as the issue lists them (the datasets themselves are not built here: slow)
DOMAINS = {"digits4": ("mnist", "mnistm", "optdigits", "syn"), "fashion4": ("photo", "art", "cartoon", "sketch")}


def test_every_run_of_every_table_validates(tmp_path, monkeypatch):
    """What `fedstyle leaderboard run --dry-run` checks, through the sweep machinery: each run's settings, its
    method's hyperparameters and topology. (The dry run also builds each split on the data; that takes minutes
    with the tests' empty dataset cache, so the datasets are stood in for by their domain names here.)"""
    from fedstyle.experiments.grid import plan as grid_plan

    monkeypatch.setattr(grid_plan._Datasets, "get",
                        lambda self, config: SimpleNamespace(domains=DOMAINS[config.dataset]))
    monkeypatch.setattr(grid_plan._Datasets, "check", lambda self, config: None)
    counts = {}
    for table in load_tables():
        planned = plan_table(table, tmp_path / "runs", csv_dir=tmp_path / "csv")
        counts[table.key] = len(planned.plan.runs)
        assert len(planned.to_run) == len(planned.plan.runs) and not planned.in_csv
    stars = len(load_table("multi_source").rows())
    # single source: FedGCA's paper's 13 rows and the FedDyn + Complement ablation
    assert counts == {"multi_source": stars * 8 * 3, "p2p": 4 * 8 * 3, "single_source": (13 + 1) * 8 * 3}


def test_only_keeps_what_concerns_a_table():
    table = load_table("p2p")
    grid = table.grid()
    assert table_only(table, grid, [("variant", ["fedavg", "dsgd"])]) == [("variant", ["dsgd"])]
    assert table_only(table, grid, [("variant", ["fedavg"])]) is None
    assert table_only(table, grid, [("source_domain", ["digits4-mnist"])]) is None
    assert table_only(table, grid, [("dataset", ["digits4"]), ("seed", ["0"])]) == \
        [("dataset", ["digits4"]), ("seed", ["0"])]

# ----------------------------------------------------------------------------- the CSVs


def _line(variant="fedavg", dataset="digits4", source="", target="mnist", seed=0, acc="50.00", label="FedAvg",
          rounds=16, source_val="80.00"):
    return {"label": label, "method": variant.split("-")[0], "variant": variant, "dataset": dataset,
            "source": source, "target": target, "seed": str(seed), "rounds": str(rounds), "target_acc": acc,
            "source_val": source_val, "device": "cpu", "seconds": "1"}


def _run(variant, dataset, seed, targets=("mnist",), source=None, run_dir=Path("nowhere"), rounds=16):
    config = SimpleNamespace(dataset=dataset, seed=seed, targets=list(targets), source=source, rounds=rounds)
    return SimpleNamespace(variant=variant, config=config, run_dir=run_dir, status="new")


def test_a_run_is_in_the_csv_when_every_target_of_it_is():
    from fedstyle.experiments.leaderboard.run import _held

    held = _held([_line(), _line(seed=1), _line(variant="fedgca", source="mnist", target="syn")])
    assert run_in_csv(_run("fedavg", "digits4", 0), held)
    assert not run_in_csv(_run("fedavg", "digits4", 2), held)
    assert not run_in_csv(_run("fedavg", "digits4", 0, targets=("mnist", "syn")), held)
    assert not run_in_csv(_run("fedavg", "fashion4", 0), held)
    assert not run_in_csv(_run("fedavg", "digits4", 0, rounds=32), held)  # another budget: not this run
    # single source: the protocol picks the targets (none in the config); any line of that source will do
    assert run_in_csv(_run("fedgca", "digits4", 0, targets=(), source="mnist"), held)
    assert not run_in_csv(_run("fedgca", "digits4", 0, targets=(), source="syn"), held)


def test_merging_replaces_a_run_made_again_and_keeps_the_others():
    kept = [_line(acc="50.00"), _line(seed=1, acc="60.00")]
    merged = merge_rows(kept, [_line(acc="55.00"), _line(seed=2, acc="70.00")], LINE_KEY)
    assert sorted((m["seed"], m["target_acc"]) for m in merged) == [("0", "55.00"), ("1", "60.00"), ("2", "70.00")]


def _table_config(table, root: Path, variant: str, seed: int, target: str, rounds: int = 16,
                  overrides=()) -> dict:
    """The config.json a run of the table's grid at ``root`` writes (as the runner resolves it)."""
    from fedstyle.experiments.build import simulation_noise
    from fedstyle.experiments.grid import plan_grid

    run = next(r for r in plan_grid(table.grid([*overrides, ("rounds", rounds)]), root, load_data=False,
                                    only=[("variant", [variant]), ("seed", [str(seed)]), ("target", [target])]).runs)
    config = run.config.to_dict()
    config["hparams"] = simulation_noise(METHODS.get(run.config.method).resolve(run.config.hparams))
    config["selection"] = run.config.resolved_selection()
    return config


def _finished_run(root: Path, target: str, seed: int, acc: float, variant: str = "dsgd",
                  environment: dict | None = None, config: dict | None = None) -> Path:
    run = root / variant / "dataset=digits4" / f"seed{seed}" / target
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config or {"method": "dsgd", "dataset": "digits4", "seed": seed,
                                                           "rounds": 16, "targets": [target], "device": "auto",
                                                           "source": None}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "source_val_acc": {"syn": 0.8, "optdigits": 0.6},
                                                   "target_acc": {target: acc}}) + "\n")
    (run / "summary.json").write_text(json.dumps({
        "method": "dsgd", "label": "DSGD", "dataset": "digits4", "seed": seed, "selection": "source_val",
        "selected_round": 1, "targets": {target: {"selected": acc, "last": acc}}, "seconds": 2.5,
        **(environment or {})}))
    (run / "done").touch()
    return run


def test_export_merges_a_sweeps_finished_runs_into_the_tables_csv(tmp_path):
    table = load_table("p2p")
    csv_dir = tmp_path / "csv"
    write_rows(csv_path(table, csv_dir), [_line(variant="dsgd", seed=5, acc="10.00", label="DSGD")], COLUMNS)
    root = tmp_path / "runs"
    own = lambda seed, target: _table_config(table, root, "dsgd", seed, target)  # noqa: E731
    _finished_run(root, "mnist", 0, 0.625, environment={"environment": {"device": "cpu"}}, config=own(0, "mnist"))
    _finished_run(root, "syn", 0, 0.75, environment={"environment": {"device": "cuda"},
                                                      "environment_resumed": {"device": "cpu"}}, config=own(0, "syn"))
    _finished_run(root, "optdigits", 0, 0.25, config=own(0, "optdigits"))  # no environment recorded (older runs)
    stranger = _finished_run(root, "mnist", 0, 0.5, variant="not-a-row")
    (root / "dsgd" / "dataset=digits4" / "seed1" / "mnist").mkdir(parents=True)  # unfinished: no summary
    said = []
    path, added = export_runs(table, root, csv_dir, echo=said.append)
    assert added == 3 and said == [f"p2p: left out {stranger}: not a run folder of the table's grid below {root}"]
    lines = read_rows(path)
    assert [(l["seed"], l["target"], l["target_acc"], l["source_val"], l["variant"], l["rounds"], l["device"])
            for l in lines] == [("0", "mnist", "62.50", "70.00", "dsgd", "16", "cpu"),
                                ("5", "mnist", "10.00", "80.00", "dsgd", "16", "cpu"),
                                ("0", "optdigits", "25.00", "70.00", "dsgd", "16", "auto"),
                                ("0", "syn", "75.00", "70.00", "dsgd", "16", "cuda+cpu")]
    assert list(lines[0]) == list(COLUMNS)
    with pytest.raises(ConfigError, match="no folder of runs"):
        export_runs(table, tmp_path / "nothing", csv_dir)


@pytest.mark.parametrize("change, named", [({"method": "fedavg"}, "method ('fedavg' there, 'dsgd' here)"),
                                           ({"local_steps": 1}, "local_steps (1 there, 15 here)")])
def test_export_refuses_a_run_of_other_settings_and_merges_nothing(tmp_path, change, named):
    """A run folder of the table's grid holding another experiment (another method, fewer steps: `fedstyle sweep
    FILE --set local_steps=1`) would replace a kept line with its numbers; export refuses, naming the setting."""
    table = load_table("p2p")
    csv_dir, root = tmp_path / "csv", tmp_path / "runs"
    kept = [_line(variant="dsgd", seed=0, acc="94.56", label="DSGD")]
    write_rows(csv_path(table, csv_dir), kept, COLUMNS)
    before = csv_path(table, csv_dir).read_text()
    _finished_run(root, "syn", 0, 0.7, config=_table_config(table, root, "dsgd", 0, "syn"))
    _finished_run(root, "mnist", 0, 0.1, config={**_table_config(table, root, "dsgd", 0, "mnist"), **change})
    with pytest.raises(ConfigError, match=rf"holds a run made with other settings \({re.escape(named)}.*Nothing "
                                          r"was merged"):
        export_runs(table, root, csv_dir)
    assert csv_path(table, csv_dir).read_text() == before


def test_export_checks_runs_against_the_sweeps_set(tmp_path):
    """`leaderboard run --set local_steps=1 --csv-dir D` trained its runs, then its export refused them as "other
    settings" (it planned the table without the --set); export takes the --set the runs were made with."""
    table = load_table("p2p")
    root, csv_dir = tmp_path / "runs", tmp_path / "csv"
    changed = [("local_steps", 1)]
    _finished_run(root, "syn", 0, 0.7, config=_table_config(table, root, "dsgd", 0, "syn", overrides=changed))
    with pytest.raises(ConfigError, match=r"local_steps \(1 there, 15 here\)"):
        export_runs(table, root, csv_dir)
    path, added = export_runs(table, root, csv_dir, overrides=changed)
    assert added == 1 and [l["target"] for l in read_rows(path)] == ["syn"]


def test_export_reads_no_images(tmp_path, monkeypatch):
    """Checking the runs' settings needs the grid, not the datasets (fashion4's idx files may be elsewhere)."""
    import fedstyle.experiments.build as build

    def no_data(*_args, **_kwargs):
        raise AssertionError("export loaded a dataset")

    table = load_table("p2p")
    root = tmp_path / "runs"
    _finished_run(root, "syn", 0, 0.7, config=_table_config(table, root, "dsgd", 0, "syn"))
    monkeypatch.setattr(build, "load_config_dataset", no_data)
    assert export_runs(table, root, tmp_path / "csv")[1] == 1


def test_export_takes_one_budget_per_folder(tmp_path):
    table = load_table("p2p")
    root = tmp_path / "runs"
    _finished_run(root, "syn", 0, 0.7, config=_table_config(table, root, "dsgd", 0, "syn"))
    _finished_run(root, "mnist", 0, 0.7, config=_table_config(table, root, "dsgd", 0, "mnist", rounds=8))
    with pytest.raises(ConfigError, match="holds runs of 8 and 16 rounds; export the runs of each budget"):
        export_runs(table, root, tmp_path / "csv")
    single = _finished_run(tmp_path / "one", "syn", 0, 0.7)  # a single run folder given as the sweep's folder
    path, added = export_runs(table, single, tmp_path / "csv", echo=lambda line: None)
    assert added == 0


def test_the_estimate_scales_each_row_by_the_references_whole_run():
    cost = CostModel({"tables": {"t": {"rows_one_round": {"fedavg": 2.0, "ccst": 6.0, "dsu": 3.0},
                                       "reference": "fedavg", "reference_whole": 20.0, "reference_one_round": 2.0,
                                       "reference_rounds": 8}}})
    assert cost.seconds("t", "ccst") == pytest.approx(60.0)
    assert cost.seconds("t", "ccst", rounds=16) == pytest.approx(120.0)
    unmeasured: set[str] = set()
    assert cost.seconds("t", "newmethod", unmeasured) == pytest.approx(30.0)  # the median row, 3.0 x 10
    assert unmeasured == {"newmethod"}
    with pytest.raises(ConfigError, match="no measurement of table 'p2p'"):
        cost.seconds("p2p", "dsgd")
    per_dataset = CostModel({"tables": {"t": {**cost.tables["t"], "reference_whole": {"d1": 20.0, "d2": 50.0}}}})
    assert per_dataset.seconds("t", "ccst", dataset="d1") == pytest.approx(60.0)
    assert per_dataset.seconds("t", "ccst", rounds=16, dataset="d2") == pytest.approx(300.0)
    with pytest.raises(ConfigError, match="no whole run of table 't' on 'd3'"):
        per_dataset.seconds("t", "ccst", dataset="d3")


def test_finished_cpu_runs_replace_the_estimate_for_their_row_dataset_and_rounds():
    cost = CostModel({"tables": {"t": {"rows_one_round": {"fedavg": 2.0, "feddg_ga": 4.0},
                                       "reference": "fedavg", "reference_whole": {"d1": 20.0, "d2": 50.0},
                                       "reference_one_round": 2.0, "reference_rounds": 8}}})
    cost.learn_finished("t", [
        {"variant": "feddg_ga", "dataset": "d2", "rounds": "8", "device": "cpu", "seconds": s}
        for s in ("900", "1000", "1300")] + [
        {"variant": "feddg_ga", "dataset": "d2", "rounds": "8", "device": "cuda", "seconds": "10"},  # not a CPU's
        {"variant": "feddg_ga", "dataset": "d2", "rounds": "16", "device": "cpu", "seconds": "5000"},
    ])
    how: dict[str, set[str]] = {}
    assert cost.seconds("t", "feddg_ga", rounds=8, dataset="d2", how=how) == pytest.approx(1000.0)  # the median
    assert how == {"feddg_ga": {"finished"}}
    assert cost.seconds("t", "feddg_ga", rounds=8, dataset="d1", how=how) == pytest.approx(40.0)  # none on d1
    assert cost.seconds("t", "feddg_ga", rounds=16, dataset="d2") == pytest.approx(5000.0)
    assert cost.seconds("t", "fedavg", rounds=8, dataset="d2", how=how) == pytest.approx(50.0)
    assert how == {"feddg_ga": {"finished", "estimate"}, "fedavg": {"estimate"}}


def test_the_committed_estimate_measures_every_row():
    cost = CostModel.load(GRID_DIR / "cost.json")
    for table in load_tables():
        for variant, _, _ in table.rows():
            assert variant in cost.tables[table.key]["rows_one_round"], (table.key, variant)
        # a whole run of the reference on every dataset (fashion4's evaluation costs more than digits4's)
        assert set(cost.tables[table.key]["reference_whole"]) == set(read_datasets()), table.key
    assert set(cost.tables) == set(read_meta())

# ----------------------------------------------------------------------------- rendering from made-up CSVs

from fedstyle.experiments.leaderboard.board import build_board  # noqa: E402
from fedstyle.experiments.verdict import NOT_LEARNED_STATUS, judge_paired  # noqa: E402

#: two made-up datasets: 5 cells (autorank's least), chance 10 % and 50 %
SMALL_DATASETS = {"d1": {"classes": 10, "domains": ["a", "b", "c"]}, "d2": {"classes": 2, "domains": ["x", "y"]}}
SMALL_TABLE = """
description = "a made-up table"
seeds = [0, 1, 2]
targets = "each"
dataset = ["d1", "d2"]
[base]
rounds = 4
[[variant]]
name = "a"
label = "A"
method = "fedavg"
[[variant]]
name = "b"
label = "B"
method = "mixstyle"
[[variant]]
name = "c"
label = "C"
method = "dsu"
[[variant]]
name = "dull"
label = "Dull"
method = "fedprox"
[[variant]]
name = "short"
label = "Short"
method = "ccst"
"""
CELLS = [("d1", "a"), ("d1", "b"), ("d1", "c"), ("d2", "x"), ("d2", "y")]
#: A's accuracy per cell index and seed; B = A - 1 +- 2 (a gap within noise), C = A - 10 (+- 0.5: below)
A_ACC = [[60.0, 62.0, 64.0], [50.0, 51.0, 55.0], [70.0, 70.0, 73.0], [80.0, 83.0, 86.0], [65.0, 60.0, 61.0]]
B_NOISE = [2.0, -2.0, 1.0]
C_NOISE = [0.5, -0.5, 0.0]


def _small_lines():
    lines = []
    for i, (dataset, target) in enumerate(CELLS):
        for seed in range(3):
            a = A_ACC[i][seed]
            for variant, acc, sv in (("a", a, 80.0), ("b", a - 1 + B_NOISE[seed], 81.0),
                                     ("c", a - 10 + C_NOISE[seed], 79.0),
                                     ("dull", a, 15.0 if dataset == "d1" else 90.0)):
                lines.append(_line(variant, dataset, target=target, seed=seed, acc=f"{acc:.2f}", rounds=4,
                                   source_val=f"{sv:.2f}", label=variant))
            if (dataset, target) != ("d2", "y"):
                lines.append(_line("short", dataset, target=target, seed=seed, acc="99.00", rounds=4, label="short"))
    lines.append(_line("a", "d1", target="a", seed=0, acc="1.00", rounds=8))  # another budget: left out
    return lines


def _row(board, variant):
    return next(r for r in board.rows if r.variant == variant)


@pytest.fixture(scope="module")
def small_board():
    return build_board("multi_source", "Small", "target", SMALL_TABLE, _small_lines(), SMALL_DATASETS)


def test_a_board_averages_cells_over_seeds_and_finds_the_best(small_board):
    board = small_board
    a, b, c = (_row(board, v) for v in "abc")
    assert [cell.name for cell in board.cells] == [f"{d} → {t}" for d, t in CELLS]
    cell_means = [sum(row) / 3 for row in A_ACC]
    assert a.cell_mean(board.cells[0]) == pytest.approx(62.0)
    assert a.cell_std(board.cells[0]) == pytest.approx(2.0)
    assert a.average == pytest.approx(sum(cell_means) / 5)
    assert a.dataset_average["d2"] == pytest.approx((83.0 + 62.0) / 2)
    assert b.average == pytest.approx(a.average - 1 + sum(B_NOISE) / 3)
    assert a.source_val_mean() == pytest.approx(80.0)
    assert board.best is a and a.versus_best is None
    assert board.other_budget_lines == 1
    # the paired rule against the best, over the 15 (cell, seed) pairs
    assert b.versus_best.status == "within noise" and b.tied
    assert b.versus_best.n == 15
    assert c.versus_best.status == "holds" and not c.tied
    assert c.versus_best.mean == pytest.approx(10.0)


def test_a_row_that_did_not_learn_or_misses_cells_is_not_ranked(small_board):
    board = small_board
    dull, short = _row(board, "dull"), _row(board, "short")
    assert dull.not_learned_on == ["d1"] and not dull.ranked  # 15 % is within 10 points of d1's chance (10 %)
    assert dull.average == pytest.approx(_row(board, "a").average)  # as good as the best on the targets, yet unranked
    assert not short.complete and not short.ranked and short.average is None
    (missing,) = board.missing
    assert missing.variant == "short" and [(c.name, s) for c, s in missing.pairs] == [("d2 → y", 0), ("d2 → y", 1),
                                                                                      ("d2 → y", 2)]
    assert missing.command == "fedstyle leaderboard run --only multi_source --only variant=short"
    # ranked rows best first, then the others by method (the registry's order: ccst before fedprox)
    assert [r.variant for r in board.ordered_rows()] == ["a", "b", "c", "short", "dull"]


def test_ranks_friedman_and_the_critical_difference_follow_demsar(small_board):
    ranks = small_board.friedman
    # A beats B in every cell's mean? B's mean per cell is A's - 1 + 1/3 (seed noise sums to 1): A first, C last
    assert ranks.mean_ranks == {"A": pytest.approx(1.0), "B": pytest.approx(2.0), "C": pytest.approx(3.0)}
    # Friedman's chi2 with every block ranking alike: N (k - 1) = 10 on k - 1 = 2 dof: p = exp(-5)
    assert ranks.pvalue == pytest.approx(math.exp(-5.0), rel=1e-6)
    # Demsar's Eq. 5: CD = q_0.05 sqrt(k (k + 1) / (6 N)), q_0.05 = 2.343 for k = 3 (his Table 5a)
    assert ranks.cd == pytest.approx(2.343 * math.sqrt(3 * 4 / (6 * 5)), abs=2e-3)


def test_two_ranked_rows_get_no_friedman_test_and_no_crash(small_board):
    """With 2 rows autorank leaves Friedman and Nemenyi for a paired test and returns no critical difference (a
    peer-to-peer table with two complete rows crashed `leaderboard show`): ranks need 3 rows."""
    from types import SimpleNamespace

    from fedstyle.experiments.leaderboard.ranks import rank_rows

    two = SimpleNamespace(rows=[r for r in small_board.rows if r.label in ("A", "B")], cells=small_board.cells)
    assert sum(r.ranked for r in two.rows) == 2
    result = rank_rows(two)
    assert result.pvalue is None and result.cd is None and "ranks need 3 ranked rows" in result.text()


def test_the_table_renders_the_same_numbers_in_markdown_csv_and_latex(small_board):
    from fedstyle.experiments.leaderboard.render import csv_table, latex_table, markdown_table

    md = markdown_table(small_board)
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines()[2:]}
    assert f"**{_row(small_board, 'a').average:.1f}**" in rows["A"] and "| best |" in rows["A"]
    v = _row(small_board, "b").versus_best
    assert f"tied: {v.mean:+.1f} [{v.low:+.1f}, {v.high:+.1f}]" in rows["B"]
    assert "below: +10.0" in rows["C"]
    assert "not learned (d1): not ranked" in rows["Dull"] and "cells missing: not ranked" in rows["Short"]
    assert "| 62.0 ± 2.0 |" in rows["A"]
    compact = markdown_table(small_board, compact=True).splitlines()
    assert compact[0] == "| Method | Rank | d1 avg | d2 avg | Avg | Src-val | Seeds | vs best |"
    assert compact[2].startswith(f"| A | 1.00 | {_row(small_board, 'a').dataset_average['d1']:.1f} |")
    text = csv_table(small_board)
    header, first = text.splitlines()[:2]
    assert header.startswith("method,label,rank,d1 → a mean,d1 → a std,d1 → a seeds")
    assert first.startswith("fedavg,A,1.0000,62.0000,2.0000,3,")
    tex = latex_table(small_board)
    assert r"\textbf{" + f"{_row(small_board, 'a').average:.1f}" + "}" in tex and r"62.0 $\pm$ 2.0" in tex


def test_single_source_cells_average_a_sources_targets():
    table = SMALL_TABLE.replace('targets = "each"\ndataset = ["d1", "d2"]',
                                'source_domain = [{ name = "d1-a", dataset = "d1", source = "a" }]')
    lines = [_line("a", "d1", source="a", target=t, seed=s, acc=acc, rounds=4, source_val="70.00")
             for s in range(3) for t, acc in (("b", "40.00"), ("c", "60.00"))]
    board = build_board("single_source", "S", "source", table, lines, SMALL_DATASETS, rank=False)
    assert [c.name for c in board.cells] == ["d1: a →"]
    a = _row(board, "a")
    assert a.values == {("d1: a →", 0): 50.0, ("d1: a →", 1): 50.0, ("d1: a →", 2): 50.0}
    assert a.source_val == {"d1": [70.0, 70.0, 70.0]}  # once per run, not once per target


def test_cliques_join_rows_closer_than_the_critical_difference():
    from fedstyle.experiments.leaderboard.cdplot import cliques

    assert cliques([1.0, 1.5, 2.2, 4.0, 4.1], 1.0) == [(0, 1), (1, 2), (3, 4)]
    assert cliques([1.0, 3.0], 1.0) == []


def test_the_diagram_is_written_as_png_and_pdf(tmp_path, small_board):
    from fedstyle.experiments.leaderboard.cdplot import draw_cd

    paths = draw_cd(small_board.friedman, "t", [tmp_path / "cd.png", tmp_path / "cd.pdf"])
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and paths[1].read_bytes()[:4] == b"%PDF"


def test_claims_are_judged_by_the_rule_on_each_set_of_results(tmp_path, small_board):
    from fedstyle.experiments.leaderboard.claims import claim_rows

    (tmp_path / "claims.toml").write_text(
        '[[paper]]\nname = "CCST"\npreset = "ccst"\npreset_claim = "ccst-overall-k3 > fedavg"\n'
        'leaderboard = { table = "multi_source", says = "a > c > dull" }\n'
        'pretrained = { csv = ["pre"], says = "P > Q > R" }\n'
        'preset_runs = { csv = [], says = "", why = "no such run" }\n')
    lines = []
    for seed, (p, q) in enumerate(((50.0, 40.0), (52.0, 41.0), (49.0, 45.0))):
        for label, acc in (("P", p), ("Q", q)):
            lines.append(_line(label.lower(), "d1", target="a", seed=seed, acc=f"{acc:.2f}", label=label))
    write_rows(tmp_path / "pre.csv", lines, COLUMNS)
    (row,) = claim_rows({"multi_source": small_board}, tmp_path, tmp_path, {"d1": 10, "d2": 2})
    assert row.headline == "ccst-overall-k3 > fedavg" and row.source  # the preset's claim and its source
    a_c, c_dull = row.leaderboard.links
    assert a_c.status == "holds" and a_c.verdict.n == 15
    assert c_dull.status.startswith(NOT_LEARNED_STATUS) and "dull" in c_dull.status
    p_q, q_r = row.pretrained.links
    expected = judge_paired({("d1 → a", s): v for s, v in enumerate((50.0, 52.0, 49.0))},
                            {("d1 → a", s): v for s, v in enumerate((40.0, 41.0, 45.0))})
    assert (p_q.status, p_q.verdict.mean) == (expected.status, pytest.approx(expected.mean))
    assert q_r.status == "not judged (its files have no row of R)"
    assert row.preset_runs.text() == "not judged (no such run)"
    assert "`benchmarks/per_seed/pre.csv`" in row.evidence()

# ----------------------------------------------------------------------------- the committed page and CSVs


def test_the_datasets_classes_and_domains_are_the_datas():
    from fedstyle.data import digits4, fashion4

    datasets = read_datasets()
    assert datasets["digits4"] == {"classes": len(digits4.CLASSES), "domains": digits4.DOMAINS}
    assert datasets["fashion4"] == {"classes": len(fashion4.CLASSES), "domains": fashion4.DOMAINS}


@pytest.fixture(scope="module")
def committed():
    from fedstyle.experiments.leaderboard.claims import claim_rows
    from fedstyle.experiments.leaderboard.page import load_boards

    boards = load_boards()
    classes = {name: d["classes"] for name, d in read_datasets().items()}
    return boards, claim_rows(boards, GRID_DIR, CSV_DIR, classes)


def test_the_committed_page_is_a_fresh_rendering(committed):
    from fedstyle.experiments.leaderboard.page import DEFAULT_OUT, PAGE, page_budget, render_page

    boards, claims = committed
    page = DEFAULT_OUT / PAGE
    assert page.read_text() == render_page(boards, claims, page_budget(boards)), \
        "run `fedstyle leaderboard show` and commit its output"


def test_the_claims_table_agrees_with_the_csvs(committed):
    """Each verdict of the claims at a glance, re-read from the per-seed files by per_seed.py's path."""
    import tomllib

    from fedstyle.experiments.report.per_seed import accuracies

    _, rows = committed
    papers = {p["name"]: p for p in tomllib.loads((GRID_DIR / "claims.toml").read_text())["paper"]}
    assert [r.paper for r in rows] == ["CCST", "StableFDG", "PARDON", "FedGCA", "StyleDDG", "FedIIR", "FedOMG",
                                       "FedCCRL", "gPerXAN"]
    for row in rows:
        for key, judgement in (("pretrained", row.pretrained), ("preset_runs", row.preset_runs)):
            entry = papers[row.paper][key]
            if not entry["csv"]:
                assert judgement.text().startswith("not judged")
                continue
            lines = [l for name in entry["csv"] for l in read_rows(CSV_DIR / f"{name}.csv")]
            labels = {l["label"] for l in lines}
            for link in judgement.links:
                if link.better not in labels or link.worse not in labels:
                    assert link.status.startswith("not judged")
                    continue
                if link.status.startswith(NOT_LEARNED_STATUS):
                    continue
                expected = judge_paired(accuracies(lines, link.better), accuracies(lines, link.worse))
                assert link.status == expected.status, (row.paper, key, link.better, link.worse)
                assert link.verdict.n == expected.n


def test_readme_table_is_the_rendering():
    from fedstyle.experiments.leaderboard.page import README_END, README_START, readme_block

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    inside = readme.split(README_START, 1)[1].split(README_END, 1)[0]
    assert readme_block().strip() == inside.strip(), ("the README's table is not the rendering of the committed "
                                                      "CSVs: run `fedstyle leaderboard show --readme README.md`")


def test_results_md_says_who_leads_each_benchmark_as_rendered():
    """benchmarks/RESULTS.md names each benchmark's leader, its ties and the grid's run time (issue 51): the block is
    the rendering of the committed CSVs."""
    from fedstyle.experiments.leaderboard.page import RESULTS_END, RESULTS_START, load_boards, results_leaders

    results = (Path(__file__).resolve().parents[1] / "benchmarks" / "RESULTS.md").read_text()
    inside = results.split(RESULTS_START, 1)[1].split(RESULTS_END, 1)[0]
    assert results_leaders(load_boards()).strip() == inside.strip(), ("benchmarks/RESULTS.md's leaders are not the "
                                                                       "rendering: run `fedstyle leaderboard show`")


def test_results_leaders_name_the_leader_its_ties_and_the_run_time(small_board, tmp_path):
    from fedstyle.experiments.leaderboard.page import RESULTS_END, RESULTS_START, results_leaders, write_show

    text = results_leaders({"multi_source": small_board})
    # A leads both benchmarks; B is tied with it on each (its per-seed noise), C below; "short" misses d2 → y x 3
    assert "| [Small](../docs/results/leaderboard.md#small) | d1 | **A** (61.7) | B (61.0; +0.7 [-0.7, +2.1]) |" in text
    assert "| d2 | **A** (72.5) | B (71.8;" in text and "C (" not in text
    assert "| Small | 72 of 75 | 72 runs on cpu, 0.0 h |" in text
    # write_show fills the block of the RESULTS.md two levels above the pages it writes, as the method cards beside
    (tmp_path / "benchmarks").mkdir()
    results = tmp_path / "benchmarks" / "RESULTS.md"
    results.write_text(f"# Results\n\n{RESULTS_START}\nstale block\n{RESULTS_END}\n")
    written = write_show(tmp_path / "docs" / "results", figures=False)
    assert results in written and "stale block" not in results.read_text() and "Who leads" in results.read_text()


def test_show_into_a_relative_folder_without_two_levels_above_it(tmp_path, monkeypatch):
    """`--out out` (a folder with no parents of its own) renders: the RESULTS.md two levels up is looked for from
    the resolved path, and there is none."""
    from fedstyle.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["leaderboard", "show", "--out", "out", "--no-figures", "--quiet"]) == 0
    assert (tmp_path / "out" / "leaderboard.md").is_file()


def test_the_readme_summary_counts_runs_and_places_rows_by_the_rule(small_board, monkeypatch):
    from fedstyle.experiments.leaderboard.page import readme_summary

    monkeypatch.setattr(small_board, "csv", "small")
    text = readme_summary(small_board)
    done = small_board.runs_expected() - small_board.runs_missing()
    assert text.startswith(f"{done} of the table's {small_board.runs_expected()} runs are in "
                           "`benchmarks/per_seed/small.csv`")
    assert "--dry-run" in text  # Short misses cells
    # A is best; B is tied with it, C below (test_a_board_averages_cells_over_seeds_and_finds_the_best)
    assert "On 15 pairs, the rule ties 1 row with A (B) and puts 1 below it." in text


def test_show_renders_without_torch(tmp_path):
    """`fedstyle leaderboard show`'s work imports no torch (a user without a GPU stack renders in seconds)."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from fedstyle.experiments.leaderboard.page import write_show; "
            f"write_show(Path({str(tmp_path)!r}), figures=False); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
    assert (tmp_path / "leaderboard.md").exists()


def test_show_prints_the_tables_and_claims_before_the_files(tmp_path, capsys):
    """`fedstyle leaderboard show` answers "which method?" in the terminal (it printed 13 file paths only)."""
    from fedstyle.cli.main import main
    from fedstyle.experiments.leaderboard.page import benchmark_leaders, load_boards

    assert main(["leaderboard", "show", "--out", str(tmp_path), "--no-figures"]) == 0
    out = capsys.readouterr().out
    boards = load_boards()
    for board in boards.values():  # each table with its runs, its best row first
        done = board.runs_expected() - board.runs_missing()
        assert f"{board.title} ({done} of {board.runs_expected()} runs)" in out
        first = out.split(f"{board.title} (", 1)[1].splitlines()[2]
        assert first.startswith(board.best.label) and " best " in first
        assert first.rstrip().endswith(board.best.versus_reference.interval())  # then its verdict against FedAvg
    assert "The papers' claims" in out and "  CCST: CCST > FedAvg: " in out and "**" not in out
    for board in boards.values():  # then each benchmark's leader, as the page's table has it
        for dataset, leads, _ in benchmark_leaders(board):
            assert f"\n{dataset}: {leads.replace('**', '')} leads; the rule " in out
    assert out.index("The papers' claims") < out.index(f"wrote {tmp_path / 'leaderboard.md'} and 6 files beside it")
    assert main(["leaderboard", "show", "--out", str(tmp_path), "--no-figures", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'leaderboard.md'}")


def test_the_vs_baseline_column_is_the_rule_against_the_tables_reference_row():
    from fedstyle.experiments.leaderboard.page import against_reference_line
    from fedstyle.experiments.leaderboard.render import markdown_table, text_table
    from fedstyle.experiments.verdict import judge_paired

    board = build_board("multi_source", "Small", "target", SMALL_TABLE, _small_lines(), SMALL_DATASETS, reference="c")
    a, b, c = (_row(board, v) for v in "abc")
    assert board.reference is c and c.versus_reference is None
    for row in (a, b):  # this row > the baseline, over their (cell, seed) pairs
        assert row.versus_reference == judge_paired(row.values, c.values)
    assert a.versus_reference.status == "holds" and a.versus_reference.mean == pytest.approx(10.0)
    table = markdown_table(board)
    assert table.splitlines()[0].endswith("| vs best | vs C |") and table.splitlines()[1].endswith("|:--|:--|")
    assert f"| best | above: {a.versus_reference.interval()} |" in table and "| baseline |" in table
    assert text_table(board).splitlines()[1].endswith(f"above: {a.versus_reference.interval()}")
    assert against_reference_line(board) == [
        "Against C (the vs C column): 2 of the 2 other ranked rows are above it by the rule, 0 tied with it, "
        "0 below it."]
    # no reference: no column (a table of tables.toml always names one)
    assert "vs C" not in markdown_table(build_board("multi_source", "Small", "target", SMALL_TABLE, _small_lines(),
                                                     SMALL_DATASETS))
    with pytest.raises(ConfigError, match="reference row 'nope'"):
        build_board("multi_source", "Small", "target", SMALL_TABLE, _small_lines(), SMALL_DATASETS, reference="nope")


def test_the_text_table_aligns_the_readmes_columns(small_board):
    from fedstyle.experiments.leaderboard.render import text_table

    lines = text_table(small_board).splitlines()
    assert lines[0].split() == ["Method", "Rank", "d1", "avg", "d2", "avg", "Avg", "Src-val", "Seeds", "vs", "best"]
    end = lines[0].index(" Avg ") + len(" Avg")  # numbers are right-aligned under their header
    for line, row in zip(lines[1:], small_board.ordered_rows()):
        if row.average is not None:
            assert line[end - len(f"{row.average:.1f}"):end] == f"{row.average:.1f}" and line[end] == " "
    assert lines[1].startswith("A ") and lines[1].endswith("best") and "**" not in lines[1]


def test_per_benchmark_leaders_and_the_run_time_behind_a_table(small_board):
    from fedstyle.experiments.leaderboard.board import dataset_leaders

    best, tied = dataset_leaders(small_board, "d1")
    # on d1's 9 pairs B trails A by 1 - noise = -1, 3, 0 per cell: the interval holds 0; C trails by 10
    assert best.variant == "a" and [r.variant for r in tied] == ["b"]
    assert small_board.run_time == {"cpu": [4 * 15 + 12, pytest.approx(72.0)]}  # one per run, 1 s each


def test_the_budget_paragraph_rereads_the_rule_from_the_runs():
    from fedstyle.experiments.leaderboard.page import budget_text

    rule = {"csv": "b", "candidates": [8, 16], "cap": 32, "gain": 1.0}

    def runs(values):  # (dataset, rounds) -> source validation of its one target
        return [_line("fedavg", d, target="t", rounds=r, source_val=f"{v:.2f}") for (d, r), v in values.items()]

    still_gaining = runs({("d1", 8): 70.0, ("d1", 16): 80.0, ("d1", 32): 85.0, ("d2", 8): 60, ("d2", 16): 60.5,
                          ("d2", 32): 61.0})
    text = budget_text(rule, still_gaining, 32)
    assert "| Benchmark | 8 rounds | 16 rounds | 32 rounds | gain 8→16 | gain 16→32 |" in text
    assert "| d1 | 70.0 | 80.0 | 85.0 | +10.0 | +5.0 |" in text and "| d2 | 60.0 | 60.5 | 61.0 | +0.5 | +0.5 |" in text
    assert "It gives **32**, its cap." in text
    flat = runs({("d1", 8): 70.0, ("d1", 16): 70.5, ("d1", 32): 71.0, ("d2", 8): 60, ("d2", 16): 60.5,
                 ("d2", 32): 61.0})
    assert "It gives **8**. The tables use 32: rerun the budget or change `rounds`." in budget_text(rule, flat, 32)
    # the cap's reason, when tables.toml gives one, is said where the rule stops at the cap, and only there
    rule["cap_why"] = "the grid's cost"
    assert budget_text(rule, still_gaining, 32).endswith(" Why a cap: the grid's cost.")
    assert "Why a cap" not in budget_text(rule, flat, 32)


def test_show_refuses_before_writing_anything(tmp_path, capsys):
    """A missing or markerless --readme, a damaged CSV or TOML: one line, and no page, figure or folder written
    (the README's refusal came after every table had been written)."""
    import shutil

    from fedstyle.cli.main import main

    out = tmp_path / "out"
    readme = tmp_path / "README.md"
    assert main(["leaderboard", "show", "--out", str(out), "--readme", str(readme)]) == 2
    assert f"--readme {readme}: no such file" in capsys.readouterr().err
    readme.write_text("# no markers\n")
    assert main(["leaderboard", "show", "--out", str(out), "--readme", str(readme)]) == 2
    assert "has no <!-- leaderboard:start --> ... <!-- leaderboard:end --> markers" in capsys.readouterr().err
    grid = tmp_path / "grid"
    shutil.copytree(GRID_DIR, grid)
    with open(grid / "tables.toml", "a") as handle:
        handle.write("[[[not toml\n")
    assert main(["leaderboard", "show", "--out", str(out), "--grid-dir", str(grid)]) == 2
    assert f"{grid / 'tables.toml'} is not valid TOML: " in capsys.readouterr().err
    csv_dir = tmp_path / "csv"
    shutil.copytree(CSV_DIR, csv_dir)
    p2p = csv_dir / "leaderboard-p2p.csv"
    p2p.write_text(p2p.read_text().replace("target_acc", "acc", 1))
    assert main(["leaderboard", "show", "--out", str(out), "--csv-dir", str(csv_dir)]) == 2
    assert f"{p2p} has no column target_acc" in capsys.readouterr().err
    assert not out.exists()
    # a results page (or the README) whose generated block has lost its end marker: refused before any write
    out.mkdir()
    (out / "topic.md").write_text("<!-- leaderboard-claim:CCST:start -->\nold line\n")
    readme.write_text("<!-- leaderboard:start -->\n<!-- leaderboard:end -->\n<!-- readme-claims:start -->\n")
    assert main(["leaderboard", "show", "--out", str(out), "--no-figures"]) == 2
    assert "<!-- leaderboard-claim:CCST:start --> has no <!-- leaderboard-claim:CCST:end --> after it" \
        in capsys.readouterr().err
    (out / "topic.md").write_text("no markers\n")
    assert main(["leaderboard", "show", "--out", str(out), "--no-figures", "--readme", str(readme)]) == 2
    assert "<!-- readme-claims:start --> has no <!-- readme-claims:end -->" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["topic.md"]  # nothing written


def test_the_readme_update_replaces_what_lies_between_the_markers(tmp_path):
    from fedstyle.experiments.leaderboard.page import README_END, README_START, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_START}\nold table\n{README_END}\nrest\n")
    assert update_readme(readme, "| new |\n")
    assert readme.read_text() == f"intro\n{README_START}\n| new |\n{README_END}\nrest\n"
    assert not update_readme(readme, "| new |")
    readme.write_text("no markers\n")
    with pytest.raises(ConfigError, match="has no <!-- leaderboard:start -->"):
        update_readme(readme, "| t |")


def test_the_dry_run_counts_runs_and_adds_up_the_estimate():
    from fedstyle.experiments.leaderboard.run import TablePlan, dry_run_lines

    table = load_table("p2p")
    runs = [_run("dsgd", "digits4", s) for s in range(3)] + [_run("styleddg", "digits4", 0)]
    planned = TablePlan(table, plan=SimpleNamespace(runs=runs), in_csv=runs[:1], to_run=runs[1:])
    cost = {("dsgd", 1): 1500.0, ("dsgd", 2): 2100.0, ("styleddg", 0): 3600.0, ("dsgd", 0): 1800.0}

    def estimate(key, run, unmeasured, how):
        how.setdefault(run.variant, set()).add("finished" if run.variant == "dsgd" else "estimate")
        return cost[run.variant, run.config.seed]

    lines = dry_run_lines([planned], estimate)
    assert lines[0].startswith("p2p (Peer to peer): 4 runs, every one validated; 1 in leaderboard-p2p.csv, 3 left "
                               "(0 finished in their folders, to export; 0 to resume; 3 new)")
    assert lines[0].endswith("about 2.0 CPU hours left of 2.5")  # (1500 + 2100 + 3600) s left, + 1800 s done
    # a row's line gives the mean of its runs left, and where the figure comes from
    assert lines[1].split() == "dsgd 2 runs x 1800 CPU s (its finished runs' median)".split()
    assert lines[2].split() == "styleddg 1 runs x 3600 CPU s".split()
    assert lines[-1].startswith("all tables: about 2.0 CPU hours left of 2.5")


def test_run_refuses_changed_settings_into_the_kept_csvs(capsys):
    from fedstyle.cli.main import main

    assert main(["leaderboard", "run", "--set", "rounds=1"]) == 2
    assert "--set changes the tables' settings" in capsys.readouterr().err


@pytest.mark.parametrize("only, message", [
    ("variant=fedavgg", "--only variant=fedavgg: no leaderboard table has it; did you mean fedavg"),
    ("variant=zzzz", "--only variant=zzzz: no leaderboard table has it; the variant names: ccst, dsgd,"),
    ("colour=red", "--only colour=...: no leaderboard table crosses 'colour'; the keys: dataset,"),
    ("seed=9", "--only seed=9: the tables' seeds are 0, 1, 2"),
])
def test_run_refuses_an_only_value_no_table_has(capsys, only, message):
    """A misspelt row left every table without a run and the command with nothing to do, silently."""
    from fedstyle.cli.main import main

    assert main(["leaderboard", "run", "--only", only, "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_dry_run_checks_the_workers_too(capsys):
    from fedstyle.cli.main import main

    assert main(["leaderboard", "run", "--workers", "0", "--dry-run"]) == 2
    assert "--workers must be at least 1, got 0" in capsys.readouterr().err


def test_only_values_of_one_table_are_not_refused_by_the_others():
    from fedstyle.experiments.leaderboard.run import check_only

    grids = [load_table(key).grid([], None) for key in ("multi_source", "p2p")]
    check_only(grids, [("variant", ["fedavg", "styleddg"]), ("seed", ["2"]), ("target", ["mnist"])])
    with pytest.raises(ConfigError, match="variant=styleddg: no leaderboard table has it"):
        check_only(grids[:1], [("variant", ["fedavg", "styleddg"])])


def test_the_results_index_opens_with_the_generated_claims():
    """docs/results/index.md's claims at a glance are the rendering of the committed CSVs (issues 51 §3, 52 §3)."""
    from fedstyle.experiments.leaderboard.claims import claim_rows
    from fedstyle.experiments.leaderboard.page import (CLAIMS_END, CLAIMS_START, index_claims, load_boards)
    from fedstyle.experiments.leaderboard.tables import CSV_DIR, GRID_DIR, read_datasets

    index = (Path(__file__).resolve().parents[1] / "docs" / "results" / "index.md").read_text()
    assert index.index(CLAIMS_START) < index.index("## ", index.index("## Claims at a glance") + 3)  # it opens the page
    inside = index.split(CLAIMS_START, 1)[1].split(CLAIMS_END, 1)[0]
    boards = load_boards()
    classes = {name: int(d["classes"]) for name, d in read_datasets(GRID_DIR).items()}
    assert inside.strip() == index_claims(claim_rows(boards, GRID_DIR, CSV_DIR, classes)).strip(), (
        "docs/results/index.md's claims are not the rendering of the committed CSVs: run `fedstyle leaderboard show`")


def test_a_method_card_block_lists_its_rows_and_the_claims_on_them(small_board):
    """docs/methods/<method>.md's generated block: its rows (place among ranked rows, averages, standing) and
    every leaderboard link of a claim that names one of them, once, with each paper it comes from."""
    from fedstyle.experiments.leaderboard.cards import card_block
    from fedstyle.experiments.leaderboard.claims import ClaimRow, Judgement, Link
    from fedstyle.experiments.leaderboard.render import POSITION

    boards = {"multi_source": small_board}
    b, c = _row(small_board, "b"), _row(small_board, "c")
    verdict = judge_paired(b.values, c.values)
    link = Link("b", "c", verdict.status, verdict)
    empty = Judgement("", note="not judged (none)")
    claims = [ClaimRow("P1", "b > c", "", Judgement("b > c", [link]), empty, empty, table="multi_source"),
              ClaimRow("P2", "b > c", "", Judgement("b > c", [link]), empty, empty, table="multi_source"),
              ClaimRow("P3", "a > c", "", Judgement("a > c", [Link("a", "c", "holds", verdict)]), empty, empty,
                       table="multi_source")]
    block = card_block("mixstyle", boards, claims)  # the method of row b
    rows = [line for line in block.splitlines() if line.startswith("| Small |")]
    assert len(rows) == 1
    cells = [x.strip() for x in rows[0].strip("|").split("|")]
    assert cells[:3] == ["Small", "B", "2 of 3"]  # A, B, C ranked; Dull did not learn, Short misses cells
    assert cells[3:5] == [f"{b.dataset_average['d1']:.1f}", f"{b.dataset_average['d2']:.1f}"]
    assert cells[5] == f"{b.average:.1f}" and cells[-3] == "15 of 15" and cells[-2].startswith("tied: ")
    assert cells[-1] == "—"  # the small board names no baseline
    with_baseline = build_board("multi_source", "Small", "target", SMALL_TABLE, _small_lines(), SMALL_DATASETS,
                                reference="c")
    row = next(line for line in card_block("mixstyle", {"multi_source": with_baseline}, []).splitlines()
               if line.startswith("| Small |"))
    assert row.endswith(f"| C: {POSITION[verdict.status]}: {verdict.interval()} |")
    assert "| the baseline |" in card_block("dsu", {"multi_source": with_baseline}, [])  # row c's method
    assert f"- `b > c` (P1 and P2): {verdict.status} (" in block
    assert "a > c" not in block  # a claim that names none of its rows
    best = card_block("fedavg", boards, claims)
    assert f"**{_row(small_board, 'a').average:.1f}**" in best and "| best |" in best
    short = card_block("ccst", boards, [])
    assert "| — | " in short and "cells missing: not ranked" in short and "- none" in short
    assert "None: no leaderboard table" in card_block("styleddg", boards, claims)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_card_shows_its_leaderboard_rows_as_rendered(committed, name):
    from fedstyle.experiments.leaderboard.cards import CARD_END, CARD_START, card_block

    boards, claims = committed
    card = (Path(__file__).resolve().parents[1] / "docs" / "methods" / f"{name}.md").read_text()
    assert CARD_START in card and CARD_END in card, (
        f"docs/methods/{name}.md has no {CARD_START} ... {CARD_END} markers: add them under '## Expected results'")
    inside = card.split(CARD_START, 1)[1].split(CARD_END, 1)[0]
    assert inside.strip() == card_block(name, boards, claims).strip(), (
        f"docs/methods/{name}.md's leaderboard rows are not the rendering of the committed CSVs: run "
        "`fedstyle leaderboard show`")


def test_a_familys_leading_line_names_its_best_ranked_row_and_reads_it_against_the_reference(small_board):
    from fedstyle.experiments.leaderboard.leading import leading_line

    a, b, c = (_row(small_board, v) for v in "abc")
    # the family of B and C (mixstyle, dsu): B leads; against A (the reference) the rule reads B - A
    line = leading_line(small_board, {"mixstyle", "dsu"}, "a")
    v = judge_paired(b.values, a.values)
    assert line.startswith(f"Leading here on the leaderboard (small): B, average {b.average:.1f}.")
    assert f"Its gain over A: {v.status}, {v.mean:+.1f} points, CI [{v.low:+.1f}, {v.high:+.1f}], 15 pairs." in line
    # the reference leads its own family: no comparison; a family without a ranked row says so
    assert leading_line(small_board, {"fedavg", "dsu"}, "a") == f"Leading here on the leaderboard (small): A, " \
                                                                 f"average {a.average:.1f}."
    assert "No row of this family is ranked" in leading_line(small_board, {"fedprox", "ccst"}, "a")  # Dull, Short


def test_a_family_names_one_table():
    from fedstyle.experiments.leaderboard.leading import family_tables

    assert family_tables({"t1": {"families": ["x"]}, "t2": {"families": ["y"]}}) == {"x": "t1", "y": "t2"}
    with pytest.raises(ConfigError, match="family 'x' is in both"):
        family_tables({"t1": {"families": ["x"]}, "t2": {"families": ["x"]}})


def test_the_readmes_leading_lines_are_the_rendering_for_every_family(committed):
    """README.md's "leading here" line under each method family is the rendering of the committed CSVs, and every
    family of the registry has its line (a table in tables.toml and markers in the README)."""
    from fedstyle.experiments.leaderboard.leading import family_tables, markers, readme_lines

    boards, _ = committed
    family_of = {name: METHODS.get(name).family for name in METHODS.names()}
    assert set(family_tables(read_meta())) == set(family_of.values()), "give every family a table in tables.toml"
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for family, line in readme_lines(boards, read_meta(), family_of).items():
        start, end = markers(family)
        assert start in readme and end in readme, f"README.md lacks {start} ... {end} under its family's heading"
        assert readme.split(start, 1)[1].split(end, 1)[0].strip() == line, (
            f"README.md's {family} line is not the rendering: run `fedstyle leaderboard show --readme README.md`")


def test_the_readme_claims_read_the_leaderboard_where_it_judges_else_the_preset(small_board):
    from fedstyle.experiments.leaderboard.claims import ClaimRow, Judgement, Link
    from fedstyle.experiments.leaderboard.page import readme_claims

    b, c = _row(small_board, "b"), _row(small_board, "c")
    v = judge_paired(b.values, c.values)
    judged = Judgement("b > c", [Link("b", "c", v.status, v)])
    unjudged = Judgement("b > c", [Link("b", "c", "not judged (no leaderboard run yet of b)")])
    preset = Judgement("B (preset) > C (preset)", [Link("B (preset)", "C (preset)", "holds", v)])
    none = Judgement("", note="not judged (no per-seed values)")
    claims = [ClaimRow("P1", "b > c", "", judged, none, preset, table="multi_source"),
              ClaimRow("P2", "b > c", "", unjudged, none, preset, table="multi_source"),
              ClaimRow("P3", "b > c", "", unjudged, none, none, table="multi_source")]
    lines = readme_claims({"multi_source": small_board}, claims).splitlines()[2:]
    assert lines[0] == f"| P1 | B > C | {_reading(v)} | leaderboard, small |"  # labels, not variant names
    assert lines[1] == f"| P2 | B (preset) > C (preset) | **holds** ({v.mean:+.1f} [{v.low:+.1f}, {v.high:+.1f}], " \
                       f"{v.n} pairs) | the paper's preset, from scratch |"
    assert lines[2] == "| P3 | B > C | not judged (no leaderboard run yet of b) | — |"


def _reading(v) -> str:
    word = f"**{v.status}**" if v.status in ("holds", "fails") else v.status
    return f"{word} ({v.mean:+.1f} [{v.low:+.1f}, {v.high:+.1f}], {v.n} pairs)"


def test_the_readmes_claims_are_the_rendering(committed):
    from fedstyle.experiments.leaderboard.page import README_CLAIMS_END, README_CLAIMS_START, readme_claims

    boards, claims = committed
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    inside = readme.split(README_CLAIMS_START, 1)[1].split(README_CLAIMS_END, 1)[0]
    assert inside.strip() == readme_claims(boards, claims).strip(), (
        "README.md's claims are not the rendering of the committed CSVs: run `fedstyle leaderboard show --readme "
        "README.md`")


def test_a_results_pages_claim_line_reads_each_link_on_the_leaderboard(small_board, tmp_path):
    """docs/results/<topic>.md's generated line: the claim in the table's row labels, each link's reading with the
    deciding verdicts in bold, or why it is not judged; written between that paper's markers only."""
    from fedstyle.experiments.leaderboard.claims import ClaimRow, Judgement, Link
    from fedstyle.experiments.leaderboard.page import update_results_pages
    from fedstyle.experiments.leaderboard.results_pages import claim_line, markers

    a, b, c = (_row(small_board, v) for v in "abc")
    ab, bc = judge_paired(a.values, b.values), judge_paired(b.values, c.values)
    none = Judgement("", note="not judged (none)")
    chain = ClaimRow("P1", "a > b > c", "", Judgement("a > b > c", [Link("a", "b", ab.status, ab),
                                                                    Link("b", "c", bc.status, bc)]),
                     none, none, table="multi_source")
    unjudged = ClaimRow("P2", "b > c", "", Judgement("b > c", note="not judged (no leaderboard run yet of b)"),
                        none, none, table="multi_source")
    boards = {"multi_source": small_board}
    line = claim_line(chain, boards)
    assert line.startswith("On the [leaderboard](leaderboard.md) (small), P1's claim: ")
    assert f"A > B: {_reading(ab)}; B > C: {_reading(bc)} ([every paper's]" in line  # labels, not variant names
    assert "B > C: not judged (no leaderboard run yet of b) (" in claim_line(unjudged, boards)

    page = tmp_path / "topic.md"
    start, end = markers("P1")
    page.write_text(f"# Topic\n\nOwn runs.\n{start}\nstale\n{end}\nrest\n")
    (tmp_path / "other.md").write_text("no markers\n")
    assert update_results_pages(tmp_path, boards, [chain, unjudged]) == [page]
    assert page.read_text() == f"# Topic\n\nOwn runs.\n{start}\n{line}\n{end}\nrest\n"
    assert update_results_pages(tmp_path, boards, [chain, unjudged]) == []  # already the rendering
    page.write_text(f"{start}\nno end marker\n")
    with pytest.raises(ConfigError, match="has no <!-- leaderboard-claim:P1:start -->"):
        update_results_pages(tmp_path, boards, [chain])


def test_every_papers_results_page_quotes_its_leaderboard_reading_as_rendered(committed):
    """Each paper of claims.toml has its line on one results page (docs/results/), and it is the rendering of the
    committed CSVs, so no page quotes a reading the grid has moved past."""
    from fedstyle.experiments.leaderboard.results_pages import claim_line, markers

    boards, claims = committed
    pages = {p.name: p.read_text() for p in (Path(__file__).resolve().parents[1] / "docs" / "results").glob("*.md")}
    for claim in claims:
        start, end = markers(claim.paper)
        holders = [name for name, text in pages.items() if start in text]
        assert len(holders) == 1, f"put {start} ... {end} on {claim.paper}'s results page (found on {holders})"
        inside = pages[holders[0]].split(start, 1)[1].split(end, 1)[0]
        assert inside.strip() == claim_line(claim, boards), (
            f"docs/results/{holders[0]}'s {claim.paper} line is not the rendering: run `fedstyle leaderboard show`")


def test_the_progress_line_adds_up_every_tables_runs_and_time(small_board):
    from fedstyle.experiments.leaderboard.page import progress_text

    done = small_board.runs_expected() - small_board.runs_missing()
    (runs, seconds), = small_board.run_time.values()
    text = progress_text({"one": small_board, "two": small_board})
    assert text.startswith(f"**Progress.** {2 * done} of the grid's {2 * small_board.runs_expected()} runs are in "
                           f"(small {done} of {small_board.runs_expected()}; small {done} of ")
    assert f"{int(2 * runs)} runs on " in text and f"{2 * seconds / 3600:.1f} h" in text
    assert "index.md#machines" not in text  # one device: nothing to compare


def test_the_progress_line_points_to_the_device_measurement_when_runs_mix_devices(small_board):
    """The multi-source table mixes H200 and CPU runs; the line says where their agreement was measured."""
    from fedstyle.experiments.leaderboard.page import progress_text

    (runs, seconds), = small_board.run_time.values()
    other = dataclasses.replace(small_board, run_time={"cuda": [runs, seconds]})
    text = progress_text({"one": small_board, "two": other})
    assert " runs on cpu, " in text and " runs on cuda, " in text
    assert "[how much that moves a cell](index.md#machines)" in text


def test_the_per_benchmark_line_gives_each_unseparated_rows_gap_with_its_interval(small_board):
    """"Tied" said nothing of why: a row 12.9 points behind read as tied; the line now gives the lead and its
    interval, which contains 0 (d1: B trails A by 1 - noise = -1, 3, 0 per cell over 9 pairs)."""
    from fedstyle.experiments.leaderboard.board import dataset_gap
    from fedstyle.experiments.leaderboard.page import leaders_text

    best = next(r for r in small_board.rows if r.variant == "a")
    b = next(r for r in small_board.rows if r.variant == "b")
    gap = dataset_gap(small_board, "d1", best, b)
    assert gap.low < 0 < gap.high and gap.n == 9
    assert (f"| d1 | **A** ({best.dataset_average['d1']:.1f}) | B ({b.dataset_average['d1']:.1f}; {gap.mean:+.1f} "
            f"[{gap.low:+.1f}, {gap.high:+.1f}]) |") in leaders_text(small_board).splitlines()


def test_the_per_benchmark_leaders_are_a_table_however_many_rows_tie(committed):
    """As a sentence, six rows the rule cannot tell from the single-source leader ran to 100 words (the prose test
    caught it); a table row per benchmark holds any number. A benchmark without ties says so."""
    from fedstyle.experiments.leaderboard.page import leaders_text

    boards, _ = committed
    for board in boards.values():
        lines = leaders_text(board).splitlines()
        rows = [line for line in lines if line.startswith("| ") and not line.startswith("| Benchmark")]
        assert [row.split(" | ")[0] for row in rows] == [f"| {dataset}" for dataset in board.datasets]
    multi = leaders_text(boards["multi_source"]).splitlines()
    assert any(line.endswith("| none: every other ranked row is below it |") for line in multi)


def test_a_lone_ranked_row_is_called_the_only_one_not_the_leader():
    from fedstyle.experiments.leaderboard.page import leaders_text

    lines = [line for line in _small_lines() if line["variant"] in ("a", "short")]  # Short misses cells
    board = build_board("multi_source", "Small", "target", SMALL_TABLE, lines, SMALL_DATASETS)
    text = leaders_text(board)
    assert "| d1 | **A** (" in text and ", the only ranked row so far | — |" in text and "none:" not in text


def test_a_rows_own_settings_are_named_on_the_page(committed):
    """A row run with settings `fedstyle run --method NAME` alone would not set (FedCCRL's lr, FedDyn's momentum)
    is listed with them under its table's settings, read from the sweep file; the base's settings are not."""
    boards, _ = committed
    board = boards["multi_source"]
    assert board.row_settings == {"FedCCRL": "lr 0.0167", "FedDyn": "momentum 0.0"}
    from fedstyle.experiments.leaderboard.page import board_section

    assert ("- Rows with run settings of their own: FedCCRL lr 0.0167; FedDyn momentum 0.0 (each row's method "
            "options are in the sweep file)") in board_section(board)


def test_run_refuses_a_gpu_this_machine_lacks_before_any_run(monkeypatch, tmp_path, capsys):
    """`leaderboard run --device cuda` on a machine without one failed every run of the grid one by one."""
    import torch

    import fedstyle.experiments.leaderboard.run as lb_run
    from fedstyle.cli.main import main
    from fedstyle.experiments.leaderboard.run import TablePlan

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runs = [SimpleNamespace(config=SimpleNamespace(device="cuda"), status="new")]
    monkeypatch.setattr(lb_run, "plan_table", lambda table, *a, **k: TablePlan(table, SimpleNamespace(runs=runs),
                                                                               to_run=runs))
    monkeypatch.setattr(lb_run, "run_table", lambda *a, **k: pytest.fail("a run started"))
    assert main(["leaderboard", "run", "--only", "p2p", "--device", "cuda", "--runs", str(tmp_path)]) == 2
    assert "asked for CUDA but this torch sees no GPU" in capsys.readouterr().err
