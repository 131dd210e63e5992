"""The run directory never lies (issue 15): divergence, locks, resume integrity, typed config, one-line
errors instead of tracebacks, checksummed checkpoints, and no litter of dead processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.fedavg import FedAvg
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.checkpoint import CHECKPOINT, CheckpointError, load_checkpoint
from fedstyle.experiments.runner import resume_experiment, run_experiment
from fedstyle.experiments.summary import divergence_warnings
from fedstyle.federation.rounds import TrainingDivergedError
from fedstyle.io import DirectoryLock, LockedError, remove_leftovers, temp_prefix
from run_records import evaluations


def interrupted_run(config, out: Path, monkeypatch, after_round: int):
    """Run ``config`` into ``out`` and stop it (as Ctrl-C would) after ``after_round`` rounds' checkpoint."""
    import fedstyle.experiments.runner as runner

    original = runner.save_checkpoint

    def save_then_stop(run_dir, tensors, meta):
        path = original(run_dir, tensors, meta)
        if meta["round"] == after_round:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(runner, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, out, quiet=True)
    monkeypatch.setattr(runner, "save_checkpoint", original)


# -- 1. divergence --------------------------------------------------------------------------------
class PoisonedAverage(FedAvg):
    """Aggregates to NaN weights from the second round on (a stand-in for a diverging run)."""

    name = "poisoned_average"

    def aggregate(self, server, updates):
        weights = super().aggregate(server, updates)
        if server.round >= 1:
            key = next(k for k, v in weights.items() if v.is_floating_point())
            weights[key] = weights[key] * float("nan")
        return weights


@pytest.fixture
def poisoned_method():
    METHODS.add(PoisonedAverage.name, PoisonedAverage)
    yield PoisonedAverage.name
    METHODS._items.pop(PoisonedAverage.name)


