"""Runs that say where they ran: the environment probe, its record in summary.json and the checkpoint, the
one-line warning of a resume elsewhere and the report's note on runs from different environments."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess

import numpy
import pytest
import torch

from fedstyle import environment
from fedstyle.environment import describe, differences, git_state, probe
from fedstyle.experiments.report import write_report
from fedstyle.experiments.runner import resume_experiment, run_experiment
from test_report import make_run

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_probe_records_versions_threads_and_the_device():
    record = probe("cpu")
    assert record["python"] == platform.python_version() and record["torch"] == torch.__version__
    assert record["torch_threads"] == torch.get_num_threads()
    assert record["device"] == "cpu" and record["device_name"] == record["cpu"]
    assert record["cuda"] is None and record["cudnn"] is None  # None on the CPU, whatever the build
    assert record["packages"]["numpy"] == numpy.__version__ and "torch" not in record["packages"]
    assert json.loads(json.dumps(record)) == record  # JSON as it stands


def test_the_git_call_is_made_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(environment, "_git", lambda root, *args: calls.append(args) or "")
    environment._process_record.cache_clear()
    try:
        for _ in range(3):
            probe("cpu")
    finally:
        environment._process_record.cache_clear()
    assert len(calls) <= 2  # rev-parse and status, once


@needs_git
def test_git_state_commit_and_dirty_flag(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout

    assert git_state(tmp_path) == (None, None)  # not a checkout: absent, not an error
    git("init", "-q")
    (tmp_path / "a.txt").write_text("one")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = git("rev-parse", "HEAD").strip()
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "untracked.txt").write_text("new")  # untracked files do not make it dirty
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "a.txt").write_text("two")
    assert git_state(tmp_path) == (head, True)


def test_git_state_without_git_is_absent(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()

    def missing(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(environment.subprocess, "run", missing)
    assert git_state(tmp_path) == (None, None)


def test_differences_name_the_fields_and_packages_that_differ():
    a = {"torch": "2.1.0", "torch_threads": 2, "cpu": "x", "packages": {"numpy": "1.26", "flwr": "1.41.0"}}
    b = {"torch": "2.4.1", "torch_threads": 2, "cpu": "x", "packages": {"numpy": "2.0"}}
    found = differences(a, b, a)
    assert found == {"packages.flwr": ["1.41.0", None], "packages.numpy": ["1.26", "2.0"], "torch": ["2.1.0", "2.4.1"]}
    assert describe(found, limit=2) == "packages.flwr 1.41.0 / None, packages.numpy 1.26 / 2.0, and 1 more"
    assert differences(a, dict(a)) == {}


@pytest.fixture(scope="module")
def finished(tiny_root, tmp_path_factory):
    """A finished tiny run (made once) and its summary; tests copy it."""
    from fedstyle.experiments.config import RunConfig

    config = RunConfig(dataset="folder", data_root=str(tiny_root), resolution=16, targets=["grey"], rounds=2,
                       batch_size=8, local_steps=2, lr=0.05, min_client_size=2, device="cpu")
    out = tmp_path_factory.mktemp("environment") / "run"
    return out, run_experiment(config, out, quiet=True)


def killed_copy(finished, tmp_path):
    """A copy of the finished run as if killed after its last checkpoint (no summary.json, no done)."""
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    (out / "done").unlink()
    (out / "summary.json").unlink()
    return out


def test_a_run_records_its_environment_in_summary_json_not_config_json(finished):
    out, summary = finished
    assert summary["environment"] == probe("cpu") and "environment_resumed" not in summary
    assert json.loads((out / "summary.json").read_text())["environment"] == summary["environment"]
    assert "environment" not in json.loads((out / "config.json").read_text())


def test_resume_elsewhere_warns_in_one_line_and_keeps_both_environments(finished, tmp_path, monkeypatch, capsys):
    from fedstyle.experiments import runner

    started = finished[1]["environment"]
    out = killed_copy(finished, tmp_path)
    elsewhere = {**started, "torch": "9.9.9", "torch_threads": 64}
    monkeypatch.setattr(runner, "probe_environment", lambda device: elsewhere)
    capsys.readouterr()
    summary = resume_experiment(out, quiet=True)
    warning = [line for line in capsys.readouterr().err.splitlines() if "another environment" in line]
    assert len(warning) == 1 and "torch " in warning[0] and "9.9.9" in warning[0] and "torch_threads" in warning[0]
    assert summary["environment"] == started and summary["environment_resumed"] == elsewhere


def test_resume_in_the_same_environment_says_nothing(finished, tmp_path, capsys):
    whole = finished[1]
    out = killed_copy(finished, tmp_path)
    capsys.readouterr()
    resumed = resume_experiment(out, quiet=True)
    assert "another environment" not in capsys.readouterr().err
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in whole.items() if k != "seconds"}


def test_report_says_in_one_line_when_runs_come_from_different_environments(tmp_path):
    base = {"torch": "2.4.1", "torch_threads": 8, "device_name": "NVIDIA H100", "packages": {"numpy": "2.0"}}
    for label, seed, env in (("FedAvg", 0, base), ("FedAvg", 1, base), ("MixStyle", 0, {**base, "torch": "2.1.0"}),
                             ("MixStyle", 1, {**base, "torch_threads": 2})):
        run = make_run(tmp_path / "runs", label, seed, "art", 0.8)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "environment": env}))
    with pytest.warns(UserWarning, match=r"different environments \(torch 2.4.1 / 2.1.0, torch_threads 8 / 2\)"):
        write_report([tmp_path / "runs"], tmp_path / "report")
    assert "different environments (torch 2.4.1 / 2.1.0" in (tmp_path / "report" / "report.md").read_text()


def test_report_of_runs_from_one_environment_has_no_note(tmp_path, recwarn):
    for seed in (0, 1):
        run = make_run(tmp_path / "runs", "FedAvg", seed, "art", 0.8)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "environment": {"torch": "2.4.1"}}))
    write_report([tmp_path / "runs"], tmp_path / "report")
    assert not [w for w in recwarn if "environments" in str(w.message)]
    assert "environments" not in (tmp_path / "report" / "report.md").read_text()
