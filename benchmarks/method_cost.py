"""Cost of methods per round, side by side in one process on identical settings.

Every method gets the same dataset, partition, sampled clients, local steps, batch size, backbone
and device; rounds are interleaved (round r of every method, then round r + 1), so a machine whose
load drifts slows every method alike. Reported per method: the median seconds per round of the
simulator's round (query phase, local training, aggregation — no evaluation), per client, the
ratio to the first method (FedAvg by default), and the split the method itself records with
``ctx.timed`` (``train_metrics``: k-means, oversampling, attention, ...) as seconds per round and
share of the round. Beside wall time, the process's CPU time per round (all its threads): on a
machine shared with other jobs its ratio is the steadier figure (on a GPU, read the wall time).
A one-time setup exchange (CCST's stylization) is timed apart.

    python benchmarks/method_cost.py --methods fedavg,stablefdg [--backbone resnet18] [--device cuda]
    python benchmarks/method_cost.py --methods fedavg,stablefdg,stablefdg:oversample_ratio=0.25

A method may carry hyperparameters as ``method:NAME=VALUE:NAME=VALUE``; the whole token is its label.
StableFDG's paper (Table 6, GTX 1080 Ti, ResNet-18, PACS): FedAvg 4.57 s, StableFDG 7.39 s per client
per round (1.62x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedstyle, not an installed one
from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.experiments.build import build_experiment  # noqa: E402
from fedstyle.experiments.config import RunConfig  # noqa: E402


def parse_method(token: str) -> tuple[str, dict[str, str]]:
    method, *assignments = token.split(":")
    hp = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--methods: {item!r} in {token!r} is not NAME=VALUE")
        hp[name] = value
    return method, hp


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="fedavg,stablefdg", help="comma-separated; the first is the baseline")
    parser.add_argument("--backbone", default="convnet")
    parser.add_argument("--dataset", default="digits4")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--resolution", type=int, default=None, help="image side (default: the dataset's)")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--local-steps", type=int, default=0, help="local steps per round (> 0 overrides epochs)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per method")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (allocator, kernels)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    tokens = [t.strip() for t in args.methods.split(",") if t.strip()]
    if len(set(tokens)) != len(tokens):
        raise SystemExit(f"--methods lists a method twice: {tokens}")
    target = load_dataset(args.dataset, data_root=args.data_root, progress=False).domains[0]
    base = RunConfig(dataset=args.dataset, data_root=args.data_root, resolution=args.resolution, targets=[target],
                     partition="per_domain", clients=args.clients, clients_per_round=args.clients_per_round,
                     backbone=args.backbone, batch_size=args.batch_size, local_epochs=args.local_epochs,
                     local_steps=args.local_steps,
                     rounds=args.warmup + args.rounds, lr_schedule="constant", device=args.device, seed=args.seed)
    runs = {}
    for token in tokens:
        method, hp = parse_method(token)
        exp = build_experiment(base.updated(method=method, hparams=hp), progress=False)
        start = time.perf_counter()
        setup = exp.simulator.setup()
        runs[token] = {"sim": exp.simulator, "setup_s": time.perf_counter() - start if setup else 0.0,
                       "seconds": [], "cpu": [], "parts": {}, "device": str(exp.device)}
    for r in range(args.warmup + args.rounds):
        for token, run in runs.items():  # interleaved: load drift hits every method alike
            cpu = time.process_time()
            result = run["sim"].run_round(r)
            cpu = time.process_time() - cpu
            print(f"round {r} {token}: {result.seconds:.2f} s{' (warm-up)' if r < args.warmup else ''}",
                  file=sys.stderr, flush=True)
            if r < args.warmup:
                continue
            run["seconds"].append(result.seconds)
            run["cpu"].append(cpu)
            for key, value in result.metrics.items():
                if key.endswith("_seconds"):  # a mean over the round's clients: x clients = per round
                    run["parts"].setdefault(key[: -len("_seconds")], []).append(value * len(result.clients))

    baseline = statistics.median(runs[tokens[0]]["seconds"])
    baseline_cpu = statistics.median(runs[tokens[0]]["cpu"])
    report = {"settings": {k: v for k, v in vars(args).items()}, "device": runs[tokens[0]]["device"],
              "torch_threads": torch.get_num_threads(), "methods": {}}
    local = f"{args.local_steps} local steps" if args.local_steps else f"{args.local_epochs} local epoch(s)"
    print(f"{args.dataset}, {args.backbone}, {args.clients} clients ({args.clients_per_round} per round), {local} "
          f"of batch {args.batch_size}, {args.rounds} timed rounds, device {report['device']}, "
          f"{torch.get_num_threads()} torch threads\n")
    print("| method | s/round | s/client/round | ratio | CPU s/round | CPU ratio | setup s | "
          "time split (s/round, share of the round) |")
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    for token, run in runs.items():
        median = statistics.median(run["seconds"])
        cpu = statistics.median(run["cpu"])
        parts = {name: statistics.fmean(v) for name, v in sorted(run["parts"].items())}
        split = ", ".join(f"{n} {s:.3f} ({100 * s / median:.0f}%)" for n, s in parts.items()) or "-"
        print(f"| {token} | {median:.3f} | {median / args.clients_per_round:.3f} | {median / baseline:.2f}x | "
              f"{cpu:.3f} | {cpu / baseline_cpu:.2f}x | {run['setup_s']:.1f} | {split} |")
        report["methods"][token] = {"seconds_per_round": median, "rounds": run["seconds"], "ratio": median / baseline,
                                    "cpu_seconds_per_round": cpu, "cpu_ratio": cpu / baseline_cpu,
                                    "setup_seconds": run["setup_s"], "parts": parts}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
