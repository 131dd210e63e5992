"""The run grid behind the benchmarks: layout, skipping finished runs, identical results in worker processes."""

from __future__ import annotations

import json

import pytest

from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep


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
    run_sweep(plan_jobs(tiny_config, variants, [0, 1], ["grey"], serial), log=lambda _: None)
    assert plan_jobs(tiny_config, variants, [0, 1], ["grey"], serial) == []
    run_sweep(plan_jobs(tiny_config, variants, [0, 1], ["grey"], parallel), workers=2, log=lambda _: None)
    for seed in (0, 1):
        a = json.loads((serial / f"fedavg/seed{seed}/grey/summary.json").read_text())
        b = json.loads((parallel / f"fedavg/seed{seed}/grey/summary.json").read_text())
        assert a["targets"] == b["targets"]
