"""Many clients on one machine: peak memory and seconds per round against the total client count.

Job (per cell): digits4, leave MNIST out, ``--partition lambda --lam 0.1`` over N clients, 10 of them
sampled per round, ConvNet, ``--local-steps 5`` of batch 32 per client per round (the same work per
round at every N), constant learning rate, evaluation and checkpoint after the last round only. So
that every client holds at least two batches of samples at every N, the training samples are dealt
``--data-copies K`` times with K = ceil(N * 64 / training samples) (documented resampling with
replacement across clients: digits4 has ~6,100 training samples, so N = 1,000 needs K = 11 and
N = 10,000 needs K = 105). Per-client state (FedDyn's gradient vector, 115,402 floats = 462 kB
per client for the ConvNet) is kept in memory up to ``--state-budget`` (default here 8MB, about 17
FedDyn states: from 100 clients on, the states of earlier rounds' clients go to disk within the
few rounds measured) and on disk beyond it.

Each (method, N) cell runs in a fresh Python process (so peak RSS is that cell's alone) through the
real runner (``run_experiment``: run directory, checkpoint with the client-state files); the
child times every round (wall clock, and the process's CPU time, which load from other processes on
a shared machine disturbs less) and reports its peak resident set size (``resource.getrusage`` ru_maxrss,
which includes the dataset cache's memory-mapped pages it touched). Seconds per round: the median
over rounds 2..R (round 1 pays one-off warm-up). The table gives, per cell, the peak RSS as a
multiple of the 10-client cell's (target at 1,000 clients: <= 1.5x) and seconds per round (target:
independent of N).

    python benchmarks/many_clients.py                         # 10, 100, 1000 and 10000 clients, FedAvg and FedDyn
    python benchmarks/many_clients.py --clients 10 100 1000 --rounds 4 --out /tmp/many
    python benchmarks/many_clients.py --report-only --out /tmp/many

Writes ``OUT/results.jsonl`` (one line per cell) and ``OUT/table.md``; the run directories land
in ``OUT/runs/`` (``--keep-runs`` keeps them; by default each is removed after it is measured, as
10,000 FedDyn clients' states take ~4.6 GB once they have all trained).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's fedstyle, in the children too

TRAIN_SAMPLES_PER_CLIENT = 64  # at least two batches of 32 per client at every N


def cell_config(method: str, clients: int, args) -> dict:
    """The run settings of one cell (a RunConfig mapping); the copies need the dataset's training size."""
    return dict(method=method, dataset=args.dataset, targets=[args.target], partition="lambda", lam=0.1,
                clients=clients, clients_per_round=min(args.clients_per_round, clients), rounds=args.rounds,
                local_steps=args.local_steps, batch_size=32, lr=0.05, lr_schedule="constant", eval_every=args.rounds,
                device=args.device, state_budget=args.state_budget, seed=0)


