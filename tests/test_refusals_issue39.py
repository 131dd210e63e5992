"""One-line refusals for options that used to end in a traceback or be silently accepted (issue 39 §7)."""

from __future__ import annotations

import pytest

from fedstyle.algorithms.fedadg import FedADG
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig


def test_fedadg_sizes_are_bounded_before_anything_is_allocated():
    with pytest.raises(ConfigError, match="above the maximum"):
        FedADG.resolve({"noise_dim": 1_000_000_000_000})
    with pytest.raises(ConfigError, match="generator weights is above"):
        FedADG.resolve({"noise_dim": 65_536, "gen_hidden": 65_536})
    assert FedADG.resolve({})["noise_dim"] == 2048  # the authors' sizes stay accepted


@pytest.mark.parametrize("option,tracker", [("mlflow_uri", "mlflow"), ("tensorboard_dir", "tensorboard")])
def test_a_tracker_location_without_its_tracker_is_refused(option, tracker):
    with pytest.raises(ConfigError, match=f"add --tracker {tracker}"):
        RunConfig(dataset="digits4", **{option: "somewhere"}).validate()


def test_client_batching_on_a_peer_to_peer_graph_is_refused():
    with pytest.raises(ConfigError, match="--client-batching on batches a star round"):
        RunConfig(dataset="digits4", method="dsgd", topology="ring", client_batching="on").validate()
    RunConfig(dataset="digits4", method="dsgd", topology="ring").validate()  # auto stays fine


def test_sweep_workers_zero_and_an_unknown_track_are_refused(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits4"\n[[variant]]\nname = "a"\nmethod = "fedavg"\n')
    assert main(["sweep", str(grid), "--workers", "0", "--dry-run"]) != 0
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert main(["reproduce", "--list", "--track", "bogus"]) != 0
    err = capsys.readouterr().err
    assert "--track 'bogus' is no preset's track" in err and "pretrained" in err


def test_a_cache_that_is_a_file_is_refused_in_one_line(tmp_path, monkeypatch):
    from fedstyle.data.cache import cache_dir

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("FEDSTYLE_CACHE", str(blocker))
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        cache_dir()


def test_audit_out_that_cannot_be_a_folder_is_refused_before_the_audit(tmp_path, monkeypatch):
    """`audit --out FILE` was found only after the attacks had run (minutes); now before any run is read."""
    from fedstyle.audit import run as audit_run_module

    def never(*_args, **_kwargs):
        raise AssertionError("the audit ran before its --out was checked")

    monkeypatch.setattr(audit_run_module, "audit_run", never)
    blocker = tmp_path / "report.md"
    blocker.write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")  # a run directory by its look; never read here
    for out in (blocker, blocker / "sub"):
        with pytest.raises(ConfigError, match="is a file"):
            audit_run_module.audit_privacy([tmp_path / "run"], out=out)


@pytest.mark.parametrize("label", ["two\nlines", "tab\there"])
def test_a_label_that_would_break_the_reports_tables_is_refused(label):
    """A --label with a newline broke report.md's table (found by the bad-input audit of 2026-11-29)."""
    with pytest.raises(ConfigError, match="must be one line of printable text"):
        RunConfig(dataset="digits4", label=label).validate()
    RunConfig(dataset="digits4", label="CCST (overall, K=3) | lr 0.1").validate()  # Markdown escapes the bar
