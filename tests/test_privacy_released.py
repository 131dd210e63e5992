"""eps as released (issue 50, section 4): summary.json and the audit count the busiest sender's releases, from the
per-client counts every metrics.jsonl row logs, whatever --eval-every; CCST's one release stays one whatever the
rounds; --data-copies K > 1 with noise is refused. Small simulator runs."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fedstyle.audit.accounting import releases_per_sender
from fedstyle.audit.run import audit_privacy
from fedstyle.errors import ConfigError
from fedstyle.experiments.build import build_experiment
from fedstyle.experiments.checkpoint import load_checkpoint
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.rounds import merge_release_counts, release_counts
from fedstyle.style.privacy import StylePrivacy, gaussian_epsilon

from test_audit_run import FAST, _config

QUICK = replace(FAST, baseline=False)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_per_client_counts_are_kept_not_averaged():
    reported = release_counts({0: {"dp_releases": 3.0, "loss": 1.0}, 2: {"dp_releases": 1.0}, 5: {"loss": 0.0}})
    assert reported == {0: 3, 2: 1}  # a client without the metric made no defended release
    assert merge_release_counts({0: 2, 1: 4}, reported) == {0: 3, 1: 4, 2: 1}  # the unsampled client keeps its 4


def test_stablefdg_eps_is_the_busiest_senders_in_summary_and_audit_with_eval_every_4(tiny_config, tmp_path):
    # 3 clients, 2 sampled a round, 4 rounds, one evaluation row: the counts differ per client
    config = _config(tiny_config, "stablefdg", dp_clip=10.0, dp_noise=1.0).updated(
        rounds=4, eval_every=4, clients_per_round=2, seed=1)
    run_experiment(config, tmp_path, quiet=True)
    rows = [r for r in _rows(tmp_path) if "round" in r]
    assert [r["round"] for r in rows] == [4]
    logged = {int(c): n for c, n in rows[-1]["dp_releases_per_client"].items()}
    # the sites' own counters (the checkpoint's client states) are what the row logged
    tensors, _ = load_checkpoint(tmp_path)
    counters = {int(k.split("/")[1]): int(v) for k, v in tensors.items() if k.endswith("style_privacy/releases")}
    assert logged == counters and sorted(logged.values()) == [1, 3, 4]  # seed 1's draws of 2 clients of 3
    most = max(logged.values())
    privacy = StylePrivacy(10.0, 1.0, source="seeded")
    summary = json.loads((tmp_path / "summary.json").read_text())["style_privacy"]
    assert summary["releases_max"] == most and summary["releases_per_client"] == rows[-1]["dp_releases_per_client"]
    assert summary["epsilon_total"] == pytest.approx(privacy.total_epsilon(most))
    assert summary["epsilon_per_release"] == pytest.approx(gaussian_epsilon(1.0, 1e-5))
    # the mean over the clients (what summary.json used to print) is below the busiest sender's eps
    assert rows[-1]["train_metrics"]["dp_epsilon_total"] < summary["epsilon_total"]
    audit_privacy([tmp_path], settings=QUICK)
    report = json.loads((tmp_path / "audit" / "privacy.json").read_text())[0]
    assert report["releases"] == most and report["epsilon"] == pytest.approx(summary["epsilon_total"])
    assert "metrics.jsonl" in report["releases_from"]
    # a deployment's checkpoint holds no client counters: the rows alone give the same count (one row, 4 rounds)
    exp = build_experiment(config, progress=False)
    no_states = SimpleNamespace(simulator=SimpleNamespace(clients=exp.simulator.clients, client_states=None))
    counts, source = releases_per_sender(no_states, _rows(tmp_path))
    assert counts == logged and source == "metrics.jsonl's per-client release counts"


def test_a_multi_round_ccst_run_is_one_release_everywhere(tiny_config, tmp_path):
    config = _config(tiny_config, "ccst", dp_clip=10.0, dp_noise=1.0, style_type="overall").updated(rounds=3)
    run_experiment(config, tmp_path, quiet=True)
    rows = [r for r in _rows(tmp_path) if "round" in r]
    assert all(set(r["dp_releases_per_client"].values()) == {1} for r in rows) and len(rows) == 3
    summary = json.loads((tmp_path / "summary.json").read_text())["style_privacy"]
    one = gaussian_epsilon(1.0, 1e-5)
    assert summary["releases_max"] == 1 and summary["epsilon_total"] == pytest.approx(one)
    audit_privacy([tmp_path], settings=QUICK)
    report = json.loads((tmp_path / "audit" / "privacy.json").read_text())[0]
    assert report["releases"] == 1 and report["epsilon"] == pytest.approx(one)
    # no "mean of T releases" attack on releases that never happened
    assert not any("mean of" in r["payload"] for r in report["results"])


def test_legacy_rows_without_per_client_counts_bound_by_rounds_not_rows():
    exp = SimpleNamespace(simulator=SimpleNamespace(clients=[0, 1], client_states=None))
    rows = [{"event": "setup"}, {"round": 4, "train_metrics": {"dp_releases": 2.5}},
            {"round": 8, "train_metrics": {"dp_releases": 5.0}}]  # --eval-every 4: 2 rows, 8 rounds
    counts, source = releases_per_sender(exp, rows)
    assert counts == {0: 8, 1: 8} and "upper bound" in source


def test_data_copies_with_noise_is_refused(tiny_config):
    config = _config(tiny_config, "stablefdg", dp_clip=1.0, dp_noise=1.0).updated(data_copies=2)
    with pytest.raises(ConfigError, match="--data-copies 2 with the style defence.*use --data-copies 1"):
        build_experiment(config, progress=False)
    build_experiment(config.updated(hparams={"dp_clip": 1.0}), progress=False)  # clipping alone claims no eps
    assert math.isfinite(gaussian_epsilon(1.0, 1e-5))
