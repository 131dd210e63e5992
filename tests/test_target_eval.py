"""``--target-eval end``: the targets are measured on the selected round's kept weights and the last round's only,
and summary.json is the one ``--target-eval rounds`` writes (issue 51: the leaderboard's fashion4 runs spent
most of their time measuring 17,500 target images every round)."""

from __future__ import annotations

import json

import pytest

from fedstyle.errors import ConfigError
from fedstyle.experiments.checkpoint import load_checkpoint
from fedstyle.experiments.runner import SELECTED, resume_experiment, run_experiment
from fedstyle.experiments.summary import Selector

ROUNDS = 4


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if "round" in json.loads(line) and "event" not in json.loads(line)]


def _outcome(summary: dict) -> dict:
    keep = ("selected_round", "targets", "target_avg", "device_target_acc_last", "consensus_distance_last")
    return {k: summary.get(k) for k in keep}


@pytest.fixture
def earliest_round_selected(monkeypatch):
    """The selection rule picks round 1 whatever the accuracy, so --target-eval end keeps round 1's weights
    through the whole run (on 4 tiny rounds a real rule may pick the last round, which needs no kept weights)."""
    monkeypatch.setattr(Selector, "score", lambda self, record: -float(record["round"]))


@pytest.mark.parametrize("topology,method", [("star", "fedavg"), ("complete", "dsgd")])
def test_end_writes_the_summary_of_rounds_and_measures_targets_once(tiny_config, tmp_path, earliest_round_selected,
                                                                    topology, method):
    config = tiny_config.updated(rounds=ROUNDS, topology=topology, method=method, local_steps=12)
    every = run_experiment(config, tmp_path / "rounds", quiet=True)
    end = run_experiment(config.updated(target_eval="end"), tmp_path / "end", quiet=True)
    assert every["selected_round"] == 1 and every["target_avg"]["selected"] != every["target_avg"]["last"]
    assert _outcome(end) == _outcome(every)
    assert end["target_eval"] == "end" and "target_eval" not in every
    rows = _rows(tmp_path / "end")
    assert [("target_acc" in r) for r in rows] == [False] * (ROUNDS - 1) + [True]
    assert [r["source_val_acc"] for r in rows] == [r["source_val_acc"] for r in _rows(tmp_path / "rounds")]
    if topology == "complete":  # the devices' own models: measured on the last row only, consensus on every row
        assert [("device_target_acc" in r) for r in rows] == [False] * (ROUNDS - 1) + [True]
        assert all("consensus_distance" in r for r in rows)


def test_end_resumes_to_the_same_summary_with_the_selected_weights_in_the_checkpoint(
        tiny_config, tmp_path, monkeypatch, earliest_round_selected):
    from test_rundir import interrupted_run

    config = tiny_config.updated(rounds=ROUNDS, target_eval="end")
    whole = run_experiment(config, tmp_path / "whole", quiet=True)
    out = tmp_path / "cut"
    interrupted_run(config, out, monkeypatch, after_round=2)
    tensors, meta = load_checkpoint(out)
    assert meta["selector"]["pending"] and meta["selector"]["best_round"] == 1
    assert any(k.startswith(SELECTED) for k in tensors)
    assert _outcome(resume_experiment(out, quiet=True)) == _outcome(whole)


def test_the_last_round_selected_keeps_no_weights(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(Selector, "score", lambda self, record: float(record["round"]))
    out = tmp_path / "end"
    summary = run_experiment(tiny_config.updated(rounds=2, target_eval="end"), out, quiet=True)
    tensors, meta = load_checkpoint(out)
    assert summary["selected_round"] == 2 and not meta["selector"]["pending"]
    assert not any(k.startswith(SELECTED) for k in tensors)
    assert summary["target_avg"]["selected"] == summary["target_avg"]["last"]


def test_oracle_selection_needs_every_rounds_targets(tiny_config):
    with pytest.raises(ConfigError, match="--target-eval end"):
        tiny_config.updated(selection="oracle", allow_oracle=True, target_eval="end").validate()


def test_a_grid_reuses_a_finished_run_whatever_its_target_eval(tiny_config, tmp_path):
    from fedstyle.experiments.grid.plan import _differences

    run_experiment(tiny_config.updated(rounds=1), tmp_path / "run", quiet=True)
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    tiny_config = tiny_config.updated(rounds=1)
    assert _differences(stored, tiny_config.updated(target_eval="end")) == []
    assert _differences(stored, tiny_config.updated(lr=0.1)) != []
