"""``fedstyle demo``: leave-one-domain-out on digits4, every domain left out in turn, methods compared.

FedAvg, local MixStyle and CCST (overall style, K = 3). Sized to finish in about five minutes on a
2-core CPU: there CCST stylizes with the ``fft`` backend (amplitude exchange, thousands of images per
second), because the offline AdaIN backend ``lite`` needs about two minutes per held-out domain on
two cores; on a GPU (or with ``--ccst-backend lite``) it uses ``lite``. The table's row label names
the backend. Runs that already finished in the output folder are reused, and interrupted ones
resumed, so running the demo again is cheap.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fedstyle.data import load_dataset
from fedstyle.devices import resolve_device
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_text, write_report
from fedstyle.experiments.runner import CONFIG, DONE, resume_experiment, run_experiment

#: (folder, method, hparams) compared by the demo; the style methods join as they land
DEMO_METHODS: list[tuple[str, str, dict]] = [
    ("fedavg", "fedavg", {}),
    ("mixstyle", "mixstyle", {}),
    ("ccst", "ccst", {"style_type": "overall", "k": 3}),
]

DEMO_CONFIG = RunConfig(
    dataset="digits4",
    protocol="lodo",
    partition="domain",
    rounds=5,
    local_steps=12,
    batch_size=64,
    lr=0.05,
    lr_schedule="cosine",
    eval_every=1,  # every round, so the report's curves are curves
    seed=0,
)


def ccst_backend(choice: str, device: str) -> str:
    """``auto``: ``lite`` (offline AdaIN) when the run goes to a GPU, else ``fft`` (fast on a CPU)."""
    if choice != "auto":
        return choice
    return "lite" if resolve_device(device).type == "cuda" else "fft"


def demo_runs(rounds: int | None = None, device: str = "auto",
              ccst_style_backend: str = "auto") -> list[tuple[str, RunConfig]]:
    domains = load_dataset("digits4", progress=False).domains
    base = DEMO_CONFIG.updated(device=device, rounds=DEMO_CONFIG.rounds if rounds is None else rounds)
    runs = []
    for folder, method, hp in DEMO_METHODS:
        hp = dict(hp)
        if method == "ccst":
            hp["style_backend"] = ccst_backend(ccst_style_backend, device)
        runs += [(f"{folder}/{target}", base.updated(method=method, hparams=hp, targets=[target])) for target in domains]
    return runs


def _check_same_settings(run_dir: Path, config: RunConfig) -> None:
    """Reuse a run only if it was made with the settings the demo would use now."""
    stored = json.loads((run_dir / CONFIG).read_text())
    planned = config.to_dict()
    differs = [k for k in ("method", "targets", "rounds", "local_steps", "batch_size", "lr", "seed")
               if stored.get(k) != planned[k]]
    differs += [f"--hp {k}" for k, v in planned["hparams"].items() if stored.get("hparams", {}).get(k) != v]
    if differs:
        raise ConfigError(f"{run_dir} holds a run made with other settings ({', '.join(differs)}); "
                          f"give the demo another --out or delete {run_dir.parent.parent}")


def partition_line(runs: list[tuple[str, RunConfig]], out: Path) -> str:
    """One partition summary for the whole table: how many clients a run trains and their sizes, over the
    runs' partition.json files."""
    clients = []
    for name, _ in runs:
        path = out / name / "partition.json"
        if path.is_file():
            clients.append([c["size"]
                            for c in json.loads(path.read_text())["clients"]])
    if not clients:
        return ""
    sizes = [size for run in clients for size in run]
    per_run = sorted({len(run) for run in clients})
    return (f"partition: each run trains {'/'.join(map(str, per_run))} clients, one per source domain "
            f"({min(sizes):,}-{max(sizes):,} training images each), and tests on the held-out domain")


def closing_lines(out: Path, report: Path) -> list[str]:
    """Where the report is and the commands to try next."""
    return [
        f"report: {report}  (the table, accuracy per round and the training curves)",
        "next:",
        "  fedstyle methods                                     every method, one line each",
        f"  fedstyle report {out}/fedavg {out}/ccst --claim 'ccst > fedavg' --out {out}/claim",
        "                                                       judge a claim on these runs",
        "  fedstyle run --method fedprox --hp mu=0.01 --target syn --out runs/prox   one run of your own",
        "  fedstyle reproduce --list                            the papers' tables, their claims checked",
    ]


def run_demo(out: Path, quiet: bool = False, rounds: int | None = None, device: str = "auto",
             ccst_style_backend: str = "auto") -> None:
    if rounds is not None and rounds < 1:  # refused before the dataset is built (0 ran the default demo)
        raise ConfigError(f"--rounds must be at least 1, got {rounds} (the demo's default: {DEMO_CONFIG.rounds})")
    start = time.perf_counter()
    load_dataset("digits4", progress=not quiet)  # build the cache once, with a progress bar
    built = time.perf_counter() - start
    runs = demo_runs(rounds, device, ccst_style_backend)
    for i, (name, config) in enumerate(runs, 1):
        run_dir = out / name
        if (run_dir / CONFIG).exists():
            _check_same_settings(run_dir, config)
            summary = None if (run_dir / DONE).exists() else resume_experiment(run_dir, quiet=True)
        else:
            summary = run_experiment(config, run_dir, quiet=True)  # the runs' own chatter stays in their files
        if not quiet:
            done = (f"{100 * summary['target_avg']['selected']:.1f} % in {summary['seconds']:.0f} s"
                    if summary else "done before, reused")
            print(f"[{i}/{len(runs)}] {config.method}, target {config.targets[0]}: {done}", file=sys.stderr)
    table, paths = write_report([out / folder for folder, _, _ in DEMO_METHODS], out / "report", which="selected")
    line = partition_line(runs, out)
    print("\n".join([*([line, ""] if line else []), to_text(table)]))
    print(f"s/run: a run's training from its setup exchange to its last round; the one-time dataset build "
          f"({built:.0f} s) is not in it")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    print("\n".join(closing_lines(out, paths["markdown"])))
