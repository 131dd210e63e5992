"""--tracker mlflow / tensorboard: what a run logs there is what metrics.jsonl holds, read back with
each tool's own reader (MLflow's client on a local file store, TensorBoard's event accumulator)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

import pytest

from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.experiments.tracking import TrackerError, Trackers, config_params, flatten_numbers, resolve_locations
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


# -- issue 39 item 5: trackers on resume, and an MLflow server that does not answer -----------------
def _tiny_flags(tiny_root):
    return ["--dataset", "folder", "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey",
            "--rounds", "2", "--batch-size", "8", "--local-steps", "2", "--min-client-size", "2", "--device", "cpu"]


@pytest.fixture
def listener():
    """A local port that accepts TCP connections (the kernel's backlog) and never answers them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server
    server.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed on leaving: connections are refused


@pytest.mark.parametrize("server", ["refuses", "never answers"])
def test_an_unreachable_mlflow_server_is_refused_in_seconds_before_anything_is_built(
        server, listener, tiny_root, tmp_path, monkeypatch, capsys):
    import fedstyle.experiments.runner as runner
    import fedstyle.experiments.tracking as tracking

    monkeypatch.setattr(tracking, "PROBE_SECONDS", 0.5, raising=False)

    def built_too_early(*args, **kwargs):
        raise AssertionError("the experiment was built (and --out written) before the MLflow server was probed")

    monkeypatch.setattr(runner, "build_experiment", built_too_early)
    port = _closed_port() if server == "refuses" else listener.getsockname()[1]
    uri, out = f"http://127.0.0.1:{port}", tmp_path / "run"
    tick = time.perf_counter()
    code = main(["run", *_tiny_flags(tiny_root), "--tracker", "mlflow", "--mlflow-uri", uri, "--out", str(out),
                 "--quiet"])
    seconds = time.perf_counter() - tick
    err = capsys.readouterr().err.strip()
    assert code == 2 and seconds < 3 and not out.exists()
    assert len(err.splitlines()) == 1 and uri in err and "--mlflow-uri" in err and "drop --tracker mlflow" in err


def test_sigterm_while_the_mlflow_server_is_probed_leaves_nothing_in_out(listener, tiny_root, tmp_path):
    def terminate_on_connect():
        connection, _ = listener.accept()
        os.kill(os.getpid(), signal.SIGTERM)  # fedstyle run's handler turns it into KeyboardInterrupt
        time.sleep(1.0)
        connection.close()

    threading.Thread(target=terminate_on_connect, daemon=True).start()
    out, previous = tmp_path / "run", signal.getsignal(signal.SIGTERM)
    try:
        code = main(["run", *_tiny_flags(tiny_root), "--tracker", "mlflow", "--mlflow-uri",
                     f"http://127.0.0.1:{listener.getsockname()[1]}", "--out", str(out), "--quiet"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 130
    assert not out.exists()  # the same command can be given again


def _answering(status):
    """A local HTTP server whose every GET answers ``status``: (server, its URI); serve it in a thread."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def test_the_probe_takes_a_2xx_health_answer_and_leaves_stores_without_a_server_alone(tiny_config, tmp_path):
    from fedstyle.experiments.tracking import probe_trackers

    server, uri = _answering(200)
    with server:
        probe_trackers(tiny_config.updated(trackers=["mlflow"], mlflow_uri=uri))
        server.shutdown()
    for uri in (str(tmp_path / "store"), f"sqlite:///{tmp_path}/mlflow.db"):
        probe_trackers(tiny_config.updated(trackers=["mlflow"], mlflow_uri=uri))


@pytest.mark.parametrize("status, says", [(503, "HTTP 503"), (404, "HTTP 404"), (401, "MLFLOW_TRACKING_USERNAME")])
def test_a_server_answering_non_2xx_is_refused_in_one_line_before_anything_is_written(
        status, says, tiny_root, tmp_path, capsys):
    """Issue 55 item 1: a 503 used to pass the probe, and MLflow's retries then stalled the run 260 s."""
    server, uri = _answering(status)
    out = tmp_path / "run"
    with server:
        tick = time.perf_counter()
        code = main(["run", *_tiny_flags(tiny_root), "--tracker", "mlflow", "--mlflow-uri", uri, "--out", str(out),
                     "--quiet"])
        seconds = time.perf_counter() - tick
        server.shutdown()
    err = capsys.readouterr().err.strip()
    assert code == 2 and seconds < 5 and not out.exists()
    assert len(err.splitlines()) == 1 and says in err and "drop --tracker mlflow" in err


def test_mlflow_retries_during_a_run_are_bounded_unless_the_user_set_them(monkeypatch):
    from fedstyle.experiments.tracking import MLFLOW_HTTP_BOUNDS, bound_mlflow_retries

    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    bound_mlflow_retries()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"  # the user's own
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    # worst case of one request with MLflow's backoff (factor * 2 ** retry seconds between tries)
    retries, factor = int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]), float(MLFLOW_HTTP_BOUNDS["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"])
    assert sum(factor * 2 ** k for k in range(retries)) + (retries + 1) * float(MLFLOW_HTTP_BOUNDS["MLFLOW_HTTP_REQUEST_TIMEOUT"]) < 60


def test_an_interrupt_before_the_first_checkpoint_leaves_nothing_in_out(tiny_config, tmp_path, monkeypatch, capsys):
    """Issue 55 item 1: config.json, partition.json and an empty metrics.jsonl used to block the same --out."""
    import fedstyle.experiments.runner as runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "save_checkpoint", interrupted)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(tiny_config, out, quiet=True)
    assert not out.exists()
    assert "nothing to resume" in capsys.readouterr().err


