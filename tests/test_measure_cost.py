"""benchmarks/leaderboard/measure_cost.py --rows: a new row's one-round cost is added to a table's record without
measuring the table's other rows or its reference again (the dry run's estimate needs every row measured)."""

from __future__ import annotations

import pytest

from bench_scripts import load_script


@pytest.fixture(scope="module")
def measure_cost():
    return load_script("leaderboard/measure_cost.py")


def test_only_the_named_rows_are_measured_and_the_rest_is_kept(measure_cost, monkeypatch, tmp_path):
    measured = []

    def cpu_seconds(config, scratch):  # no training: the run that would be measured, recorded
        measured.append((config.method, config.dataset, config.rounds, config.seed))
        return 7.123

    monkeypatch.setattr(measure_cost, "cpu_seconds", cpu_seconds)
    previous = {"rows_one_round": {"fedavg": 2.33, "ccst": 12.91}, "reference": "fedavg",
                "reference_whole": {"digits4": 15.89}, "reference_rounds": 8, "reference_one_round": 2.33}
    out = measure_cost.measure_rows("multi_source", ["fedavg-complement"], tmp_path, lambda s: None, previous)
    assert measured == [("fedavg", "digits4", 1, 0)]  # one round of the row's first digits4 run, seed 0
    assert out["rows_one_round"] == {"fedavg": 2.33, "ccst": 12.91, "fedavg-complement": 7.12}
    assert {k: v for k, v in out.items() if k != "rows_one_round"} == \
        {k: v for k, v in previous.items() if k != "rows_one_round"}
    assert previous["rows_one_round"] == {"fedavg": 2.33, "ccst": 12.91}  # the caller's record is not changed


def test_a_single_source_row_is_measured_on_its_first_digits4_source(measure_cost, monkeypatch, tmp_path):
    measured = []
    monkeypatch.setattr(measure_cost, "cpu_seconds",
                        lambda config, scratch: measured.append((config.method, config.dataset, config.source)) or 3.0)
    previous = {"rows_one_round": {"fedavg": 2.0}, "reference": "fedavg"}
    out = measure_cost.measure_rows("single_source", ["feddyn-complement"], tmp_path, lambda s: None, previous)
    assert measured == [("feddyn", "digits4", "mnist")]  # the table crosses source domains, not datasets
    assert out["rows_one_round"] == {"fedavg": 2.0, "feddyn-complement": 3.0}


def test_an_unknown_row_is_refused_with_the_tables_rows(measure_cost, tmp_path):
    with pytest.raises(SystemExit, match="variant takes .*fedavg-complement"):
        measure_cost.measure_rows("multi_source", ["no-such-row"], tmp_path, lambda s: None,
                                  {"rows_one_round": {}})

