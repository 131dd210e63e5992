"""--tracker mlflow / tensorboard: what a run logs there is what metrics.jsonl holds, read back with
each tool's own reader (MLflow's client on a local file store, TensorBoard's event accumulator)."""

from __future__ import annotations

import json
import sys

import pytest

from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.experiments.tracking import Trackers, config_params, flatten_numbers
from run_records import evaluations
from test_rundir import interrupted_run

mlflow = pytest.importorskip("mlflow", reason="pip install 'fedstyle[mlflow]'")
pytest.importorskip("tensorboard", reason="pip install 'fedstyle[tensorboard]'")


def _mlflow_run(out):
    from mlflow.tracking import MlflowClient

    state = json.loads((out / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(state["uri"])
    return client, client.get_run(state["run_id"])


def _history(client, run, name):
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]


def _scalars(folder, name):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, pytest.approx(e.value)) for e in events.Scalars(name)], events


def test_flatten_numbers_by_hand():
    row = {"train_loss": 1.5, "target_acc": {"a": 0.2, "b": 0.6}, "train_metrics": {"ce": 0.7},
           "note": "text", "flag": True, "per_edge_iteration": {"model": 10}}
    assert flatten_numbers(row) == {"train_loss": 1.5, "target_acc/a": 0.2, "target_acc/b": 0.6,
                                    "target_acc/mean": pytest.approx(0.4), "train_metrics/ce": 0.7,
                                    "per_edge_iteration/model": 10.0}
    assert config_params({"lr": 0.1, "hparams": {"p": 0.5}, "targets": ["a", "b"], "label": None}) == {
        "hparams.p": "0.5", "label": "None", "lr": "0.1", "targets": "a,b"}


def test_cli_run_with_mlflow_and_tensorboard_logs_what_metrics_jsonl_holds(tiny_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default MLflow store ./mlruns lands here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "run"
    code = main(["run", "--dataset", "folder", "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey",
                 "--rounds", "3", "--batch-size", "8", "--local-steps", "2", "--min-client-size", "2", "--device", "cpu",
                 "--hp", "style=mixstyle", "--tracker", "mlflow", "--tracker", "tensorboard", "--out", str(out), "--quiet"])
    assert code == 0
    rows = evaluations(out)
    client, run = _mlflow_run(out)
    assert run.info.status == "FINISHED"
    assert (tmp_path / "mlruns").is_dir() and run.data.tags["fedstyle.run_dir"] == str(out.resolve())
    assert run.data.params["lr"] == "0.05" and run.data.params["hparams.style"] == "mixstyle"
    assert _history(client, run, "target_acc/grey") == [(r["round"], pytest.approx(r["target_acc"]["grey"])) for r in rows]
    assert _history(client, run, "train_loss") == [(r["round"], pytest.approx(r["train_loss"])) for r in rows]
    assert [s for s, _ in _history(client, run, "bytes_up")] == [1, 2, 3]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "partition.json", "summary.json"} <= artifacts
    scalars, events = _scalars(out / "tensorboard", "target_acc/mean")
    assert scalars == [(r["round"], pytest.approx(sum(r["target_acc"].values()) / len(r["target_acc"]))) for r in rows]
    assert {"config", "summary"} <= {tag.split("/")[0] for tag in events.Tags()["tensors"]}


def test_resume_logs_on_into_the_same_mlflow_run_and_a_tracker_added_on_resume_backfills(
        tiny_config, tmp_path, monkeypatch):
    out, store = tmp_path / "run", tmp_path / "store"
    config = tiny_config.updated(rounds=3, trackers=["mlflow"], mlflow_uri=str(store))
    interrupted_run(config, out, monkeypatch, after_round=2)
    client, run = _mlflow_run(out)
    assert run.info.status == "KILLED"
    assert main(["run", "--resume", str(out), "--quiet", "--tracker", "mlflow", "--tracker", "tensorboard"]) == 0
    client, resumed = _mlflow_run(out)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    rows = evaluations(out)
    assert _history(client, resumed, "target_acc/grey") == [(r["round"], pytest.approx(r["target_acc"]["grey"]))
                                                           for r in rows]
    scalars, _ = _scalars(out / "tensorboard", "target_acc/grey")  # added on resume: rounds 1-2 logged first
    assert scalars == [(r["round"], pytest.approx(r["target_acc"]["grey"])) for r in rows]


def test_a_tracker_that_fails_mid_run_is_dropped_with_a_warning_and_the_run_finishes(tiny_config, tmp_path,
                                                                                       monkeypatch):
    from fedstyle.experiments.tracking import MLflowTracker

    def broken(self, numbers, step):
        raise OSError("disk full")

    monkeypatch.setattr(MLflowTracker, "log", broken)
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="--tracker mlflow failed and is dropped"):
        run_experiment(tiny_config.updated(trackers=["mlflow"], mlflow_uri=str(tmp_path / "s")), out, quiet=True)
    assert (out / "done").exists() and len(evaluations(out)) == 2


def test_bad_tracker_settings_are_refused_before_anything_is_written(tiny_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="'wandb' is not one of mlflow, tensorboard"):
        run_experiment(tiny_config.updated(trackers=["wandb"]), out, quiet=True)
    with pytest.raises(ConfigError, match="given twice"):
        run_experiment(tiny_config.updated(trackers=["mlflow", "mlflow"]), out, quiet=True)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: import fails
    with pytest.raises(ConfigError, match=r"pip install .*fedstyle\[mlflow\]"):
        run_experiment(tiny_config.updated(trackers=["mlflow"]), out, quiet=True)
    assert not out.exists()


def test_an_mlflow_store_that_cannot_start_names_the_setting(tiny_config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    trackers = Trackers(tiny_config.updated(trackers=["mlflow"], mlflow_uri=str(blocker / "store")), tmp_path)
    with pytest.raises(Exception, match="--tracker mlflow could not start.*--mlflow-uri"):
        trackers.start([])
