"""The docs' claim that each preset's ``full`` scale is the grid of its ``benchmarks/*_table.py`` script.

docs/guide/sweeps-and-reproduce.md, docs/guide/benchmarks.md, docs/results/pardon.md and
docs/results/fedgca.md say: "Each `full` scale of a preset (`fedstyle reproduce <paper> --scale full`)
is the grid of the matching `benchmarks/*_table.py` script, with the same settings" (for pardon_table.py:
its LODO part). The scripts build their RunConfigs in Python; the presets are TOML expanded by
:func:`fedstyle.experiments.grid.plan_grid`. Here both are planned at full scale for the CPU, nothing run and
no images read (the scripts' ``load_dataset``, used only for the domain names, answers from the registry;
the plan uses ``load_data=False``), and the runs are compared as whole RunConfigs: every field but the
device and the row label, with each method's hyperparameters resolved (its declared defaults filled in, as
the runner writes them) and the model selection resolved. A run is identified by its row (the script's
folder name, the preset's variant name), dataset, partition, protocol, held-out targets, source,
validation domain and seed; every other field must be equal.

ccst_table.py runs ``fedstyle reproduce ccst`` itself: its test checks the command it builds and that its
``--only dataset=...`` keeps the preset's whole full grid.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench_scripts import load_script

#: not compared: where the run goes and how it is named in reports (the scripts' rows carry no label)
IGNORED = ("device", "label")
#: a run's place in the grid; every other RunConfig field is a setting that must agree
IDENTITY = ("dataset", "partition", "protocol", "targets", "source", "val_domain", "seed")


def load_table_script(name: str):
    return load_script(f"{name}.py", f"_table_script_{name}")


def registry_domains(name: str, *args, **kwargs):
    """Stands in for the scripts' ``load_dataset``: they read only ``.domains`` of it."""
    from fedstyle.data.registry import DATASETS

    return SimpleNamespace(domains=list(DATASETS.get(name).domains))


def settings(config) -> dict:
    """The run's settings as the runner resolves them, without the device and the label."""
    from fedstyle.algorithms import METHODS
    from fedstyle.experiments.build import simulation_noise

    out = config.to_dict()
    for key in IGNORED:
        out.pop(key)
    out["hparams"] = simulation_noise(METHODS.get(config.method).resolve(config.hparams))
    out["selection"] = config.resolved_selection()
    return out


def keyed(runs) -> dict[tuple, dict]:
    """(row, identity...) -> settings, for [(row name, RunConfig)]; a duplicate key is an error."""
    out: dict[tuple, dict] = {}
    for row, config in runs:
        values = settings(config)
        key = (row, *(json.dumps(values[k]) for k in IDENTITY))
        assert key not in out, f"two runs share {key}"
        out[key] = values
    return out


def preset_runs(name: str, tmp_path: Path, only=()) -> list[tuple[str, object]]:
    from fedstyle.experiments.grid import parse_grid, plan_grid, read_toml
    from fedstyle.experiments.paper import preset_path

    # as `fedstyle reproduce NAME --scale full --device cpu --dry-run` plans them, without reading images
    grid = parse_grid(read_toml(preset_path(name)), f"preset {name}", scale="full", overrides=[("device", "cpu")])
    plan = plan_grid(grid, tmp_path / "preset", only=only, load_data=False)
    assert all(run.status == "new" for run in plan.runs)
    return [(run.variant, run.config) for run in plan.runs]


def differences(script: dict[tuple, dict], preset: dict[tuple, dict]) -> list[str]:
    """One line per differing field (with the runs it differs in), and per run only one side has."""
    lines: dict[str, list[str]] = {}
    for key in sorted(set(script) & set(preset)):
        a, b = script[key], preset[key]
        for field in sorted(set(a) | set(b)):
            if field == "hparams":
                for hp in sorted(set(a[field]) | set(b[field])):
                    x, y = a[field].get(hp, "<absent>"), b[field].get(hp, "<absent>")
                    if x != y:
                        lines.setdefault(f"hparams.{hp}: script {x!r}, preset {y!r}", []).append(_name(key))
            elif a.get(field) != b.get(field):
                lines.setdefault(f"{field}: script {a.get(field)!r}, preset {b.get(field)!r}", []).append(_name(key))
    for side, only in (("script", set(script) - set(preset)), ("preset", set(preset) - set(script))):
        for key in sorted(only):
            lines.setdefault(f"run only in the {side}", []).append(_name(key))
    return [f"{what} in {len(runs)} runs: {', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''}"
            for what, runs in lines.items()]


def _name(key: tuple) -> str:
    row, *identity = key
    return f"{row}[{','.join(f'{k}={json.loads(v)}' for k, v in zip(IDENTITY, identity) if json.loads(v))}]"


def assert_same(script_runs, preset, expected: int) -> None:
    script, planned = keyed(script_runs), keyed(preset)
    diff = differences(script, planned)
    assert not diff, "the script's full grid and the preset's full scale differ:\n" + "\n".join(diff)
    assert len(script) == len(planned) == expected


# ----------------------------------------------------------------------------- the scripts' full grids


def fedgca_runs(tmp_path: Path):
    module = load_table_script("fedgca_table")
    scale = module.SCALES["full"]
    jobs = []
    for dataset in scale["datasets"]:  # as main() with the defaults: --momentum 0, no --pacs-coefficients
        rows = module.registered(module.variants(dataset, False), log=lambda *_: None)
        base = module.base_config(dataset, scale, "cpu", 0.0)
        jobs += module.plan(tmp_path / "script", dataset, rows, scale["seeds"], base)
    return [(job.run_dir.parent.name, job.config) for job in jobs]


