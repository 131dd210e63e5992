"""The demo's output is sized for a person (issue 53): a line per run, one partition summary for the table,
no setup counters, what s/run counts, and closing lines naming the report and the next commands. The
training is replaced by a stand-in that writes what a run writes; nothing trains here."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedstyle.experiments import demo


def test_demo_prints_one_partition_summary_and_the_next_commands(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(config, run_dir, quiet=False):
        calls.append(quiet)
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True)
        clients = [{"client": i, "size": 1000 + 100 * i, "domains": {}, "classes": {}} for i in range(3)]
        (run_dir / "partition.json").write_text(json.dumps({"dataset": "digits4", "num_clients": 3,
                                                            "clients": clients}))
        return {"target_avg": {"selected": 0.5}, "seconds": 2.0}

    def fake_report(runs, out, which):
        return SimpleNamespace(), {"markdown": Path(out) / "report.md"}

    monkeypatch.setattr(demo, "load_dataset", lambda *a, **k: SimpleNamespace(domains=["a", "b"]))
    monkeypatch.setattr(demo, "run_experiment", fake_run)
    monkeypatch.setattr(demo, "write_report", fake_report)
    monkeypatch.setattr(demo, "to_text", lambda table: "THE TABLE")
    demo.run_demo(tmp_path / "demo", device="cpu")
    out, err = capsys.readouterr()
    assert calls and all(calls)  # the runs' own partition tables and setup counters stay in their files
    assert out.count("partition:") == 1
    assert "each run trains 3 clients, one per source domain (1,000-1,200 training images each)" in out
    assert "s/run: " in out and "dataset build" in out
    assert out.index("THE TABLE") < out.index(f"report: {tmp_path / 'demo' / 'report' / 'report.md'}")
    assert "fedstyle methods" in out and "--claim 'ccst > fedavg'" in out
    assert err.count("\n") == len(calls)  # one line per run
    assert "augmented_images" not in out + err and "cached_images" not in out + err


@pytest.mark.parametrize("rounds", ["0", "-1"])
def test_demo_refuses_rounds_below_one_before_running(tmp_path, capsys, rounds):
    """--rounds 0 ran the whole default demo (``rounds or default``)."""
    from fedstyle.cli.main import main

    assert main(["demo", "--rounds", rounds, "--out", str(tmp_path / "demo")]) == 2
    assert f"--rounds must be at least 1, got {rounds}" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