def test_resume_refuses_to_move_or_drop_a_tracker_that_has_logged(tiny_config, tmp_path, monkeypatch, capsys):
    out, store, board = tmp_path / "run", tmp_path / "store", tmp_path / "board"
    config = tiny_config.updated(trackers=["mlflow", "tensorboard"], mlflow_uri=str(store), tensorboard_dir=str(board))
    interrupted_run(config, out, monkeypatch, after_round=1)
    client, run = _mlflow_run(out)
    before = (out / "checkpoint.safetensors").read_bytes(), (out / "tracking.json").read_text()
    capsys.readouterr()
    attempts = {  # flags given with --resume -> what the one-line refusal must name
        ("--mlflow-uri", str(tmp_path / "elsewhere")): ("--mlflow-uri", run.info.run_id, "--restart"),
        ("--tensorboard-dir", str(tmp_path / "board2")): ("--tensorboard-dir", str(board), "--restart"),
        ("--tracker", "tensorboard"): ("--tracker mlflow", run.info.run_id, "--restart"),
        ("--tracker", "mlflow"): ("--tracker tensorboard", str(board), "--restart"),
    }
    for flags, names in attempts.items():
        assert main(["run", "--resume", str(out), "--quiet", *flags]) == 2, flags
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(name in err for name in names), err
    assert ((out / "checkpoint.safetensors").read_bytes(), (out / "tracking.json").read_text()) == before
    assert client.get_run(run.info.run_id).info.status == "KILLED"  # not reopened and left RUNNING
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "board2").exists()
    # the same locations, given again, are no change
    assert main(["run", "--resume", str(out), "--quiet", "--mlflow-uri", str(store), "--tracker", "mlflow",
                 "--tracker", "tensorboard", "--tensorboard-dir", str(board)]) == 0
    client, resumed = _mlflow_run(out)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert [s for s, _ in _history(client, resumed, "train_loss")] == [1, 2]


def test_a_tracker_added_on_resume_keeps_logging_on_later_resumes(tiny_config, tmp_path, monkeypatch):
    import fedstyle.experiments.runner as runner

    out = tmp_path / "run"
    interrupted_run(tiny_config.updated(rounds=3, trackers=["mlflow"], mlflow_uri=str(tmp_path / "store")), out,
                    monkeypatch, after_round=1)
    original = runner.save_checkpoint

    def save_then_stop(run_dir, tensors, meta):
        original(run_dir, tensors, meta)
        if meta["round"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "save_checkpoint", save_then_stop)
    assert main(["run", "--resume", str(out), "--quiet", "--tracker", "mlflow", "--tracker", "tensorboard"]) == 130
    monkeypatch.setattr(runner, "save_checkpoint", original)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0  # config.json lists mlflow only
    scalars, _ = _scalars(out / "tensorboard", "train_loss")
    assert [step for step, _ in scalars] == [1, 2, 3]
    client, run = _mlflow_run(out)
    assert run.info.status == "FINISHED" and [s for s, _ in _history(client, run, "train_loss")] == [1, 2, 3]


def test_a_tracker_that_cannot_start_closes_those_already_started(tiny_config, tmp_path):
    from mlflow.tracking import MlflowClient

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store, out = tmp_path / "store", tmp_path / "run"
    out.mkdir()
    config = tiny_config.updated(trackers=["mlflow", "tensorboard"], mlflow_uri=str(store),
                                 tensorboard_dir=str(blocker / "board"))
    with pytest.raises(TrackerError, match="TensorBoard"):
        Trackers(resolve_locations(config), out).start([])
    client = MlflowClient(store.resolve().as_uri())
    runs = client.search_runs([client.get_experiment_by_name("fedstyle").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]  # not RUNNING for ever


def test_restart_closes_the_mlflow_run_a_killed_run_left_running(tiny_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupted_run(tiny_config.updated(trackers=["mlflow"], mlflow_uri=str(tmp_path / "store")), out, monkeypatch,
                    after_round=1)
    client, killed = _mlflow_run(out)
    client.update_run(killed.info.run_id, status="RUNNING")  # as a SIGKILL leaves it: no one to close it
    assert main(["run", "--resume", str(out), "--restart", "--quiet"]) == 0
    client, fresh = _mlflow_run(out)
    assert fresh.info.run_id != killed.info.run_id and fresh.info.status == "FINISHED"
    assert client.get_run(killed.info.run_id).info.status == "KILLED"


def test_a_tracker_given_to_a_finished_run_logs_it(tiny_config, tmp_path):
    out = tmp_path / "run"
    run_experiment(tiny_config.updated(trackers=["mlflow"], mlflow_uri=str(tmp_path / "store")), out, quiet=True)
    client, finished = _mlflow_run(out)
    # the new tracker logs the run; the MLflow run, left out of --tracker, stays as it is
    assert main(["run", "--resume", str(out), "--quiet", "--tracker", "tensorboard"]) == 0
    scalars, events = _scalars(out / "tensorboard", "train_loss")
    assert scalars == [(r["round"], pytest.approx(r["train_loss"])) for r in evaluations(out)]
    assert "summary" in {tag.split("/")[0] for tag in events.Tags()["tensors"]}
    client, after = _mlflow_run(out)
    assert (after.info.run_id, after.info.status, after.info.end_time) == (finished.info.run_id, "FINISHED",
                                                                           finished.info.end_time)
