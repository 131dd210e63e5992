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
from test_rundir import interrupted_run

ROUNDS = 4


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if "round" in json.loads(line) and "event" not in json.loads(line)]


#: what may differ between two runs of one config whatever --target-eval (time, where) and the option itself
NOT_RESULTS = ("seconds", "environment", "environment_resumed", "setup", "target_eval")


def _outcome(summary: dict) -> dict:
    """Everything summary.json says of the run's results."""
    return {k: v for k, v in summary.items() if k not in NOT_RESULTS}


@pytest.fixture
def earliest_round_selected(monkeypatch):
    """The selection rule picks round 1 whatever the accuracy, so --target-eval end keeps round 1's weights
    through the whole run (on 4 tiny rounds a real rule may pick the last round, which needs no kept weights)."""
    monkeypatch.setattr(Selector, "score", lambda self, record: -float(record["round"]))


@pytest.mark.parametrize("topology,method,protocol", [("star", "fedavg", "lodo"), ("complete", "dsgd", "lodo"),
                                                       ("star", "fedavg", "ltdo")])
def test_end_writes_the_summary_of_rounds_and_measures_targets_once(tiny_config, tmp_path, earliest_round_selected,
                                                                    topology, method, protocol):
    config = tiny_config.updated(rounds=ROUNDS, topology=topology, method=method, local_steps=12)
    if protocol == "ltdo":  # selected on a held-out validation domain, measured every other round
        config = config.updated(protocol="ltdo", val_domain="red", eval_every=2)
    every = run_experiment(config, tmp_path / "rounds", quiet=True)
    end = run_experiment(config.updated(target_eval="end"), tmp_path / "end", quiet=True)
    assert every["selected_round"] == config.eval_every
    assert every["target_avg"]["selected"] != every["target_avg"]["last"]
    assert _outcome(end) == _outcome(every)
    assert end["target_eval"] == "end" and "target_eval" not in every
    rows = _rows(tmp_path / "end")
    evaluations = ROUNDS // config.eval_every
    assert [("target_acc" in r) for r in rows] == [False] * (evaluations - 1) + [True]
    assert [r["source_val_acc"] for r in rows] == [r["source_val_acc"] for r in _rows(tmp_path / "rounds")]
    if topology == "complete":  # the devices' own models: measured on the last row only, consensus on every row
        assert [("device_target_acc" in r) for r in rows] == [False] * (ROUNDS - 1) + [True]
        assert all("consensus_distance" in r for r in rows)


def test_end_resumes_to_the_same_summary_with_the_selected_weights_in_the_checkpoint(
        tiny_config, tmp_path, monkeypatch, earliest_round_selected):
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


def test_selection_last_keeps_no_weights_on_the_way(tiny_config, tmp_path, monkeypatch):
    """Every row is the best so far under --selection last, and the last row measures the targets anyway."""
    config = tiny_config.updated(rounds=3, selection="last")
    every = run_experiment(config, tmp_path / "rounds", quiet=True)
    out = tmp_path / "end"
    interrupted_run(config.updated(target_eval="end"), out, monkeypatch, after_round=2)
    tensors, meta = load_checkpoint(out)
    assert meta["selector"]["pending"] and not any(k.startswith(SELECTED) for k in tensors)
    assert _outcome(resume_experiment(out, quiet=True)) == _outcome(every)


def test_a_nan_score_is_never_selected():
    selector = Selector("source_val")
    assert selector.update({"round": 1, "source_val_acc": {"a": 0.5}, "target_acc": {"t": 0.4}})
    assert not selector.update({"round": 2, "source_val_acc": {"a": float("nan")}})
    assert (selector.best_round, selector.best_targets, selector.pending) == (1, {"t": 0.4}, False)


@pytest.mark.parametrize("switch", [("rounds", "end"), ("end", "rounds")])
def test_resume_may_switch_target_eval(tiny_config, tmp_path, monkeypatch, earliest_round_selected, switch):
    config = tiny_config.updated(rounds=ROUNDS, local_steps=12)
    every = run_experiment(config, tmp_path / "whole", quiet=True)
    out = tmp_path / "cut"
    interrupted_run(config.updated(target_eval=switch[0]), out, monkeypatch, after_round=2)
    assert _outcome(resume_experiment(out, quiet=True, target_eval=switch[1])) == _outcome(every)


def test_the_report_leaves_runs_without_curves_out_of_the_figures(tiny_config, tmp_path):
    from fedstyle.experiments.report import write_report

    run_experiment(tiny_config, tmp_path / "runs" / "rounds", quiet=True)
    run_experiment(tiny_config.updated(target_eval="end", seed=1), tmp_path / "runs" / "end", quiet=True)
    with pytest.warns(UserWarning, match="1 of 2 runs measured their targets at the end only"):
        _, paths = write_report([tmp_path / "runs"], tmp_path / "report")
    assert paths["plot"].exists()
    # a run whose metrics.jsonl was emptied made with per-round targets: damaged, not "--target-eval end"
    damaged = tmp_path / "runs" / "damaged"
    run_experiment(tiny_config.updated(seed=2), damaged, quiet=True)
    (damaged / "metrics.jsonl").write_text("")
    with pytest.warns(UserWarning) as said:
        _, paths = write_report([tmp_path / "runs"], tmp_path / "report")
    messages = [str(w.message) for w in said]
    assert any(m.startswith("1 of 3 runs measured their targets at the end only") for m in messages)
    assert any(m.startswith("1 of 3 runs have no per-round target accuracy in their metrics.jsonl (empty or "
                            f"damaged; first: {damaged}") for m in messages), messages


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


@pytest.mark.parametrize("rule, kept", [("source_val", True), ("heldout_val", True), ("last", False)])
def test_a_pending_choice_must_keep_its_weights_except_under_last(rule, kept):
    """--target-eval end: the chosen round's weights are kept to measure its targets at the end; under --selection
    last the choice is the last round, whose row measures them, so nothing is kept."""
    selector = Selector(rule)
    assert not selector.must_keep_weights  # nothing chosen yet
    record = {"round": 1, "source_val_acc": {"a": 0.5}, "heldout_val_acc": {"h": 0.5}}  # no target_acc: pending
    assert selector.update(record) and selector.pending
    assert selector.must_keep_weights is kept
    selector.resolve({"t": 0.4})
    assert not selector.must_keep_weights
