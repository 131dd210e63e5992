"""The run grid: layout, validation before anything runs, skipping and resuming, failures, locks, workers and Ray."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

import fedstyle.experiments.sweep.jobs as sweep_jobs  # attempt() looks run_experiment up there
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.grid import parse_grid, parse_override, plan_grid
from fedstyle.experiments.sweep import (
    LocalLauncher,
    RayLauncher,
    Variant,
    dry_run,
    execute,
    plan_jobs,
    run_plan,
    run_sweep,
)
from fedstyle.io import DirectoryLock

# ----------------------------------------------------------------------------- the Python API


def test_plan_lays_out_variant_seed_target_and_applies_hparams(tiny_config, tmp_path):
    variants = [Variant("fedavg", "fedavg"), Variant("bn-ms", "fedbn", {"style": "mixstyle"})]
    jobs = plan_jobs(tiny_config, variants, [0, 1], ["grey"], tmp_path)
    assert [j.run_dir.relative_to(tmp_path).as_posix() for j in jobs] == [
        "fedavg/seed0/grey", "fedavg/seed1/grey", "bn-ms/seed0/grey", "bn-ms/seed1/grey"]
    assert jobs[2].config.method == "fedbn" and jobs[2].config.hparams == {"style": "mixstyle"}
    assert jobs[3].config.seed == 1 and jobs[3].config.targets == ["grey"]


def test_plan_refuses_duplicate_names(tiny_config, tmp_path):
    with pytest.raises(ValueError, match="unique"):
        plan_jobs(tiny_config, [Variant("a", "fedavg"), Variant("a", "fedprox")], [0], ["grey"], tmp_path)


def test_finished_runs_are_skipped_and_workers_match_serial(tiny_config, tmp_path):
    variants = [Variant("fedavg", "fedavg")]
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    run_sweep(plan_jobs(tiny_config, variants, [0, 1], ["grey"], serial), log=lambda _: None, quiet=True)
    assert plan_jobs(tiny_config, variants, [0, 1], ["grey"], serial) == []
    run_sweep(plan_jobs(tiny_config, variants, [0, 1], ["grey"], parallel), workers=2, log=lambda _: None, quiet=True)
    for seed in (0, 1):
        a = json.loads((serial / f"fedavg/seed{seed}/grey/summary.json").read_text())
        b = json.loads((parallel / f"fedavg/seed{seed}/grey/summary.json").read_text())
        assert a["targets"] == b["targets"]


# ----------------------------------------------------------------------------- sweep files


def grid_text(tiny_root, top: str = "", variants: str = "", base: str = "") -> str:
    """A sweep file on the tiny dataset (1-second runs); ``top``/``variants``/``base`` add lines."""
    default_variants = textwrap.dedent("""
        [[variant]]
        name = "fedavg"
        method = "fedavg"
    """)
    return textwrap.dedent(f"""
        {top}
        [base]
        dataset = "folder"
        data_root = "{tiny_root}"
        resolution = 16
        rounds = 2
        batch_size = 8
        local_steps = 2
        min_client_size = 2
        device = "cpu"
        {base}
    """) + textwrap.dedent(variants or default_variants)


def make_plan(tiny_root, out, *, only=(), overrides=(), scale=None, **parts):
    import tomllib

    grid = parse_grid(tomllib.loads(grid_text(tiny_root, **parts)), "grid.toml", scale=scale, overrides=overrides)
    return plan_grid(grid, out, only=only)


def test_crossed_keys_name_the_folder_between_variant_and_seed(tiny_root, tmp_path):
    top = 'seeds = [0, 1]\ntargets = ["grey", "red"]\nlr = [0.05, 0.1]'
    plan = make_plan(tiny_root, tmp_path, top=top, variants="""
        [[variant]]
        name = "fedavg"
        method = "fedavg"

        [[variant]]
        name = "ms"
        label = "MixStyle"
        method = "mixstyle"
        hparams = { style_p = [0.3, 0.5], style_stages = "layer1" }
    """)
    rels = [r.rel for r in plan.runs]
    assert len(rels) == 2 * 2 * 2 + 2 * 2 * 2 * 2
    assert rels[:3] == ["fedavg/lr=0.05/seed0/grey", "fedavg/lr=0.05/seed0/red", "fedavg/lr=0.05/seed1/grey"]
    assert "ms/lr=0.1,style_p=0.3/seed1/red" in rels
    run = next(r for r in plan.runs if r.rel == "ms/lr=0.1,style_p=0.3/seed1/red")
    assert (run.config.lr, run.config.seed, run.config.targets) == (0.1, 1, ["red"])
    assert run.config.hparams == {"style_p": 0.3, "style_stages": "layer1"}
    # the grid's crossed setting splits the reports; the variant's crossed hyperparameter makes rows
    assert run.group == (("lr", "0.1"),)
    assert (run.row, run.row_label, run.config.label) == ("ms[style_p=0.3]", "MixStyle (style_p=0.3)",
                                                          "MixStyle (style_p=0.3)")
    assert plan.rows == ["fedavg", "ms[style_p=0.3]", "ms[style_p=0.5]"]
    assert set(plan.groups()) == {(("lr", "0.05"),), (("lr", "0.1"),)}
    assert plan.counts() == {"done": 0, "resume": 0, "new": 24}
    assert not any(tmp_path.iterdir())  # planning writes nothing


def test_each_target_and_bundles(tiny_root, tmp_path):
    plan = make_plan(tiny_root, tmp_path, top='targets = "each"')
    assert [r.rel for r in plan.runs] == ["fedavg/seed0/blue", "fedavg/seed0/green", "fedavg/seed0/grey",
                                          "fedavg/seed0/red"]
    top = ('split = [{ name = "g-r", targets = ["grey"], val_domain = "red" },\n'
           '         { targets = ["red"], val_domain = "grey", hparams = { aggregation = "uniform" } }]')
    plan = make_plan(tiny_root, tmp_path, top=top, base='protocol = "ltdo"')
    assert [r.rel for r in plan.runs] == ["fedavg/split=g-r/seed0/grey", "fedavg/split=red-grey-uniform/seed0/red"]
    second = plan.runs[1].config
    assert (second.targets, second.val_domain, second.hparams) == (["red"], "grey", {"aggregation": "uniform"})
    # single_source: the protocol picks the targets, the folder says so
    plan = make_plan(tiny_root, tmp_path, top='source = ["red", "blue"]', base='protocol = "single_source"')
    assert [r.rel for r in plan.runs] == ["fedavg/source=red/seed0/others", "fedavg/source=blue/seed0/others"]


def test_base_hparams_apply_where_the_method_declares_them(tiny_root, tmp_path):
    variants = """
        [[variant]]
        name = "fedavg"
        method = "fedavg"

        [[variant]]
        name = "prox"
        method = "fedprox"
        hparams = { mu = 0.5 }
    """
    plan = make_plan(tiny_root, tmp_path, variants=variants, base="hparams = { mu = 0.1, style_p = 0.2 }",
                     top='targets = ["grey"]')
    fedavg, prox = (r.config.hparams for r in plan.runs)
    assert fedavg == {"style_p": 0.2}  # fedavg has no mu
    assert prox == {"mu": 0.5, "style_p": 0.2}  # the variant's own value wins


@pytest.mark.parametrize("parts, message", [
    ({"top": "rounds = 3"}, "fixed settings go in [base]"),
    ({"top": 'lr = ["fast", 0.1]'}, "lr = 'fast' is not a number"),
    ({"top": "hparams.mu = [0.1, 1.0]"}, "fedavg has no hyperparameter 'mu'"),
    ({"top": 'targets = ["grey", "purple"]'}, "target purple: --target 'purple' is not a domain of folder"),
    ({"overrides": [("rounds", 0)]}, "seed 0 target grey: --rounds must be at least 1"),
    ({"base": "hparams = { mu = 0.1 }"}, "'mu' is a hyperparameter of none of the variants' methods"),
    ({"base": "clients = 50", "top": 'targets = ["grey"]\npartition = ["per_domain"]'},
     "(partition=per_domain) seed 0 target grey: partitioner 'per_domain' splits"),
    ({"variants": '[[variant]]\nname = "x"\nmethod = "fedavgg"'}, "unknown method 'fedavgg'"),
    ({"variants": '[[variant]]\nname = "x"\nmethod = "ccst"\nhparams = { k = [1, 0] }'}, "'k' of ccst: 0 is below"),
    ({"variants": '[[variant]]\nname = "a/b"\nmethod = "fedavg"'}, "cannot name a folder"),
    ({"variants": '[[variant]]\nname = "a"\nmethod = "fedavg"\n[[variant]]\nname = "a"\nmethod = "fedprox"'},
     "two variants are named 'a'"),
    ({"top": 'claims = ["fedavg > nothing"]', "base": 'targets = ["grey"]'}, "'nothing', which is no variant"),
    ({"top": "lam = [0.1]\nlr = [0.1]", "variants": '[[variant]]\nname = "a"\nmethod = "fedavg"\nlam = 0.5'},
     "variant 'a' sets lam, which the grid crosses"),
])
def test_a_bad_grid_is_one_line_before_anything_is_written(tiny_root, tmp_path, parts, message):
    parts.setdefault("top", 'targets = ["grey"]')
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as caught:
        make_plan(tiny_root, out, **parts)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not out.exists()


def test_overrides_and_only(tiny_root, tmp_path):
    assert parse_override("rounds=2") == ("rounds", 2)
    assert parse_override("data_root=/tmp/x y") == ("data_root", "/tmp/x y")
    assert parse_override("seeds=[0, 1]") == ("seeds", [0, 1])
    assert parse_override("hparams.style_backend=fft") == ("hparams.style_backend", "fft")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("rounds")
    top = 'seeds = [0, 1]\ntargets = ["grey", "red"]\nlr = [0.05, 0.1]'
    plan = make_plan(tiny_root, tmp_path, top=top, overrides=[("lr", 0.2), ("seeds", [5]), ("rounds", 1)])
    assert [r.rel for r in plan.runs] == ["fedavg/seed5/grey", "fedavg/seed5/red"]  # lr fixed: no longer crossed
    assert {(r.config.lr, r.config.rounds) for r in plan.runs} == {(0.2, 1)}
    plan = make_plan(tiny_root, tmp_path, top=top, only=[("lr", ["0.1"]), ("target", ["red"])])
    assert [r.rel for r in plan.runs] == ["fedavg/lr=0.1/seed0/red", "fedavg/lr=0.1/seed1/red"]
    with pytest.raises(ConfigError, match="lr takes 0.05, 0.1"):
        make_plan(tiny_root, tmp_path, top=top, only=[("lr", ["0.3"])])


def test_scales_override_the_grid(tiny_root, tmp_path):
    top = textwrap.dedent("""
        seeds = [0, 1, 2]
        targets = ["grey", "red"]
        [scales.quick]
        seeds = [0]
        variants = ["fedavg"]
        lr = [0.1, 0.2]
        [scales.quick.base]
        rounds = 1
        [scales.long]
        description = "all of it"
    """)
    variants = '[[variant]]\nname = "fedavg"\nmethod = "fedavg"\n[[variant]]\nname = "prox"\nmethod = "fedprox"'
    plan = make_plan(tiny_root, tmp_path, top=top, variants=variants, scale="quick")
    assert [r.rel for r in plan.runs] == ["fedavg/lr=0.1/seed0/grey", "fedavg/lr=0.1/seed0/red",
                                          "fedavg/lr=0.2/seed0/grey", "fedavg/lr=0.2/seed0/red"]
    assert {r.config.rounds for r in plan.runs} == {1}
    assert len(make_plan(tiny_root, tmp_path, top=top, variants=variants, scale="long").runs) == 12
    with pytest.raises(ConfigError, match="choose a scale with --scale: quick, long"):
        make_plan(tiny_root, tmp_path, top=top, variants=variants)


def write_grid(tmp_path, tiny_root, **parts) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(grid_text(tiny_root, **parts))
    return path


def summaries(out: Path) -> dict[str, dict]:
    """Every run's summary, without what differs between identical runs (time, and where it ran: a commit made
    while the tests run changes fedstyle.environment's record, never the numbers)."""
    found = {}
    for path in sorted(out.rglob("summary.json")):
        summary = json.loads(path.read_text())
        for key in ("seconds", "environment", "environment_resumed"):
            summary.pop(key, None)
        found[path.parent.relative_to(out).as_posix()] = summary
    return found


