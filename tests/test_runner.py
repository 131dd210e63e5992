"""End-to-end runs on the tiny folder dataset: run directory, determinism, resume, CLI, every method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedstyle.algorithms import METHODS
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import resume_experiment, run_experiment
from fedstyle.federation.star import StarSimulator


def _without_time(summary: dict) -> dict:
    """The summary less what may differ between two runs of one config: wall time, and where each ran
    (fedstyle.environment: a commit made while the tests run changes it; the numbers must not change)."""
    return {k: v for k, v in summary.items() if k not in ("seconds", "environment", "environment_resumed")}


def _metrics(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


def test_run_directory_contents(tiny_config, tmp_path):
    out = tmp_path / "run"
    summary = run_experiment(tiny_config, out, quiet=True)
    for name in ("config.json", "partition.json", "metrics.jsonl", "summary.json", "checkpoint.safetensors", "done"):
        assert (out / name).exists(), name
    config = json.loads((out / "config.json").read_text())
    assert config["backbone"] == "convnet" and config["selection"] == "source_val"
    assert config["hparams"]["style"] == "none"  # resolved with defaults
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    for r in records:
        assert set(r["source_val_acc"]) == {"red", "green", "blue"} and set(r["target_acc"]) == {"grey"}
        assert all(0.0 <= a <= 1.0 for a in [*r["source_val_acc"].values(), *r["target_acc"].values()])
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0
    assert records[1]["bytes_up"] == 2 * records[0]["bytes_up"]  # 3 clients each round, same model size
    assert summary["selected_round"] in (1, 2)
    assert set(summary["targets"]["grey"]) == {"selected", "last"}
    assert summary["targets"]["grey"]["last"] == records[-1]["target_acc"]["grey"]
    partition = json.loads((out / "partition.json").read_text())
    assert partition["num_clients"] == 3 and {c["client"] for c in partition["clients"]} == {0, 1, 2}


def test_same_seed_same_metrics_different_seed_differs(tiny_config, tmp_path):
    a = run_experiment(tiny_config, tmp_path / "a", quiet=True)
    b = run_experiment(tiny_config, tmp_path / "b", quiet=True)
    assert _without_time(a) == _without_time(b)
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
    run_experiment(tiny_config.updated(seed=1), tmp_path / "c", quiet=True)
    assert _metrics(tmp_path / "a") != _metrics(tmp_path / "c")


@pytest.mark.parametrize("method,topology,eval_every", [("mixstyle", "star", 1), ("feddyn", "star", 2),
                                                        ("dsgd", "ring", 1)])
def test_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch, method, topology, eval_every):
    config = tiny_config.updated(method=method, topology=topology, rounds=4, eval_every=eval_every)
    full = run_experiment(config, tmp_path / "full", quiet=True)

    simulator = StarSimulator if topology == "star" else __import__(
        "fedstyle.federation.p2p", fromlist=["P2PSimulator"]).P2PSimulator
    original = simulator.run_round

    def interrupted(self, round_index):
        if round_index == 3:
            raise KeyboardInterrupt
        return original(self, round_index)

    monkeypatch.setattr(simulator, "run_round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", quiet=True)
    assert not (tmp_path / "cut" / "done").exists()
    monkeypatch.setattr(simulator, "run_round", original)
    resumed = resume_experiment(tmp_path / "cut", quiet=True)
    assert _without_time(resumed) == _without_time(full)
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "full")
    assert (tmp_path / "cut" / "done").exists()
    assert resume_experiment(tmp_path / "cut", quiet=True) == json.loads((tmp_path / "cut" / "summary.json").read_text())


#: per-method hyperparameters that keep the smoke runs fast (CCST: one style per image instead of three)
SMOKE_HPARAMS = {"ccst": {"k": 1}}


def _cases():
    for name, cls in METHODS.items():
        for topology in cls.topologies:
            yield name, topology


@pytest.mark.parametrize("method,topology", list(_cases()))
def test_every_method_on_every_topology_it_supports(tiny_config, tmp_path, method, topology):
    config = tiny_config.updated(method=method, topology=topology, rounds=1, radius=1.5,
                                 hparams=SMOKE_HPARAMS.get(method, {}))
    if topology != "star":
        config = config.updated(partition="per_domain", clients=6)
    summary = run_experiment(config, tmp_path / "run", quiet=True)
    assert 0.0 <= summary["targets"]["grey"]["last"] <= 1.0
    if topology != "star":
        assert "device_target_acc_last" in summary and summary["consensus_distance_last"] >= 0


def test_ltdo_selects_on_the_heldout_validation_domain(tiny_config, tmp_path):
    config = tiny_config.updated(protocol="ltdo", targets=["grey"], val_domain="blue", rounds=2)
    summary = run_experiment(config, tmp_path / "run", quiet=True)
    assert summary["selection"] == "heldout_val" and summary["val_domain"] == "blue"
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert set(record["heldout_val_acc"]) == {"blue"} and set(record["source_val_acc"]) == {"red", "green"}


def test_existing_run_directory_is_refused(tiny_config, tmp_path):
    run_experiment(tiny_config, tmp_path / "run", quiet=True)
    with pytest.raises(ConfigError, match="--resume"):
        run_experiment(tiny_config, tmp_path / "run", quiet=True)


def test_bad_options_fail_before_anything_is_written(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="unknown hyperparameter"):
        run_experiment(tiny_config.updated(hparams={"nope": 1}), tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match="--allow-oracle"):
        run_experiment(tiny_config.updated(selection="oracle"), tmp_path / "b", quiet=True)
    with pytest.raises(ConfigError, match="dsgd"):
        run_experiment(tiny_config.updated(topology="ring"), tmp_path / "c", quiet=True)
    with pytest.raises(ConfigError, match="not a domain.*choose from"):
        run_experiment(tiny_config.updated(targets=["purple"]), tmp_path / "d", quiet=True)
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_oracle_is_labelled(tiny_config, tmp_path):
    summary = run_experiment(tiny_config.updated(selection="oracle", allow_oracle=True), tmp_path / "o", quiet=True)
    assert summary["label"].endswith("(oracle)") and "optimistic" in summary["selection_rule"]


def test_cli_run_toml_and_report(tiny_root, tmp_path, capsys):
    toml = tmp_path / "exp.toml"
    toml.write_text(
        f'method = "fedbn"\ndataset = "folder"\ndata_root = "{tiny_root}"\nresolution = 16\ntarget = "grey"\n'
        'rounds = 1\nbatch_size = 8\nlocal_steps = 2\ndevice = "cpu"\n[hparams]\nstyle = "mixstyle"\n'
    )
    assert main(["run", "--config", str(toml), "--seed", "3", "--out", str(tmp_path / "r1"), "--quiet"]) == 0
    config = json.loads((tmp_path / "r1" / "config.json").read_text())
    assert config["seed"] == 3 and config["hparams"]["style"] == "mixstyle" and config["method"] == "fedbn"
    assert "FedBN + MixStyle" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "r1"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").exists() and (tmp_path / "rep" / "accuracy.png").exists()
    assert "FedBN + MixStyle" in capsys.readouterr().out


def test_cli_errors_are_one_clear_line(tiny_root, tmp_path, capsys):
    code = main(["run", "--dataset", "folder", "--data-root", str(tiny_root), "--target", "grey",
                 "--hp", "mu=abc", "--method", "fedprox", "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "mu" in err and "not a valid float" in err and "Traceback" not in err
    assert main(["run", "--resume", str(tmp_path / "nothing")]) == 2
    assert "holds no run" in capsys.readouterr().err


def test_killed_process_resumes_to_the_same_summary(tiny_root, tmp_path):
    """SIGKILL (no chance to clean up) in the middle of a run, then `fedstyle run --resume`."""
    import os
    import signal
    import subprocess
    import sys
    import time

    flags = ["--dataset", "folder", "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey",
             "--rounds", "30", "--batch-size", "8", "--local-steps", "1", "--min-client-size", "2",
             "--device", "cpu", "--quiet"]
    assert main(["run", *flags, "--out", str(tmp_path / "full")]) == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "fedstyle.cli.main", "run", *flags, "--out", str(cut)])
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        metrics = cut / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (cut / "done").exists()
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    resumed = json.loads((cut / "summary.json").read_text())
    assert _without_time(resumed) == _without_time(full)
    assert _metrics(cut) == _metrics(tmp_path / "full")


def test_demo_refuses_a_folder_of_runs_with_other_settings(tiny_config, tmp_path):
    from fedstyle.experiments.demo import _check_same_settings

    run_experiment(tiny_config, tmp_path / "m" / "t", quiet=True)
    _check_same_settings(tmp_path / "m" / "t", tiny_config)  # same settings: reused
    with pytest.raises(ConfigError, match="other settings.*rounds"):
        _check_same_settings(tmp_path / "m" / "t", tiny_config.updated(rounds=7))
    with pytest.raises(ConfigError, match="other settings.*--hp mu"):
        _check_same_settings(tmp_path / "m" / "t", tiny_config.updated(hparams={"mu": 0.1}))


def test_demo_plans_fedavg_mixstyle_and_ccst_on_every_target(monkeypatch):
    from fedstyle.experiments import demo

    class FakeDigits:
        domains = ["mnist", "mnistm", "optdigits", "syn"]

    monkeypatch.setattr(demo, "load_dataset", lambda *a, **k: FakeDigits)
    runs = dict(demo.demo_runs(device="cpu"))
    assert len(runs) == 12 and {name.split("/")[0] for name in runs} == {"fedavg", "mixstyle", "ccst"}
    ccst = runs["ccst/syn"]
    assert ccst.method == "ccst" and ccst.targets == ["syn"]
    assert ccst.hparams == {"style_type": "overall", "k": 3, "style_backend": "fft"}  # CPU: the fast backend
    assert dict(demo.demo_runs(device="cpu", ccst_style_backend="lite"))["ccst/mnist"].hparams["style_backend"] == "lite"


def test_a_run_failing_in_its_setup_leaves_no_run_directory(tiny_config, tmp_path):
    bad = tiny_config.updated(method="ccst", hparams={"k": 1, "decoder_weights": str(tmp_path / "missing.safetensors")})
    with pytest.raises(ConfigError, match="missing.safetensors"):
        run_experiment(bad, tmp_path / "new", quiet=True)
    assert not (tmp_path / "new").exists()  # so the corrected command can use the same --out
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError):
        run_experiment(bad, tmp_path / "empty", quiet=True)
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


def test_protocol_all_trains_the_model_to_deploy_and_a_report_refuses_it(tiny_config, tmp_path, capsys):
    """--protocol all: every domain trains, the model is selected on source validation, and summary.json says so
    (no targets, no target average, the source validation it was chosen on); a report, which compares held-out
    accuracy, refuses such runs by name and writes nothing."""
    from fedstyle.cli.main import main
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.runner import run_experiment

    config = tiny_config.updated(protocol="all", targets=[])
    summary = run_experiment(config, tmp_path / "all", quiet=True)
    assert summary["protocol"] == "all" and summary["targets"] == {}
    assert summary["target_avg"] == {"selected": None, "last": None}
    rows = [json.loads(line) for line in (tmp_path / "all" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "source_val_acc" in r]
    domains = sorted(p.name for p in Path(config.data_root).iterdir() if p.is_dir())
    assert len(domains) == 4 and sorted(evaluated[-1]["source_val_acc"]) == domains  # the target trains too
    assert evaluated[-1]["target_acc"] == {}
    chosen = next(r for r in evaluated if r["round"] == summary["selected_round"])
    assert summary["source_val"]["selected"] == pytest.approx(sum(chosen["source_val_acc"].values()) / 4)
    assert main(["report", str(tmp_path / "all"), "--out", str(tmp_path / "report")]) == 2
    assert "hold no domain out (--protocol all)" in capsys.readouterr().err and not (tmp_path / "report").exists()
    with pytest.raises(ConfigError, match="no target to test on; drop --target grey"):
        RunConfig.from_mapping({**config.to_dict(), "targets": ["grey"]}).validate()
    with pytest.raises(ConfigError, match="no target to select on"):
        config.updated(selection="oracle", allow_oracle=True).validate()


def test_a_dry_run_says_what_the_run_would_train_on_and_writes_nothing(tiny_root, tmp_path, capsys):
    """`fedstyle run --dry-run`: the resolved model, the budget, each source's train / validation images, the
    targets and the partition (the same split and clients as the run builds: compared with its partition.json),
    and nothing on disk; a setting the run would refuse is refused the same way."""
    args = ["run", "--method", "fedavg", "--dataset", "folder", "--data-root", str(tiny_root), "--target", "grey",
            "--rounds", "1", "--local-steps", "2", "--batch-size", "8", "--min-client-size", "2", "--resolution",
            "16", "--device", "cpu", "--data-copies", "2", "--quiet"]
    assert main([*args, "--dry-run", "--out", str(tmp_path / "never")]) == 0
    said = capsys.readouterr().out
    assert not (tmp_path / "never").exists()
    assert "FedAvg (fedavg) on folder, protocol lodo, seed 0" in said and "model: convnet at 16 px; 3 classes" in said
    assert "budget: 1 rounds x 2 local steps of batch 8" in said and "targets (test images): grey 36" in said
    assert said.rstrip().endswith("nothing trained or written; drop --dry-run (and give --out DIR) to train it")
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    partition = json.loads((tmp_path / "run" / "partition.json").read_text())
    header = next(line.split() for line in said.splitlines() if line.split()[:1] == ["client"])
    rows = [line.split() for line in said.splitlines()
            if line.startswith("    ") and len(line.split()) == len(header) and line.split()[0].isdigit()]
    assert len(rows) == 3
    table = {int(r[0]): {d: int(n) for d, n in zip(header[1:-1], r[1:-1]) if int(n)} for r in rows}
    assert table == {c["client"]: c["domains"] for c in partition["clients"]}  # the run's own clients
    assert main(["run", "--resume", str(tmp_path / "run"), "--dry-run"]) == 2
    assert "--dry-run says what a new run would train on; --resume DIR continues one" in capsys.readouterr().err
    assert main([*args, "--dry-run", "--topology", "ring"]) == 2
    assert "method 'fedavg' runs on star, not --topology ring" in capsys.readouterr().err
    assert main([*args, "--dry-run", "--protocol", "ltdo"]) == 2
    assert "protocol 'ltdo' needs exactly one --target and one --val-domain" in capsys.readouterr().err