def test_non_finite_weights_stop_the_run_naming_round_and_lr_and_keep_the_last_good_checkpoint(
        tiny_config, tmp_path, poisoned_method, capsys):
    config = tiny_config.updated(method=poisoned_method, rounds=3, lr=0.03)
    with pytest.raises(TrainingDivergedError, match=r"round 2: .*learning rate 0.0[23]"):
        run_experiment(config, tmp_path / "run", quiet=True)
    _, meta = load_checkpoint(tmp_path / "run")
    assert meta["round"] == 1  # the last good one
    assert [r["round"] for r in evaluations(tmp_path / "run")] == [1]
    assert not (tmp_path / "run" / "done").exists()
    toml = _toml(tmp_path, method=poisoned_method, dataset="folder", data_root=tiny_config.data_root, target="grey",
                 resolution=16, rounds=3, batch_size=8, local_steps=2, min_client_size=2, device="cpu")
    code = main(["run", "--config", toml, "--out", str(tmp_path / "cli"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "diverged in round 2" in err and "Traceback" not in err


def test_a_diverged_run_says_so_to_run_resume_and_report(tiny_config, tmp_path, poisoned_method, capsys):
    """A diverged run was a dead end: --resume diverged again, --out offered --resume, report said "check the
    path". Its folder now records the divergence, and each command names it and the way out."""
    from fedstyle.experiments.report.runs import collect

    out = tmp_path / "run"
    with pytest.raises(TrainingDivergedError):
        run_experiment(tiny_config.updated(method=poisoned_method, rounds=3, lr=0.03), out, quiet=True)
    assert "diverged in round 2" in (out / "diverged.txt").read_text()
    with pytest.raises(ConfigError, match=rf"{out}: the run diverged \(training diverged in round 2: .*\); resuming "
                                          r"repeats it .*start a new run with a lower --lr in another --out"):
        resume_experiment(out, quiet=True)
    with pytest.raises(ConfigError, match=r"holds a run that diverged \(training diverged in round 2.*\); delete it "
                                          r"or choose another --out, with a lower --lr"):
        run_experiment(tiny_config, out, quiet=True)
    with pytest.raises(FedstyleError, match=r"no finished run under .*1 run\(s\) without summary.json: .*run "
                                            r"\(diverged: training diverged in round 2"):
        collect([str(out)])
    with pytest.raises(TrainingDivergedError):  # --restart starts over on purpose (and diverges again here)
        resume_experiment(out, quiet=True, restart=True)


def test_exploded_but_finite_runs_warn():
    rows = [{"round": 1, "train_loss": 2.0, "target_acc": {"a": 0.1}},
            {"round": 2, "train_loss": 2.3e11, "target_acc": {"a": 0.1}}]
    warnings = divergence_warnings(rows, num_classes=10, lr=1e6)
    assert any("2.3e+11" in w and "--lr (now 1e+06)" in w for w in warnings)
    assert any("at chance" in w for w in warnings)
    healthy = [{"round": 1, "train_loss": 2.0, "target_acc": {"a": 0.5}},
               {"round": 2, "train_loss": 1.0, "target_acc": {"a": 0.7}}]
    assert divergence_warnings(healthy, num_classes=10, lr=0.05) == []


def test_warnings_reach_the_summary(tiny_config, tmp_path):
    summary = run_experiment(tiny_config.updated(lr=40.0, momentum=0.0, rounds=1), tmp_path / "run", quiet=True)
    if "warnings" not in summary:  # a run this short may stay sane; then it must not have blown up
        assert summary["target_avg"]["last"] > 0.4
    else:
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"] == summary["warnings"]


# -- 2. no source validation with source-validation selection -------------------------------------
def test_val_fraction_zero_with_source_selection_is_refused_before_writing(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="--val-fraction 0 .* --selection last"):
        run_experiment(tiny_config.updated(val_fraction=0.0), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
    summary = run_experiment(tiny_config.updated(val_fraction=0.0, selection="last", rounds=1), tmp_path / "ok",
                             quiet=True)
    assert summary["selection"] == "last"
    json.loads((tmp_path / "ok" / "summary.json").read_text())  # strict JSON: no bare NaN
    for line in (tmp_path / "ok" / "metrics.jsonl").read_text().splitlines():
        assert "NaN" not in line


# -- 3. one writer per run directory ---------------------------------------------------------------
def _hold_lock(path, ready):
    with DirectoryLock(path):
        ready.set()
        time.sleep(600)


def test_a_locked_run_directory_is_refused_and_a_killed_holder_leaves_no_stale_lock(tiny_config, tmp_path):
    out = tmp_path / "run"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(out, ready))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(LockedError, match=f"in use by process {holder.pid}"):
            run_experiment(tiny_config, out, quiet=True)
        assert not (out / "config.json").exists()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    summary = run_experiment(tiny_config.updated(rounds=1), out, quiet=True)  # the lock died with its holder
    assert summary["rounds"] == 1
    with DirectoryLock(out):  # a resume while another process writes the directory is refused too
        pass


def test_resume_of_a_directory_in_use_is_refused(tiny_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupted_run(tiny_config.updated(rounds=3), out, monkeypatch, after_round=1)
    with DirectoryLock(out):
        with pytest.raises(LockedError, match="in use by process"):
            resume_experiment(out, quiet=True)


# -- 4. metrics.jsonl damaged or lost before a resume ----------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "delete", "garble", "no_round"])
def test_resume_restores_metrics_rows_from_the_checkpoint(tiny_config, tmp_path, monkeypatch, damage):
    config = tiny_config.updated(rounds=3)
    run_experiment(config, tmp_path / "whole", quiet=True)
    out = tmp_path / "cut"
    interrupted_run(config, out, monkeypatch, after_round=2)
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    if damage == "truncate":
        metrics.write_text(lines[0] + "\n")
    elif damage == "delete":
        metrics.unlink()
    elif damage == "garble":
        metrics.write_text(lines[0][:10] + "\n" + "\n".join(lines[1:]) + "\n")
    else:
        metrics.write_text(json.dumps({"seconds": 1}) + "\n" + "\n".join(lines) + "\n")
    resume_experiment(out, quiet=True)
    assert evaluations(out) == evaluations(tmp_path / "whole")


# -- 5, 7. typed config and bounded options, checked before anything is written ---------------------
def _toml(tmp_path: Path, **values) -> str:
    path = tmp_path / f"exp{len(list(tmp_path.glob('exp*.toml')))}.toml"
    hp = values.pop("hparams", None)
    body = "\n".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}" for k, v in values.items())
    if hp:
        body += "\n[hparams]\n" + "\n".join(f"{k} = {v}" for k, v in hp.items())
    path.write_text(body + "\n")
    return str(path)


@pytest.mark.parametrize("setting,value,expected", [
    ("rounds", '"two"', "rounds = 'two' is not a whole number"),
    ("rounds", "2.7", "rounds = 2.7 is not a whole number"),
    ("rounds", "true", "rounds = True is not a whole number"),
    ("lr", '"0.1"', "lr = '0.1' is not a number"),
    ("lr", "nan", "lr = nan is not a finite number"),
])
def test_toml_settings_are_typed(tiny_root, tmp_path, capsys, setting, value, expected):
    path = tmp_path / "exp.toml"
    path.write_text(f'dataset = "folder"\ndata_root = "{tiny_root}"\ntarget = "grey"\n{setting} = {value}\n')
    code = main(["run", "--config", str(path), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args,expected", [
    (["--method", "fedprox", "--hp", "mu=nan"], "not a finite number"),
    (["--method", "fedprox", "--hp", "mu=inf"], "not a finite number"),
    (["--momentum", "2"], "--momentum must be in [0, 1)"),
    (["--seed", "-1"], "--seed must be a whole number"),
    (["--partition", "per_domain", "--clients", "99999"], "without samples"),
])
def test_bad_values_get_one_short_line(tiny_root, tmp_path, capsys, args, expected):
    code = main(["run", "--dataset", "folder", "--data-root", str(tiny_root), "--target", "grey",
                 "--out", str(tmp_path / "run"), "--quiet", *args])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and err.count("\n") == 1 and len(err) < 300
    assert not (tmp_path / "run").exists()


def test_toml_hparams_are_typed(tiny_root, tmp_path, capsys):
    path = _toml(tmp_path, method="fedprox", dataset="folder", data_root=str(tiny_root), target="grey",
                 hparams={"mu": "true"})
    code = main(["run", "--config", path, "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 2 and "'mu'" in capsys.readouterr().err and not (tmp_path / "run").exists()


# -- 6. resume accepts only what cannot change the result -------------------------------------------
def test_resume_refuses_flags_that_change_the_run_and_accepts_a_moved_data_root(
        tiny_config, tiny_root, tmp_path, monkeypatch, capsys):
    import shutil

    out = tmp_path / "run"
    moved = tmp_path / "moved"
    shutil.copytree(tiny_root, moved)
    interrupted_run(tiny_config.updated(rounds=2, data_root=str(moved)), out, monkeypatch, after_round=1)
    for flags in (["--lr", "0.5"], ["--hp", "style=mixstyle"], ["--rounds", "9"], ["--out", str(tmp_path / "x")]):
        code = main(["run", "--resume", str(out), "--quiet", *flags])
        err = capsys.readouterr().err
        assert code == 2 and "accepts only --device, --data-root, --state-budget" in err
        assert flags[0] in err
    shutil.move(moved, tmp_path / "elsewhere")
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert "--data-root" in capsys.readouterr().err
    assert main(["run", "--resume", str(out), "--quiet", "--data-root", str(tmp_path / "elsewhere"),
                 "--device", "cpu", "--state-budget", "0"]) == 0
    assert (out / "done").exists()


# -- 8. one-line errors instead of tracebacks ------------------------------------------------------
def test_unwritable_or_file_out(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="cannot write to --out"):
        run_experiment(tiny_config, Path("/proc/fedstyle-test-out"), quiet=True)  # read-only even for root
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        run_experiment(tiny_config, tmp_path / "afile", quiet=True)


def test_looping_symlink_in_a_data_root(tiny_root, tmp_path, capsys):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(tiny_root, root)
    os.symlink("loop", root / "red" / "bar" / "loop")
    code = main(["run", "--dataset", "folder", "--data-root", str(root), "--target", "grey",
                 "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot be followed" in err and err.count("\n") == 1


def test_config_that_is_a_directory(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path), "--out", str(tmp_path / "run")]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_resume_of_damaged_run_directories(tiny_config, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    summary = run_experiment(tiny_config, whole, quiet=True)
    (whole / "summary.json").unlink()  # finished, but its summary is gone: rebuilt from the checkpoint
    assert resume_experiment(whole, quiet=True) == summary
    bad_json = tmp_path / "badjson"
    interrupted_run(tiny_config, bad_json, monkeypatch, after_round=1)
    (bad_json / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        resume_experiment(bad_json, quiet=True)
    other = tmp_path / "other"  # a checkpoint of another architecture
    interrupted_run(tiny_config.updated(backbone="resnet18"), other, monkeypatch, after_round=1)
    mine = tmp_path / "mine"
    interrupted_run(tiny_config, mine, monkeypatch, after_round=1)
    (mine / CHECKPOINT).write_bytes((other / CHECKPOINT).read_bytes())
    with pytest.raises(FedstyleError, match="holds another model"):
        resume_experiment(mine, quiet=True)


def test_report_on_a_binary_metrics_file(tiny_config, tmp_path, capsys):
    run_experiment(tiny_config.updated(rounds=1), tmp_path / "runs" / "a", quiet=True)
    (tmp_path / "runs" / "a" / "metrics.jsonl").write_bytes(bytes(range(256)))
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "not a text file" in err and err.count("\n") == 1
    assert not (tmp_path / "report" / "report.csv").exists()


# -- 9. checkpoint integrity -----------------------------------------------------------------------
def test_bit_flipped_checkpoint_is_refused(tiny_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupted_run(tiny_config.updated(rounds=3), out, monkeypatch, after_round=1)
    data = bytearray((out / CHECKPOINT).read_bytes())
    data[-5] ^= 0x01  # a bit of the last tensor
    (out / CHECKPOINT).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 does not match"):
        resume_experiment(out, quiet=True)


def test_deleted_checkpoint_is_refused_and_restart_is_on_purpose(tiny_config, tmp_path, monkeypatch, capsys):
    config = tiny_config.updated(rounds=3)
    run_experiment(config, tmp_path / "whole", quiet=True)
    out = tmp_path / "run"
    interrupted_run(config, out, monkeypatch, after_round=2)
    (out / CHECKPOINT).unlink()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert "--restart" in capsys.readouterr().err
    assert main(["run", "--resume", str(out), "--restart", "--quiet"]) == 0
    assert evaluations(out) == evaluations(tmp_path / "whole")


# -- 10. leftovers of dead processes ---------------------------------------------------------------
def _leave_temporary(directory, name):
    path = Path(directory) / f"{temp_prefix(name)}abc.tmp"
    path.write_text("half")
    os._exit(0)  # die without cleaning up


def test_leftovers_of_dead_processes_are_removed_and_live_ones_kept(tiny_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupted_run(tiny_config.updated(rounds=3), out, monkeypatch, after_round=1)
    ctx = multiprocessing.get_context("spawn")
    dead = ctx.Process(target=_leave_temporary, args=(out, "checkpoint.safetensors"))
    dead.start()
    dead.join()
    live = out / f"{temp_prefix('metrics.jsonl')}xyz.tmp"  # this (live) process's
    live.write_text("in progress")
    assert len(list(out.glob(".*.tmp"))) == 2
    resume_experiment(out, quiet=True)
    assert list(out.glob(".*.tmp")) == [live]
    assert remove_leftovers(out) == 0 and live.exists()


def test_cache_staging_of_a_dead_process_is_removed_at_the_next_use(tmp_path):
    from fedstyle.data.cache import _remove_stale_staging

    target = tmp_path / "entry"
    ctx = multiprocessing.get_context("spawn")
    dead = ctx.Process(target=_leave_temporary, args=(tmp_path, "entry"))
    dead.start()
    dead.join()
    staging = next(tmp_path.glob(".entry.*.tmp"))
    _remove_stale_staging(target)
    assert not staging.exists()


# -- kills at every write: the resumed run equals the uninterrupted one ----------------------------
def _run_and_die_at(config, out, point):
    """In a child process: run ``config`` and die (os._exit, no cleanup) at ``point`` in round 2."""
    import fedstyle.experiments.checkpoint as checkpoint
    import fedstyle.experiments.runner as runner
    import fedstyle.io as io

    def die():
        os._exit(9)

    if point == "mid_checkpoint":  # the temporary is written, the rename has not happened
        original_replace = os.replace

        def replace(src, dst):
            if str(dst).endswith(CHECKPOINT) and json.loads(
                    (Path(dst).parent / "metrics.jsonl").read_text().splitlines()[-1])["round"] == 2:
                die()
            return original_replace(src, dst)

        io.os.replace = replace
    elif point in ("after_metrics_row", "after_checkpoint"):
        original_save = checkpoint.save_checkpoint

        def save(run_dir, tensors, meta):
            if meta["round"] == 2 and point == "after_metrics_row":
                die()
            path = original_save(run_dir, tensors, meta)
            if meta["round"] == 2 and point == "after_checkpoint":
                die()
            return path

        runner.save_checkpoint = save
    elif point == "after_summary":
        original_text = runner.atomic_write_text

        def write_text(path, text):
            if Path(path).name == "done":
                die()
            return original_text(path, text)

        runner.atomic_write_text = write_text
    run_experiment(config, out, quiet=True)


def _results(summary: dict) -> dict:
    """The summary less wall time and where each part ran (fedstyle.environment): those may differ, the
    results may not."""
    return {k: v for k, v in summary.items() if k not in ("seconds", "environment", "environment_resumed")}


@pytest.mark.parametrize("point", ["after_metrics_row", "mid_checkpoint", "after_checkpoint", "after_summary"])
def test_a_kill_at_each_write_resumes_to_the_uninterrupted_result(tiny_config, tmp_path, point):
    config = tiny_config.updated(rounds=3)
    whole = run_experiment(config, tmp_path / "whole", quiet=True)
    out = tmp_path / "killed"
    child = multiprocessing.get_context("spawn").Process(target=_run_and_die_at, args=(config, out, point))
    child.start()
    child.join()
    assert child.exitcode == 9 and not (out / "done").exists()
    summary = resume_experiment(out, quiet=True)
    assert evaluations(out) == evaluations(tmp_path / "whole")
    assert _results(summary) == _results(whole)
    assert not list(out.glob(".*.tmp"))  # the dead writer's temporaries are gone


def test_files_follow_the_umask_and_private_keys_stay_private(tmp_path):
    from fedstyle.io import atomic_write_json, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "summary.json", {"a": 1})
        atomic_write_text(tmp_path / "report.md", "x")
        assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644
        assert (tmp_path / "report.md").stat().st_mode & 0o777 == 0o644
        from fedstyle.io import atomic_write

        atomic_write(tmp_path / "site.key", lambda tmp: tmp.write_text("secret"), mode=0o600)
        assert (tmp_path / "site.key").stat().st_mode & 0o777 == 0o600
        # issue 55 item 10: safetensors makes its file anew (0600); the checkpoint follows the umask all the same
        import torch

        from fedstyle.experiments.checkpoint import CHECKPOINT, save_checkpoint

        save_checkpoint(tmp_path, {"w": torch.zeros(2)}, {"round": 1})
        assert (tmp_path / CHECKPOINT).stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.md", "x")
        assert (tmp_path / "private.md").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_deployments_lock_their_run_directory_and_resume_takes_no_settings(tiny_config, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    interrupted_run(tiny_config.updated(rounds=3), out, monkeypatch, after_round=1)
    with DirectoryLock(out):
        assert main(["deploy", "--resume", str(out), "--quiet"]) == 2
        assert "in use by process" in capsys.readouterr().err
        assert main(["deploy", "coordinator", "--resume", str(out), "--quiet"]) == 2
        assert "in use by process" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    with DirectoryLock(fresh):
        assert main(["deploy", "--sites", "3", "--insecure", "--out", str(fresh), "--quiet"]) == 2
        assert "in use by process" in capsys.readouterr().err
    assert main(["deploy", "--resume", str(out), "--lr", "0.5"]) == 2
    assert "accepts only --quiet; drop --lr" in capsys.readouterr().err
