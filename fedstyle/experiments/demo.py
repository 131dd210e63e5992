"""``fedstyle demo``: leave-one-domain-out on digits4, every domain left out in turn, methods compared.

Sized to finish in about five minutes on a 2-core CPU. Runs that already finished in the output
folder are reused, and interrupted ones resumed, so running the demo again is cheap.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fedstyle.data import load_dataset
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_text, write_report
from fedstyle.experiments.runner import CONFIG, DONE, resume_experiment, run_experiment

#: (method, hparams) compared by the demo; the style methods join as they land
DEMO_METHODS: list[tuple[str, dict]] = [("fedavg", {}), ("mixstyle", {})]

DEMO_CONFIG = RunConfig(
    dataset="digits4",
    protocol="lodo",
    partition="domain",
    rounds=6,
    local_steps=15,
    batch_size=64,
    lr=0.05,
    lr_schedule="cosine",
    eval_every=2,
    seed=0,
)


def demo_runs(rounds: int | None = None, device: str = "auto") -> list[tuple[str, RunConfig]]:
    domains = load_dataset("digits4", progress=False).domains
    base = DEMO_CONFIG.updated(device=device, rounds=rounds or DEMO_CONFIG.rounds)
    return [
        (f"{method}/{target}", base.updated(method=method, hparams=dict(hp), targets=[target]))
        for method, hp in DEMO_METHODS
        for target in domains
    ]


def _check_same_settings(run_dir: Path, config: RunConfig) -> None:
    """Reuse a run only if it was made with the settings the demo would use now."""
    stored = json.loads((run_dir / CONFIG).read_text())
    planned = config.to_dict()
    differs = [k for k in ("method", "targets", "rounds", "local_steps", "batch_size", "lr", "seed")
               if stored.get(k) != planned[k]]
    if differs:
        raise ConfigError(f"{run_dir} holds a run made with other settings ({', '.join(differs)}); "
                          f"give the demo another --out or delete {run_dir.parent.parent}")


def run_demo(out: Path, quiet: bool = False, rounds: int | None = None, device: str = "auto") -> None:
    start = time.perf_counter()
    load_dataset("digits4", progress=not quiet)  # build the cache once, with a progress bar
    runs = demo_runs(rounds, device)
    for i, (name, config) in enumerate(runs, 1):
        run_dir = out / name
        if not quiet:
            print(f"[{i}/{len(runs)}] {config.method}, target {config.targets[0]}", file=sys.stderr)
        if (run_dir / CONFIG).exists():
            _check_same_settings(run_dir, config)
            if not (run_dir / DONE).exists():
                resume_experiment(run_dir, quiet=quiet)
        else:
            run_experiment(config, run_dir, quiet=quiet)
    table, paths = write_report([out / m for m, _ in DEMO_METHODS], out / "report", which="selected")
    print(to_text(table))
    for path in paths.values():
        print(f"wrote {path}")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