def run_cell(spec: dict) -> dict:
    """In the child process: run one cell, time its rounds, measure its memory."""
    import torch

    torch.set_num_threads(spec["threads"])
    from fedstyle.data import load_dataset
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.runner import run_experiment
    from fedstyle.federation.star import StarSimulator
    from fedstyle.partition import make_split

    values = spec["config"]
    dataset = load_dataset(values["dataset"], progress=False)
    split = make_split(dataset, "lodo", targets=values["targets"], val_fraction=0.1, seed=values["seed"])
    train = sum(len(idx) for idx in split.train.values())
    values["data_copies"] = max(1, math.ceil(values["clients"] * TRAIN_SAMPLES_PER_CLIENT / train))
    config = RunConfig.from_mapping(values)

    seconds: list[float] = []
    cpu: list[float] = []
    stores = []
    original = StarSimulator.run_round

    def timed(self, round_index):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = original(self, round_index)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        if not stores:
            stores.append(self.client_states)
        return result

    StarSimulator.run_round = timed
    out = Path(spec["out"])
    start = time.perf_counter()
    run_experiment(config, out, quiet=True)
    total = time.perf_counter() - start
    store = stores[0]
    states = out / "client_states"
    row = {
        "method": config.method, "clients": config.clients, "data_copies": config.data_copies,
        "train_samples": train, "rounds": config.rounds, "clients_per_round": config.clients_per_round,
        "state_budget": config.state_budget,
        "seconds_per_round": statistics.median(seconds[1:] if len(seconds) > 1 else seconds),
        "cpu_seconds_per_round": statistics.median(cpu[1:] if len(cpu) > 1 else cpu),
        "round_seconds": [round(s, 4) for s in seconds],
        "wall_seconds": round(total, 2),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # kB on Linux
        "state_peak_mb": store.peak_bytes / 1e6,
        "states_on_disk": store.on_disk,
        "state_files_mb": sum(p.stat().st_size for p in states.glob("*.safetensors")) / 1e6 if states.is_dir() else 0.0,
        "checkpoint_mb": (out / "checkpoint.safetensors").stat().st_size / 1e6,
    }
    return row


def format_table(rows: list[dict]) -> str:
    base = {r["method"]: r["peak_rss_mb"] for r in rows if r["clients"] == min(x["clients"] for x in rows)}
    lines = ["| method | clients | data copies | s / round | CPU s / round | peak RSS (MB) | RSS vs fewest clients | "
             "states in memory, peak (MB) | clients with a state file | state files (MB) | checkpoint (MB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["method"], r["clients"])):
        ratio = r["peak_rss_mb"] / base[r["method"]] if r["method"] in base else float("nan")
        lines.append(f"| {r['method']} | {r['clients']:,} | {r['data_copies']} | {r['seconds_per_round']:.2f} | "
                     f"{r['cpu_seconds_per_round']:.2f} | {r['peak_rss_mb']:.0f} | {ratio:.2f}x | "
                     f"{r['state_peak_mb']:.1f} | {r['states_on_disk']} | {r['state_files_mb']:.1f} | "
                     f"{r['checkpoint_mb']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "feddyn"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--state-budget", default="8MB", help="--state-budget of every cell (default 8MB)")
    parser.add_argument("--dataset", default="digits4")
    parser.add_argument("--target", default="mnist")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per cell (default 1)")
    parser.add_argument("--out", default="many_clients")
    parser.add_argument("--keep-runs", action="store_true", help="keep each cell's run directory")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the table from OUT/results.jsonl")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:  # one cell, in its own process
        print("RESULT " + json.dumps(run_cell(json.loads(args.child))), flush=True)
        return 0

    out = Path(args.out)
    results = out / "results.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        done = {(r["method"], r["clients"]) for r in _read(results)}
        for method in args.methods:
            for clients in args.clients:
                if (method, clients) in done:
                    print(f"{method} {clients}: done (in {results})")
                    continue
                run_dir = out / "runs" / f"{method}-{clients}"
                shutil.rmtree(run_dir, ignore_errors=True)
                spec = {"config": cell_config(method, clients, args), "out": str(run_dir), "threads": args.threads}
                start = time.perf_counter()
                child = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                       text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
                lines = [x for x in child.stdout.splitlines() if x.startswith("RESULT ")]
                if child.returncode or not lines:
                    print(f"{method} {clients}: failed\n{child.stderr[-3000:]}", file=sys.stderr)
                    return 1
                row = json.loads(lines[-1][len("RESULT "):])
                with open(results, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{method} {clients}: {row['seconds_per_round']:.2f} s/round, peak RSS {row['peak_rss_mb']:.0f} MB "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
                if not args.keep_runs:
                    shutil.rmtree(run_dir, ignore_errors=True)
    rows = _read(results)
    if not rows:
        print(f"no results in {results}", file=sys.stderr)
        return 1
    table = format_table(rows)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


if __name__ == "__main__":
    sys.exit(main())