def test_finished_runs_are_skipped_interrupted_ones_resumed_and_a_changed_grid_refused(tiny_root, tmp_path, capsys):
    grid = write_grid(tmp_path, tiny_root, top='seeds = [0, 1]\ntargets = ["grey"]')
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--quiet"]) == 0
    first = summaries(out)
    assert set(first) == {"fedavg/seed0/grey", "fedavg/seed1/grey"}
    assert (out / "report.md").is_file() and (out / "report.csv").is_file()
    # an interrupted run: its checkpoint is there, its summary and done marker are not
    (out / "fedavg/seed1/grey/done").unlink()
    (out / "fedavg/seed1/grey/summary.json").unlink()
    capsys.readouterr()
    assert main(["sweep", str(grid), "--out", str(out), "--dry-run"]) == 0
    listing = capsys.readouterr().out
    assert "2 runs in" in listing and "1 done, 1 to resume, 0 new" in listing
    assert "done     fedavg/seed0/grey" in listing and "resume   fedavg/seed1/grey" in listing
    assert main(["sweep", str(grid), "--out", str(out), "--quiet"]) == 0
    assert "1 runs ran" in capsys.readouterr().out  # the finished one was skipped
    assert summaries(out) == first  # the resumed run ends as the uninterrupted one did
    # the same folder with other settings: refused before anything runs, naming the setting
    changed = write_grid(tmp_path, tiny_root, top='seeds = [0, 1]\ntargets = ["grey"]', base="lr = 0.1")
    assert main(["sweep", str(changed), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds a run made with other settings (lr (0.05 there, 0.1 here))" in err
    assert "(and 1 more run directories)" in err


def test_a_failed_run_is_reported_and_the_others_go_on(tiny_root, tmp_path, monkeypatch, capsys):
    grid = write_grid(tmp_path, tiny_root, top='seeds = [0, 1]\ntargets = ["grey"]')
    out = tmp_path / "out"
    real = sweep_jobs.run_experiment

    def flaky(config, run_dir, **kwargs):
        if config.seed == 0:
            raise RuntimeError("boom\nmore lines of it")
        return real(config, run_dir, **kwargs)

    monkeypatch.setattr(sweep_jobs, "run_experiment", flaky)
    assert main(["sweep", str(grid), "--out", str(out), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "failed: fedavg/seed0/grey: RuntimeError: boom (...)" in captured.err
    assert "1 run(s) failed" in captured.err
    assert (out / "fedavg/seed1/grey/done").exists()
    assert not (out / "fedavg/seed0/grey").exists()
    log = (out / "sweep.log").read_text()
    assert "failed fedavg/seed0/grey" in log and "Traceback" in log and "done fedavg/seed1/grey" in log
    assert "| fedavg |" in (out / "report.md").read_text()  # the report covers the finished runs


def test_a_run_another_process_holds_is_reported_not_retried(tiny_root, tmp_path, capsys):
    grid = write_grid(tmp_path, tiny_root, top='targets = ["grey"]')
    out = tmp_path / "out"
    run_dir = out / "fedavg/seed0/grey"
    with DirectoryLock(run_dir):  # another sweep's run, just started
        capsys.readouterr()
        assert main(["sweep", str(grid), "--out", str(out), "--dry-run"]) == 0
        assert "running  fedavg/seed0/grey" in capsys.readouterr().out
        assert main(["sweep", str(grid), "--out", str(out), "--quiet"]) == 1
        err = capsys.readouterr().err
    assert "in use: fedavg/seed0/grey:" in err and "is in use by process" in err and "(not retried)" in err
    assert "being run by another process" in err
    assert not (run_dir / "config.json").exists()


def test_groups_get_reports_of_their_own_joined_by_an_index(tiny_root, tmp_path):
    grid = write_grid(tmp_path, tiny_root, top='targets = ["grey"]\nlr = [0.05, 0.1]')
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--quiet"]) == 0
    for value in ("0.05", "0.1"):
        text = (out / f"reports/lr={value}/report.md").read_text()
        assert "| fedavg |" in text and f"lr {value}" in text  # the group's setting is among the shared ones
    index = (out / "report.md").read_text()
    assert "## lr 0.05" in index and "## lr 0.1" in index and "reports/lr=0.1/report.md" in index
    rows = (out / "report.csv").read_text().splitlines()
    assert rows[0].startswith("lr,method,") and len(rows) == 3
    assert rows[1].startswith("0.05,fedavg,") and rows[2].startswith("0.1,fedavg,")


def test_help_teaches_with_a_valid_example(capsys):
    from fedstyle.cli.sweep import SWEEP_EPILOG

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = capsys.readouterr().out
    assert "[[variant]]" in text and "--launcher ray" in text and "shared filesystem" in text
    example = SWEEP_EPILOG.split("a sweep file (grid.toml):\n")[1].split("\nexamples:")[0]
    import tomllib

    grid = parse_grid(tomllib.loads(textwrap.dedent(example)), "help example")
    assert [v.name for v in grid.variants] == ["fedavg", "mixstyle", "ccst-k3"]
    assert [a.name for a in grid.axes] == ["lam"] and grid.targets == "each"


def test_launcher_flags_are_checked(tiny_root, tmp_path, capsys):
    grid = write_grid(tmp_path, tiny_root, top='targets = ["grey"]')
    assert main(["sweep", str(grid), "--address", "auto"]) == 2
    assert "--address is for --launcher ray" in capsys.readouterr().err
    assert main(["sweep", str(grid), "--launcher", "ray", "--workers", "2"]) == 2
    assert "--workers is for --launcher local" in capsys.readouterr().err


def test_ray_missing_names_the_install_command(monkeypatch, tiny_config, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    jobs = plan_jobs(tiny_config, [Variant("fedavg", "fedavg")], [0], ["grey"], tmp_path)
    with pytest.raises(ConfigError, match=r"install it with: pip install -c constraints.txt 'fedstyle\[flower-sim\]'"):
        execute(jobs, RayLauncher(), quiet=True)


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on workers
@pytest.mark.slow
def test_ray_gives_the_summaries_of_one_local_worker(tiny_root, tmp_path):
    """A 4-run sweep as Ray tasks on a 2-CPU local Ray instance equals the same sweep run serially."""
    pytest.importorskip("ray")
    import tomllib

    data = tomllib.loads(grid_text(tiny_root, top='seeds = [0, 1]\ntargets = ["grey", "red"]'))
    local, remote = tmp_path / "local", tmp_path / "ray"
    plan = plan_grid(parse_grid(data, "grid.toml"), local)
    outcome, _ = run_plan(plan, LocalLauncher(1, threads=1), quiet=True)
    assert len(outcome.finished) == 4 and outcome.ok
    plan = plan_grid(parse_grid(data, "grid.toml"), remote)
    outcome, _ = run_plan(plan, RayLauncher(cpus_per_run=1, init={"num_cpus": 2}), quiet=True)
    assert len(outcome.finished) == 4 and outcome.ok, [r.error for r in outcome.failed]
    assert {r.status for r in outcome.finished} == {"done"}
    assert summaries(local) == summaries(remote)
    assert len(summaries(local)) == 4


def test_legacy_run_sweep_raises_after_running_the_others(tiny_config, tmp_path, monkeypatch):
    real = sweep_jobs.run_experiment

    def flaky(config, run_dir, **kwargs):
        if config.seed == 0:
            raise FedstyleError("bad seed")
        return real(config, run_dir, **kwargs)

    monkeypatch.setattr(sweep_jobs, "run_experiment", flaky)
    jobs = plan_jobs(tiny_config, [Variant("fedavg", "fedavg")], [0, 1], ["grey"], tmp_path)
    with pytest.raises(FedstyleError, match="1 run\\(s\\) failed .* fedavg/seed0/grey: bad seed"):
        run_sweep(jobs, log=lambda _: None, quiet=True)
    assert (tmp_path / "fedavg/seed1/grey/done").exists()


def test_report_only_without_a_finished_run_and_an_out_that_is_a_file_are_refused(tiny_root, tmp_path, capsys):
    """--report-only with nothing finished wrote an empty report and exited 0; a dry run took --out FILE."""
    grid = write_grid(tmp_path, tiny_root, top='seeds = [0]\ntargets = ["grey"]')
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--report-only", "--quiet"]) == 2
    assert "none of the 1 runs under" in capsys.readouterr().err and not out.exists()
    a_file = tmp_path / "afile"
    a_file.write_text("")
    assert main(["sweep", str(grid), "--out", str(a_file), "--dry-run"]) == 2
    assert f"--out {a_file} is a file" in capsys.readouterr().err


def test_a_device_no_run_can_use_is_refused_before_any_run(tiny_root, tmp_path, capsys, monkeypatch):
    """--device banana was accepted by a dry run and, without one, failed every run one by one (24 failures and an
    empty report); a GPU this machine lacks fails every run the same way, so it is refused up front too, while a
    dry run may plan a GPU sweep here."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    grid = write_grid(tmp_path, tiny_root, top='seeds = [0]\ntargets = ["grey"]')
    out = tmp_path / "out"
    for extra in (["--dry-run"], []):
        assert main(["sweep", str(grid), "--out", str(out), "--device", "banana", "--quiet", *extra]) == 2
        assert "--device 'banana' is not a device" in capsys.readouterr().err and not out.exists()
    assert main(["sweep", str(grid), "--out", str(out), "--device", "cuda", "--quiet"]) == 2
    assert "asked for CUDA but this torch sees no GPU" in capsys.readouterr().err and not out.exists()
    assert main(["sweep", str(grid), "--out", str(out), "--device", "cuda", "--dry-run"]) == 0
    assert "fedavg/seed0/grey" in capsys.readouterr().out


def test_dry_run_lists_every_run(tiny_root, tmp_path):
    plan = make_plan(tiny_root, tmp_path, top='seeds = [0]\ntargets = ["grey", "red"]')
    lines = []
    dry_run(plan, lines.append)
    assert lines[0].endswith("2 runs in " + str(tmp_path) + " — 0 done, 0 to resume, 2 new")
    assert [line.split()[:2] for line in lines[1:]] == [["new", "fedavg/seed0/grey"], ["new", "fedavg/seed0/red"]]
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_workers_stop_when_the_sweep_process_is_killed(tiny_config, tmp_path):
    """A sweep killed outright (SIGKILL, or a SIGTERM its caller does not handle) leaves no worker
    running its runs on: each stops within seconds, its run directory unlocked and resumable."""
    import signal
    import subprocess
    import sys
    import time

    from fedstyle.io import DirectoryLock

    script = tmp_path / "sweep.py"
    script.write_text(textwrap.dedent(f"""
        from fedstyle.experiments.config import RunConfig
        from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep
        if __name__ == "__main__":  # the workers are spawned: they import this file
            base = RunConfig.from_mapping({tiny_config.updated(rounds=100000, eval_every=100000).to_dict()!r})
            jobs = plan_jobs(base, [Variant("fedavg", "fedavg")], [0, 1], ["grey"], {str(tmp_path / "runs")!r})
            run_sweep(jobs, workers=2, log=lambda _: None, quiet=True)
    """))
    parent = subprocess.Popen([sys.executable, str(script)])
    runs = [tmp_path / "runs" / "fedavg" / f"seed{s}" / "grey" for s in (0, 1)]

    def locked(run_dir) -> bool:
        if not (run_dir / "config.json").exists():
            return False
        try:
            DirectoryLock(run_dir).acquire().release()
            return False
        except Exception:
            return True

    deadline = time.monotonic() + 120
    while not all(locked(r) for r in runs):  # both workers are training
        assert parent.poll() is None and time.monotonic() < deadline, "the sweep did not start its runs"
        time.sleep(0.5)
    workers = _workers_of(parent.pid)
    assert len(workers) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while any(locked(r) for r in runs):
        assert time.monotonic() < deadline, "a worker kept running after its sweep was killed"
        time.sleep(0.5)
    assert not any((r / "done").exists() for r in runs)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker process outlived its sweep"
        time.sleep(0.5)


def test_a_worker_whose_interrupt_is_swallowed_exits_after_the_grace(tmp_path):
    """The interrupt can be lost (Python only prints a KeyboardInterrupt raised in a weakref
    callback): a worker whose sweep is gone still exits, ``grace`` seconds after its interrupt."""
    import subprocess
    import sys
    import time

    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import signal, time
        from fedstyle.experiments.sweep.launchers import _watch_parent
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interrupt goes nowhere, as when swallowed
        _watch_parent(parent=-1, poll=0.05, grace=0.5)  # -1 is nobody's pid: "the parent is gone"
        time.sleep(60)
    """))
    start = time.monotonic()
    worker = subprocess.run([sys.executable, str(script)], timeout=30)
    assert worker.returncode == 130
    assert time.monotonic() - start < 20


def _workers_of(parent: int) -> list[int]:
    """The pool worker processes a sweep process started (Linux /proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().split(")")[-1].split()[1])
            if ppid == parent and b"spawn_main" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_finished_run_of_a_method_with_a_style_defence_is_reused(tmp_path):
    """The runner stores ``dp_noise_source=auto`` as the ``seeded`` stream a simulation uses; the sweep's
    reuse check must resolve it the same way, or every finished CCST/PARDON/StableFDG run of a grid is
    refused as "made with other settings" (found on 2026-11-26 re-reporting a FedOMG grid with StableFDG rows)."""
    from fedstyle.algorithms import METHODS
    from fedstyle.experiments.build import simulation_noise
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.grid.plan import run_status

    planned = RunConfig(method="stablefdg", dataset="digits4", targets=["mnistm"])
    stored = planned.to_dict()
    stored["hparams"] = simulation_noise(METHODS.get("stablefdg").resolve(planned.hparams))
    stored["selection"] = planned.resolved_selection()  # as resolve_config writes it
    assert stored["hparams"]["dp_noise_source"] == "seeded"  # what a finished run's config.json holds
    run_dir = tmp_path / "stablefdg" / "seed0" / "mnistm"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(stored))
    assert run_status(run_dir, planned) == "resume"
    (run_dir / "done").write_text("")
    assert run_status(run_dir, planned) == "done"
    other = json.loads((run_dir / "config.json").read_text())
    other["hparams"]["dp_noise_source"] = "os"  # a deployment's noise is another run
    (run_dir / "config.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="hparams.dp_noise_source"):
        run_status(run_dir, planned)


def test_a_finished_run_older_than_a_new_option_is_reused_at_its_default(tmp_path):
    """A method option added after a run (FedDG-GA's gap_fraction, 2026-11-29) is absent from its config.json: the
    run had the option's default, so the sweep reuses it; planned with another value, it is another run."""
    from fedstyle.algorithms import METHODS
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.grid.plan import run_status

    planned = RunConfig(method="feddg_ga", dataset="digits4", targets=["mnist"])
    stored = planned.to_dict()
    stored["hparams"] = {k: v for k, v in METHODS.get("feddg_ga").resolve({}).items() if k != "gap_fraction"}
    stored["selection"] = planned.resolved_selection()
    run_dir = tmp_path / "feddg_ga" / "seed0" / "mnist"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(stored))
    (run_dir / "done").write_text("")
    assert run_status(run_dir, planned) == "done"
    with pytest.raises(ConfigError, match=r"hparams\.gap_fraction"):
        run_status(run_dir, planned.updated(hparams={"gap_fraction": 0.1}))


def test_a_sigterm_to_the_sweep_stops_its_runs_within_seconds(tiny_config, tmp_path):
    """`kill PID` of a sweep (SIGTERM, which the CLI turns into Ctrl-C) stops the runs under way at once, resumable,
    instead of waiting for them to end: the workers get no signal of their own. The runs the pool has queued do not
    start. The sweep is started as nohup or `&` start it, ignoring SIGINT."""
    import signal
    import subprocess
    import sys
    import contextlib
    import time

    from fedstyle.experiments.checkpoint import CHECKPOINT

    script = tmp_path / "sweep.py"
    script.write_text(textwrap.dedent(f"""
        from fedstyle.cli.flags import stop_on_sigterm
        from fedstyle.experiments.config import RunConfig
        from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep
        if __name__ == "__main__":  # the workers are spawned: they import this file
            stop_on_sigterm()
            base = RunConfig.from_mapping({tiny_config.updated(rounds=100000, eval_every=1).to_dict()!r})
            jobs = plan_jobs(base, [Variant("fedavg", "fedavg")], [0, 1, 2, 3], ["grey"], {str(tmp_path / "runs")!r})
            try:
                run_sweep(jobs, workers=2, log=lambda _: None, quiet=True)
            except KeyboardInterrupt:
                raise SystemExit(130)
    """))
    parent = subprocess.Popen([sys.executable, str(script)],
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    runs = [tmp_path / "runs" / "fedavg" / f"seed{s}" / "grey" for s in (0, 1)]  # the first two jobs
    queued = [tmp_path / "runs" / "fedavg" / f"seed{s}" / "grey" for s in (2, 3)]
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not all((r / CHECKPOINT).exists() for r in runs):  # both runs have a round behind them
            assert parent.poll() is None and time.monotonic() < deadline, "the sweep did not start its runs"
            time.sleep(0.5)
        workers = _workers_of(parent.pid)
        assert len(workers) == 2
        parent.send_signal(signal.SIGTERM)
        start = time.monotonic()
        try:
            code = parent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the sweep waited for its runs to end after SIGTERM")
        assert code == 130 and time.monotonic() - start < 30
        assert not any(r.exists() for r in queued), "a queued run started after the interrupt"
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "a worker outlived its sweep"
            time.sleep(0.2)
    finally:  # never leave a 100,000-round sweep behind
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        for pid in workers:
            if _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert not any((r / "done").exists() for r in runs) and all((r / CHECKPOINT).exists() for r in runs)


def test_a_workers_first_signal_stops_its_run_and_every_later_job(monkeypatch):
    """The worker's handler: the first SIGINT or SIGTERM interrupts the run under way, a second one is ignored (Ctrl-C
    and the sweep's SIGTERM together), and a job handed over afterwards does not start."""
    from fedstyle.experiments.sweep import launchers

    monkeypatch.setattr(launchers, "_WORKER", {"running": False, "stopping": False})
    started = []
    monkeypatch.setattr(launchers, "attempt", lambda job, threads, marker: started.append(job) or "done")
    assert launchers._attempt_in_worker("a", None, os.getppid()) == "done"
    launchers._WORKER["running"] = True
    with pytest.raises(KeyboardInterrupt):
        launchers._stop_run_on_signal(15, None)
    launchers._stop_run_on_signal(2, None)  # the second signal: no second interrupt while the run unwinds
    launchers._WORKER["running"] = False
    with pytest.raises(KeyboardInterrupt):
        launchers._attempt_in_worker("b", None, os.getppid())
    assert started == ["a"]


def test_an_idle_workers_signal_stops_the_next_job(monkeypatch):
    from fedstyle.experiments.sweep import launchers

    monkeypatch.setattr(launchers, "_WORKER", {"running": False, "stopping": False})
    monkeypatch.setattr(launchers, "attempt", lambda job, threads, marker: "done")
    launchers._stop_run_on_signal(15, None)  # between runs: nothing to interrupt, no exception
    with pytest.raises(KeyboardInterrupt):
        launchers._attempt_in_worker("a", None, os.getppid())


def test_a_run_that_diverges_in_a_sweep_is_named_with_the_settings_to_change(tiny_root, tmp_path, capsys):
    """The sweep said "run the same command again" for a run that diverged, which repeats the divergence."""
    from fedstyle.algorithms import METHODS
    from fedstyle.algorithms.fedavg import FedAvg

    class NaNAverage(FedAvg):
        name = "nan_average"

        def aggregate(self, server, updates):
            weights = super().aggregate(server, updates)
            key = next(k for k, v in weights.items() if v.is_floating_point())
            weights[key] = weights[key] * float("nan")
            return weights

    METHODS.add(NaNAverage.name, NaNAverage)
    try:
        grid = write_grid(tmp_path, tiny_root, top='seeds = [0]\ntargets = ["grey"]',
                          variants='[[variant]]\nname = "nan"\nmethod = "nan_average"\n')
        assert main(["sweep", str(grid), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    finally:
        METHODS._items.pop(NaNAverage.name)
    err = capsys.readouterr().err
    assert "1 run(s) diverged, e.g. nan/seed0/grey: training diverged in round 1" in err
    assert "lower their lr in the sweep file (or --set lr=...)" in err and "run the same command again" not in err