def pardon_runs(tmp_path: Path, monkeypatch):
    module = load_table_script("pardon_table")
    monkeypatch.setattr(module, "load_dataset", registry_domains)
    scale = module.SCALES["full"]
    # the LODO part: protocols=("lodo",), and without the lambda sweep (an LTDO grid)
    _, jobs = module.plan(scale, tmp_path / "script", scale.rounds, "cpu", rows=None, sweep=False,
                          protocols=("lodo",))
    return [(job.name.split("/")[0], job.config) for job in jobs]


def stablefdg_runs(tmp_path: Path, monkeypatch):
    module = load_table_script("stablefdg_table")
    monkeypatch.setattr(module, "load_dataset", registry_domains)
    scale = module.SCALES["full"]
    # as main() with the defaults: both datasets and distributions, every row but the on-request ones
    rows = [v for v in module.variants(scale["ccst"]) if v.name not in module.ON_REQUEST]
    jobs = []
    for dataset in scale["datasets"]:
        targets = registry_domains(dataset).domains
        for distribution in module.DISTRIBUTIONS:
            base = module.base_config(dataset, distribution, scale, "cpu", None)
            jobs += module.plan_jobs(base, rows, scale["seeds"], targets, tmp_path / "script" / dataset / distribution)
    return [(job.name.split("/")[0], job.config) for job in jobs]


def styleddg_runs(tmp_path: Path, monkeypatch):
    module = load_table_script("styleddg_table")
    monkeypatch.setattr(module, "load_dataset", registry_domains)
    args = argparse.Namespace(scale="full", seeds=None, datasets=None, data_root=None, device="cpu", rows=None,
                              targets=None, networks=None, rounds_factor=1, report_only=False,
                              out=str(tmp_path / "script"))
    jobs, _ = module.plan(args)
    return [(job.name.split("/")[0], job.config) for job in jobs]


# ----------------------------------------------------------------------------- the comparisons


def test_the_comparison_sees_a_changed_setting_and_a_missing_run():
    from fedstyle.experiments.config import RunConfig

    base = RunConfig(method="fedavg", device="cpu")
    script = keyed([("fedavg", base), ("ccst", base.updated(method="ccst"))])
    preset = keyed([("fedavg", base.updated(lr=0.1, device="cuda", label="FedAvg"))])
    diff = differences(script, preset)
    assert diff[0].startswith("lr: script 0.05, preset 0.1 in 1 runs: fedavg[")
    assert diff[1].startswith("run only in the script in 1 runs: ccst[")
    assert len(diff) == 2  # device and label are not compared
    # an hparam given explicitly at its default is the same run as one left to the default
    default_k = keyed([("ccst", base.updated(method="ccst", hparams={"k": 3}))])
    assert not differences(default_k, keyed([("ccst", base.updated(method="ccst"))]))


def test_fedgca_table_full_grid_is_the_fedgca_preset_full_scale(tmp_path):
    assert_same(fedgca_runs(tmp_path), preset_runs("fedgca", tmp_path), 17 * 2 * 3)


def test_pardon_table_lodo_grid_is_the_pardon_preset_full_scale(tmp_path, monkeypatch):
    assert_same(pardon_runs(tmp_path, monkeypatch), preset_runs("pardon", tmp_path), 6 * 4 * 3 * 2)


def test_stablefdg_table_full_grid_is_the_stablefdg_preset_full_scale(tmp_path, monkeypatch):
    assert_same(stablefdg_runs(tmp_path, monkeypatch), preset_runs("stablefdg", tmp_path), 9 * 4 * 3 * 2 * 2)


def test_styleddg_table_full_grid_is_the_styleddg_preset_full_scale(tmp_path, monkeypatch):
    assert_same(styleddg_runs(tmp_path, monkeypatch), preset_runs("styleddg", tmp_path), 7 * 4 * 3 * 2 * 2)


def test_ccst_table_runs_the_ccst_preset_full_scale_itself(tmp_path, monkeypatch):
    """ccst_table.py is ``fedstyle reproduce ccst --scale full`` restricted to its --datasets (digits4 by
    default, as docs/results/ccst.md); with both datasets the --only keeps the preset's whole full grid."""
    module = load_table_script("ccst_table")
    calls = []
    monkeypatch.setattr(module, "fedstyle", lambda argv: calls.append(argv) or 0)
    out = tmp_path / "ccst-out"
    for datasets in ([], ["--datasets", "digits4", "fashion4"]):
        monkeypatch.setattr(sys, "argv", ["ccst_table.py", "--out", str(out), "--dry-run", *datasets])
        assert module.main() == 0
    assert calls == [["reproduce", "ccst", "--scale", "full", "--out", str(out), "--dry-run", "--only",
                      "dataset=digits4"],
                     ["reproduce", "ccst", "--scale", "full", "--out", str(out), "--dry-run", "--only",
                      "dataset=digits4,fashion4"]]
    everything = keyed(preset_runs("ccst", tmp_path))
    both = keyed(preset_runs("ccst", tmp_path, only=[("dataset", ["digits4", "fashion4"])]))
    assert not differences(both, everything) and len(both) == 288
