"""benchmarks/per_seed.py: the per-seed tables behind the verdicts of docs/results/, and their re-reading by the
rule."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from fedstyle.errors import ConfigError
from fedstyle.experiments.verdict import judge_paired

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "per_seed.py"


@pytest.fixture(scope="module")
def per_seed():
    spec = importlib.util.spec_from_file_location("per_seed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["per_seed"] = module
    spec.loader.exec_module(module)
    return module


def _table(tmp_path: Path) -> Path:
    rows = ["label,variant,dataset,target,seed,target_acc,source_val,device,seconds"]
    acc = {"A": {0: 50.0, 1: 52.0, 2: 55.0}, "B, with a comma": {0: 48.0, 1: 47.5, 2: 50.0}}
    for label, seeds in acc.items():
        for seed, value in seeds.items():
            rows.append(f'"{label}",v,digits4,mnistm,{seed},{value},70.0,cpu,1.0')
            rows.append(f'"{label}",v,fashion4,sketch,{seed},{value - 10 + seed},60.0,cpu,1.0')
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_judge_pairs_cells_and_seeds_as_the_rule_does(per_seed, tmp_path):
    rows = per_seed.load(_table(tmp_path))
    a, b = per_seed.accuracies(rows, "A"), per_seed.accuracies(rows, "B, with a comma")
    assert len(a) == 6 and ("fashion4 → sketch", 2) in a
    expected = judge_paired(a, b)
    (line,) = per_seed.judge(str(_table(tmp_path)), ["A > B, with a comma"])
    assert line == f"claim A > B, with a comma: {expected.status} ({expected.text()})"
    assert expected.status == "holds" and expected.n == 6  # A is ahead by 2-5 points in every pair
    only = judge_paired(per_seed.accuracies(rows, "A", "digits4"), per_seed.accuracies(rows, "B, with a comma", "digits4"))
    assert only.n == 3 and only.cells == ["digits4 → mnistm"]


def test_tables_run_apart_join_with_a_plus(per_seed, tmp_path):
    whole = _table(tmp_path)
    rows = whole.read_text().splitlines()
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("\n".join([rows[0]] + [r for r in rows[1:] if r.startswith('"A"')]) + "\n")
    second.write_text("\n".join([rows[0]] + [r for r in rows[1:] if not r.startswith('"A"')]) + "\n")
    assert per_seed.judge(f"{first}+{second}", ["A > B, with a comma"]) == per_seed.judge(str(whole), ["A > B, with a comma"])


def test_bad_names_are_one_line_errors(per_seed, tmp_path):
    rows = per_seed.load(_table(tmp_path))
    with pytest.raises(ConfigError, match="no row 'C'; the rows: A, B, with a comma"):
        per_seed.accuracies(rows, "C")
    with pytest.raises(ConfigError, match="is not 'A > B'"):
        per_seed.judge(str(_table(tmp_path)), ["A beats B"])
    with pytest.raises(ConfigError, match="does not exist; the tables kept here"):
        per_seed.load("no-such-table")


def test_every_kept_table_reads_and_pairs(per_seed):
    """Each committed CSV has the columns, accuracies in percent and one line per (row, cell, seed) (the
    leaderboard's files: its columns, and a line per (row, source, cell, seed, rounds))."""
    from fedstyle.experiments.leaderboard.run import COLUMNS as LEADERBOARD_COLUMNS

    tables = sorted(per_seed.HERE.glob("*.csv"))
    assert tables, "no per-seed table is kept"
    for path in tables:
        rows = per_seed.load(path)
        columns = LEADERBOARD_COLUMNS if path.name.startswith("leaderboard-") else per_seed.COLUMNS
        assert rows and set(rows[0]) == set(columns), path.name
        keys = [(r["label"], r["dataset"], r.get("source", ""), r["target"], r["seed"], r.get("rounds", ""))
                for r in rows]
        assert len(keys) == len(set(keys)), f"{path.name}: a (row, cell, seed) twice"
        assert all(0.0 <= float(r["target_acc"]) <= 100.0 for r in rows), path.name


def test_export_keeps_each_runs_label_inside_a_suffix_so_two_regimes_pair(per_seed, tmp_path):
    """--label '{label} (FixBN)': one sweep's rows renamed apart from the same rows of another regime, so
    `judge A+B --claim 'FedAvg (FixBN) > FedAvg'` pairs them by cell and seed."""
    from test_report import make_run

    for seed, (plain, fixbn) in enumerate(((0.50, 0.56), (0.40, 0.47), (0.45, 0.49))):
        make_run(tmp_path / "eval", "FedAvg", seed, "sketch", plain)
        make_run(tmp_path / "fixbn", "FedAvg", seed, "sketch", fixbn)
    out = tmp_path / "kept"
    per_seed.export([tmp_path / "eval"], "eval", out_dir=out)
    per_seed.export([tmp_path / "fixbn"], "fixbn", out_dir=out, label="{label} (FixBN)")
    assert {r["label"] for r in per_seed.load(out / "fixbn.csv")} == {"FedAvg (FixBN)"}
    rows = per_seed.load(out / "eval.csv") + per_seed.load(out / "fixbn.csv")
    verdict = judge_paired(per_seed.accuracies(rows, "FedAvg (FixBN)"), per_seed.accuracies(rows, "FedAvg"))
    assert [round(d, 6) for d in verdict.differences] == [6.0, 7.0, 4.0]  # percent, seeds 0, 1, 2
    per_seed.export([tmp_path / "eval"], "renamed", out_dir=out, label="FedAvg at lr 1e-2")  # no placeholder
    assert {r["label"] for r in per_seed.load(out / "renamed.csv")} == {"FedAvg at lr 1e-2"}


@pytest.mark.parametrize("bad_line, message", [
    ("garbage,line", "line 3: 2 fields where the header has 9"),
    ("A,a,digits4,mnist,1,50.0,80.0,cpu,1.0,extra", "line 3: 10 fields where the header has 9"),
    ("<<<<<<< HEAD", "line 3: 1 fields where the header has 9"),
    ("A,a,digits4,mnist,one,50.0,80.0,cpu,1.0", "line 3: seed = 'one' is not an integer"),
    ("A,a,digits4,mnist,1,50%,80.0,cpu,1.0", "line 3: target_acc = '50%' is not a finite number"),
    ("A,a,digits4,mnist,1,50.0,nan,cpu,1.0", "line 3: source_val = 'nan' is not a finite number"),
    ("A,a,digits4,mnist,1,9456,80.0,cpu,1.0", r"line 3: target_acc = 9456 is no percentage \(0 to 100\)"),
])
def test_a_damaged_kept_csv_names_its_line(tmp_path, bad_line, message):
    """A hand edit or a merge conflict in a kept CSV is a ConfigError naming the file, the line and the fix, not a
    TypeError in whichever reader meets the value first."""
    from fedstyle.experiments.report.per_seed import read_rows

    path = tmp_path / "t.csv"
    path.write_text("label,variant,dataset,target,seed,target_acc,source_val,device,seconds\n"
                    "A,a,digits4,mnist,0,50.0,,cpu,\n" + bad_line + "\n")
    with pytest.raises(ConfigError, match=f"t.csv, {message}; mend or delete that line"):
        read_rows(path)
    path.write_text(path.read_text().rsplit(bad_line, 1)[0])  # the good line alone reads, empty source_val too
    assert read_rows(path) == [{"label": "A", "variant": "a", "dataset": "digits4", "target": "mnist", "seed": "0",
                                "target_acc": "50.0", "source_val": "", "device": "cpu", "seconds": ""}]


def test_a_csv_without_the_columns_its_reader_needs_names_them(tmp_path):
    from fedstyle.experiments.report.per_seed import read_rows

    path = tmp_path / "t.csv"
    path.write_text("label,variant,dataset,target,seed,acc\nA,a,digits4,mnist,0,50.0\n")
    with pytest.raises(ConfigError, match=r"t.csv has no column target_acc \(its header: label,variant,dataset,"
                                          r"target,seed,acc; wanted: seed,target_acc\); mend the header"):
        read_rows(path, ("seed", "target_acc"))
    assert len(read_rows(path)) == 1  # a reader that needs no particular column


def test_single_source_lines_pair_by_source_and_duplicate_runs_are_refused(per_seed, tmp_path, capsys):
    """A single-source line is a (source, target) pair: its cell is the source, valued at the mean over the
    targets, as the leaderboard's table has it. Keyed by target, two sources' lines overwrote each other."""
    rows = ["label,variant,dataset,source,target,seed,rounds,target_acc,source_val,device,seconds"]
    for label, accs in (("A", (40.0, 50.0, 70.0)), ("B", (30.0, 44.0, 65.0))):
        rows.append(f"{label},v,digits4,mnist,mnistm,0,32,{accs[0]},90.0,cpu,1.0")
        rows.append(f"{label},v,digits4,mnist,syn,0,32,{accs[1]},90.0,cpu,1.0")
        rows.append(f"{label},v,digits4,syn,mnist,0,32,{accs[2]},90.0,cpu,1.0")
    path = tmp_path / "single.csv"
    path.write_text("\n".join(rows) + "\n")
    lines = per_seed.load(path)
    assert per_seed.accuracies(lines, "A") == {("digits4: mnist →", 0): 45.0, ("digits4: syn →", 0): 70.0}
    assert per_seed.accuracies(lines, "B") == {("digits4: mnist →", 0): 37.0, ("digits4: syn →", 0): 65.0}
    assert per_seed.main(["show", str(path)]) == 0  # show lists the cells judge pairs: sources, not targets
    assert capsys.readouterr().out.splitlines()[0] == "A: digits4: mnist →, digits4: syn →; seeds [0]"
    path.write_text("\n".join(rows + ["A,v,digits4,mnist,syn,0,64,55.0,91.0,cpu,2.0"]) + "\n")  # a second budget
    with pytest.raises(ConfigError, match=r"two lines of 'A' for digits4 → syn, seed 0, source mnist \(they differ "
                                          r"in rounds\); keep one line per run"):
        per_seed.accuracies(per_seed.load(path), "A")
