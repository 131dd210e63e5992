"""Results report: aggregation checked against hand-computed means and sample stds."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import pytest

from fedstyle.errors import ConfigError, DataError
from fedstyle.experiments.report import (
    collect,
    plot_accuracy,
    results_table,
    to_csv,
    to_markdown,
    to_text,
    write_report,
)
from fedstyle.experiments.report.plots import _average_curve, _mean_band

# label -> seed -> target -> selected accuracy (fraction). Leave-one-domain-out: one target per run.
ACCURACY = {
    "FedAvg": {0: {"art": 0.80, "photo": 0.90}, 1: {"art": 0.70, "photo": 0.94}},
    "MixStyle": {0: {"art": 0.82, "photo": 0.96}, 1: {"art": 0.78, "photo": 0.92}},
}
LAST_DROP = 0.10  # last-round accuracy = selected - 0.10


def make_run(
    root: Path,
    label: str,
    seed: int,
    target: str,
    selected: float,
    *,
    method: str | None = None,
    selection: str = "source_val",
    dataset: str = "PACS",
    done: bool = True,
    rounds: int = 3,
) -> Path:
    run = root / f"{label.replace(' ', '_')}-seed{seed}-{target}"
    run.mkdir(parents=True)
    method = method or label.lower()
    config = {
        "method": method, "dataset": dataset, "seed": seed, "protocol": "loo",
        "targets": [target], "val_domain": None, "selection": selection,
    }
    (run / "config.json").write_text(json.dumps(config))
    with open(run / "metrics.jsonl", "w") as file:
        for r in range(1, rounds + 1):
            row = {
                "round": r, "seconds": float(r), "train_loss": 1.0 / r,
                "source_val_acc": {"cartoon": 0.5}, "target_acc": {target: selected * r / rounds},
                "bytes_up": 10 * r, "bytes_down": 10 * r,
            }
            file.write(json.dumps(row) + "\n")
    summary = {
        "method": method, "label": label, "dataset": dataset, "seed": seed, "selection": selection,
        "selected_round": rounds, "targets": {target: {"selected": selected, "last": selected - LAST_DROP}},
        "seconds": 3.0, "bytes_up": 30, "bytes_down": 30,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    if done:
        (run / "done").touch()
    return run


def make_sweep(tmp_path: Path) -> Path:
    """Every run of ACCURACY under tmp_path/runs (the report tests' and the figure tests' sweep)."""
    root = tmp_path / "runs"
    for label, seeds in ACCURACY.items():
        for seed, targets in seeds.items():
            for target, accuracy in targets.items():
                make_run(root, label, seed, target, accuracy)
    return root


@pytest.fixture
def sweep(tmp_path) -> Path:
    return make_sweep(tmp_path)


def cells(table) -> dict[str, list[str]]:
    """Row label -> its cells without Src val and the two cost columns (MB/run, s/run; tested on their own)."""
    skip = {table.header.index(name) for name in ("Src-val", "MB/run", "s/run")}
    return {row[0]: [cell for i, cell in enumerate(row) if i and i not in skip] for row in table.text_rows()}


def test_source_validation_column_by_hand(tmp_path):
    """Src val: the mean source-validation accuracy of the same model (selected round or last), per seed
    the mean over its runs (one per target under LODO), then mean ± std over seeds."""
    root = tmp_path / "runs"
    # seed -> target -> per-round source-val accuracies of two source domains (rounds 1..3; selected: round 2)
    per_round = {0: {"art": [(0.1, 0.3), (0.2, 0.3), (0.3, 0.3)], "photo": [(0.5, 0.5), (0.6, 0.4), (0.1, 0.1)]},
                 1: {"art": [(0.4, 0.4), (0.4, 0.6), (0.7, 0.7)], "photo": [(0.2, 0.2), (0.2, 0.4), (0.5, 0.5)]}}
    for seed, targets in per_round.items():
        for target, rounds in targets.items():
            run = make_run(root, "FedAvg", seed, target, 0.5, rounds=3)
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for row, (a, b) in zip(rows, rounds):
                row["source_val_acc"] = {"a": a, "b": b}
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            summary = json.loads((run / "summary.json").read_text())
            summary["selected_round"] = 2
            (run / "summary.json").write_text(json.dumps(summary))
    selected = results_table(collect([root]))
    column = selected.header.index("Src-val")
    assert selected.header[column - 1] == "Avg"
    # selected (round 2): seed 0: art 25, photo 50 -> 37.5; seed 1: art 50, photo 30 -> 40 => 38.75 ± 1.77
    assert selected.rows[0].source_val.values == pytest.approx((37.5, 40.0))
    assert selected.text_rows()[0][column] == "38.8 ± 1.8"
    # last (round 3): seed 0: 30, 10 -> 20; seed 1: 70, 50 -> 60
    assert results_table(collect([root]), which="last").rows[0].source_val.values == pytest.approx((20.0, 60.0))
    assert "source_val_mean" in to_csv(selected, tmp_path / "t.csv").read_text().splitlines()[0]


def test_table_cells_by_hand(sweep):
    table = results_table(collect([sweep]))
    assert table.header == ["Method", "art", "photo", "Avg", "Src-val", "n", "MB/run", "s/run"]
    # FedAvg art: 80, 70 -> 75.0 ± sqrt(50) = 7.07; photo: 90, 94 -> 92.0 ± sqrt(8) = 2.83;
    # Avg per seed: 85, 82 -> 83.5 ± sqrt(4.5) = 2.12.
    # MixStyle art: 82, 78 -> 80.0 ± 2.83; photo: 96, 92 -> 94.0 ± 2.83; Avg: 89, 85 -> 87.0 ± 2.83.
    assert cells(table) == {
        "FedAvg": ["75.0 ± 7.1", "92.0 ± 2.8", "83.5 ± 2.1", "2"],
        "MixStyle": ["80.0 ± 2.8", "94.0 ± 2.8", "87.0 ± 2.8", "2"],
    }
    average = table.rows[0].average
    assert average.mean == pytest.approx(83.5) and average.std == pytest.approx(4.5**0.5)
    assert "model selection: source_val (best mean source-validation accuracy)" in table.caption
    assert table.footnotes == ("Settings all rows share: dataset PACS, protocol loo.",)


def test_last_round_table_and_order(sweep):
    table = results_table(collect([sweep]), which="last", order=["MixStyle"], domains=["photo"])
    assert table.header == ["Method", "photo", "art", "Avg", "Src-val", "n", "MB/run", "s/run"]
    assert cells(table)["MixStyle"] == ["84.0 ± 2.8", "70.0 ± 2.8", "77.0 ± 2.8", "2"]
    assert [row.label for row in table.rows] == ["MixStyle", "FedAvg"]
    assert "last round" in table.caption
    with pytest.raises(ConfigError, match="unknown methods"):
        results_table(collect([sweep]), order=["FedProx"])
    with pytest.raises(ConfigError, match="which"):
        results_table(collect([sweep]), which="best")


def test_incomplete_runs_skipped_with_warning_or_included(sweep):
    (sweep / "FedAvg-seed1-art" / "done").unlink()
    with pytest.warns(UserWarning, match=r"skipping 1 incomplete run.*\n.*FedAvg-seed1-art"):
        records = collect([sweep])
    assert len(records) == 7
    row = cells(results_table(records))["FedAvg"]
    # art has only seed 0 (80.0, no std, marked); seed 1's Avg covers photo only: Avg of 85 and 94.
    assert row == ["80.0*", "92.0 ± 2.8", "89.5 ± 6.4*", "2"]
    markdown = to_markdown(results_table(records))
    assert r"| 80.0\* | 92.0 ± 2.8 | 89.5 ± 6.4\* | 50.0 ± 0.0 | 2 |" in markdown and "\n\\* fewer seeds" in markdown

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        included = collect([sweep], include_incomplete=True)
    assert len(included) == 8
    assert cells(results_table(included))["FedAvg"][0] == "75.0 ± 7.1"


def test_unfinished_run_without_summary_is_listed(sweep):
    unfinished = sweep / "crashed"
    unfinished.mkdir()
    (unfinished / "metrics.jsonl").write_text('{"round": 1}\n')
    with pytest.warns(UserWarning, match=r"no summary.json yet.*\n.*crashed"):
        assert len(collect([sweep])) == 8


def test_truncated_metrics_line(tmp_path):
    run = make_run(tmp_path, "FedAvg", 0, "art", 0.8, done=False)
    with open(run / "metrics.jsonl", "a") as file:
        file.write('{"round": 4, "target_')
    assert collect([tmp_path], include_incomplete=True)[0].metrics[-1]["round"] == 3
    (run / "done").touch()
    with pytest.raises(DataError, match="line 4"):
        collect([run])


def test_missing_method_domain_and_mixed_selection(sweep, tmp_path):
    make_run(sweep, "ERM", 0, "art", 0.6)
    make_run(sweep, "ERM", 1, "art", 0.7, selection="last")
    table = results_table(collect([sweep]))
    assert cells(table)["ERM (mixed selection: source_val, last)"] == ["65.0 ± 7.1", "—", "65.0 ± 7.1*", "2"]
    assert "source_val (best mean source-validation accuracy) for ERM, FedAvg, MixStyle" in table.caption
    assert "last (last round, no selection) for ERM" in table.caption


def test_oracle_caption(tmp_path):
    make_run(tmp_path, "FedAvg", 0, "art", 0.8)
    make_run(tmp_path, "FedAvg (oracle)", 0, "art", 0.9, method="fedavg", selection="oracle")
    table = results_table(collect([tmp_path]))
    assert cells(table) == {"FedAvg": ["80.0", "80.0", "1"], "FedAvg (oracle)": ["90.0", "90.0", "1"]}
    assert "oracle (selected on the target — optimistic) for FedAvg (oracle)" in table.caption


def test_duplicate_run_is_an_error(sweep, tmp_path):
    make_run(tmp_path / "again", "FedAvg", 0, "art", 0.5)
    with pytest.raises(DataError, match="two runs report 'FedAvg' seed 0 on target 'art'"):
        results_table(collect([sweep, tmp_path / "again"]))


def test_datasets_are_reported_one_at_a_time(sweep):
    make_run(sweep, "FedAvg", 0, "clipart", 0.5, dataset="OfficeHome")
    records = collect([sweep])
    with pytest.raises(ConfigError, match="span datasets"):
        results_table(records)
    assert results_table(records, dataset="OfficeHome").domains == ("clipart",)


def test_bad_inputs(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        collect([tmp_path / "nope"])
    with pytest.raises(DataError, match="no run directories"):
        collect([tmp_path])
    run = make_run(tmp_path, "FedAvg", 0, "art", 0.8)
    summary = json.loads((run / "summary.json").read_text())
    summary["targets"]["art"]["selected"] = 80.0  # percent instead of a fraction
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DataError, match=r"fractions in \[0, 1\]"):
        collect([run])
    (run / "summary.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        collect([run])


def test_csv_contents(sweep, tmp_path):
    table = results_table(collect([sweep]))
    path = to_csv(table, tmp_path / "out" / "table.csv")
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == [
        "method", "selection", "art_mean", "art_std", "photo_mean", "photo_std", "avg_mean", "avg_std",
        "source_val_mean", "source_val_std", "n", "mb_per_run", "seconds_per_run",
    ]
    assert rows[0] == {
        "method": "FedAvg", "selection": "source_val", "art_mean": "75.0000", "art_std": "7.0711",
        "photo_mean": "92.0000", "photo_std": "2.8284", "avg_mean": "83.5000", "avg_std": "2.1213",
        "source_val_mean": "50.0000", "source_val_std": "0.0000", "n": "2",
        "mb_per_run": "0.0001", "seconds_per_run": "3.0000",  # 30 + 30 bytes, 3 s in every summary
    }
    assert rows[1]["method"] == "MixStyle" and rows[1]["avg_mean"] == "87.0000"


def test_text_and_markdown(sweep):
    table = results_table(collect([sweep]))
    text = to_text(table).splitlines()
    assert text[0] == table.caption
    header, rule, first = text[2], text[3], text[4]
    assert header.split() == ["Method", "art", "photo", "Avg", "Src-val", "n", "MB/run", "s/run"]
    assert len(rule) >= len(first) and first.startswith("FedAvg") and first.endswith("3")
    markdown = to_markdown(table)
    assert table.caption in markdown
    assert "| FedAvg | 75.0 ± 7.1 | 92.0 ± 2.8 | 83.5 ± 2.1 | 50.0 ± 0.0 | 2 | 0.0 | 3 |" in markdown


def test_curve_aggregation_by_hand():
    # One method, two domains, two seeds; seed 1 misses domain b at round 2.
    per_domain = {"a": {0: {1: 10.0, 2: 20.0}, 1: {1: 30.0, 2: 40.0}}, "b": {0: {1: 50.0, 2: 60.0}, 1: {1: 70.0}}}
    averaged = _average_curve(per_domain)
    assert averaged == {0: {1: 30.0, 2: 40.0}, 1: {1: 50.0}}
    rounds, means, stds = _mean_band(averaged)
    assert rounds == [1, 2] and means == [40.0, 40.0]
    assert stds == [pytest.approx(200**0.5), 0.0]


def test_write_report(sweep, tmp_path):
    out = tmp_path / "report"
    table, paths = write_report([sweep], out)
    assert set(paths) == {"markdown", "csv", "latex", "plot", "training"}
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.pdf", "accuracy.png", "report.csv", "report.md",
                                                     "report.tex", "training.pdf", "training.png"]  # no temps
    png = paths["plot"].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    markdown = paths["markdown"].read_text()
    assert table.caption in markdown and "accuracy.png" in markdown
    assert "FedAvg, seed 1, target art" in markdown


def test_plot_many_domains_and_no_metrics(tmp_path):
    for index in range(7):  # more than 6 domains: only the average panel
        make_run(tmp_path / "many", "FedAvg", 0, f"d{index}", 0.5 + index / 20)
    path = plot_accuracy(collect([tmp_path / "many"]), tmp_path / "many.png")
    assert path.stat().st_size > 1000
    run = make_run(tmp_path / "bare", "FedAvg", 0, "art", 0.8)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(DataError, match="nothing to plot"):
        plot_accuracy(collect([run]), tmp_path / "bare.png")
    with pytest.warns(UserWarning, match="accuracy.png not written"):
        _, paths = write_report([run], tmp_path / "bare-report")
    assert "plot" not in paths and paths["markdown"].exists()


def test_runs_of_one_label_with_different_settings_are_rows_of_their_own(tmp_path):
    for seed in (0, 1):
        run = make_run(tmp_path, f"FedProx-{seed}", seed, "art", 0.8, method="fedprox")
        for mu, folder in ((0.01, run), (0.1, make_run(tmp_path, f"FedProx-b{seed}", seed, "art", 0.6,
                                                       method="fedprox"))):
            config = json.loads((folder / "config.json").read_text())
            config["hparams"] = {"mu": mu}
            (folder / "config.json").write_text(json.dumps(config))
            summary = json.loads((folder / "summary.json").read_text())
            summary["label"] = "FedProx"
            (folder / "summary.json").write_text(json.dumps(summary))
    table = results_table(collect([tmp_path]))
    assert cells(table) == {"FedProx (hp.mu=0.01)": ["80.0 ± 0.0", "80.0 ± 0.0", "2"],
                            "FedProx (hp.mu=0.1)": ["60.0 ± 0.0", "60.0 ± 0.0", "2"]}
    assert not table.warning and table.setting_columns == ()  # rows differ only in the method's hyperparameter


def test_rows_differing_in_more_than_the_method_show_the_setting_and_warn(tmp_path):
    for label, clients in (("FedAvg", 6), ("MixStyle", 3)):
        run = make_run(tmp_path, label, 0, "art", 0.8)
        config = json.loads((run / "config.json").read_text())
        config.update(clients=clients, rounds=5)
        (run / "config.json").write_text(json.dumps(config))
    table = results_table(collect([tmp_path]))
    assert table.header[:2] == ["Method", "clients"]
    assert {row[0]: row[1] for row in table.text_rows()} == {"FedAvg": "6", "MixStyle": "3"}
    assert "differ in more than the method: clients" in table.warning
    assert "rounds 5" in table.footnotes[-1]  # what they share is said too
    with pytest.warns(UserWarning, match="differ in more than the method"):
        write_report([tmp_path], tmp_path / "report")
    assert "**Warning:**" in (tmp_path / "report" / "report.md").read_text()


def test_label_names_a_row(tiny_config, tmp_path):
    from fedstyle.experiments.runner import run_experiment

    run_experiment(tiny_config.updated(rounds=1, label="baseline A"), tmp_path / "a", quiet=True)
    run_experiment(tiny_config.updated(rounds=1, label="baseline B", lr=0.01), tmp_path / "b", quiet=True)
    table, paths = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "report")
    assert [row.label for row in table.rows] == ["baseline A", "baseline B"]
    assert "lr" in table.setting_columns and paths["training"].exists()


def test_report_judges_claims_by_the_rule_on_paired_seeds_and_targets(sweep, tmp_path, capsys):
    """`fedstyle report --claim 'A > B'`: FedAvg vs MixStyle per (target, seed): art 80-82, 70-78; photo 90-96,
    94-92 -> differences -2, -8, -6, +2 (MixStyle - FedAvg: +2, +8, +6, -2): mean 3.5, sd 4.43, t(0.975, 3)
    3.182 -> CI [-3.56, +10.56]: within noise, 3 of 4 pairs."""
    from fedstyle.cli.main import main

    out = tmp_path / "rep"
    assert main(["report", str(sweep), "--out", str(out), "--claim", "MixStyle > FedAvg"]) == 0
    said = capsys.readouterr().out
    assert "claim MixStyle > FedAvg: within noise (+3.5 points, 95 % CI [-3.6, +10.6]; 3 of 4 pairs" in said
    record = json.loads((out / "claims.json").read_text())[0]
    assert record["status"] == "within noise" and record["pairs"] == 4
    assert record["cells"] == ["PACS → art", "PACS → photo"] and record["seeds"] == [0, 1]
    assert main(["report", str(sweep), "--out", str(out), "--claim", "FedAvg > Nope"]) != 0
    assert "no row 'Nope' in the table; its rows are 'FedAvg', 'MixStyle'" in capsys.readouterr().err
    assert main(["report", str(sweep), "--out", str(out), "--claim", "FedAvg >> MixStyle"]) != 0
