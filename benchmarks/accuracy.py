"""Accuracy benchmark: digits4 leave-one-domain-out, every domain left out in turn, 3 seeds.

One client per source domain (CCST's setting), ConvNet, FedAvg against local MixStyle and local
DSU (stages 1-3, p = 0.5). Finished runs in --out are reused, so an interrupted benchmark
continues where it stopped. Prints the table and writes report.md / report.csv / accuracy.png.

    python benchmarks/accuracy.py [--out runs/accuracy] [--rounds 8] [--local-steps 15] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fedstyle.data import load_dataset
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_markdown, write_report
from fedstyle.experiments.runner import CONFIG, DONE, resume_experiment, run_experiment

METHODS = ["fedavg", "mixstyle", "dsu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/accuracy")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--local-steps", type=int, default=15, help="local steps of batch 64 per round")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    out = Path(args.out)
    base = RunConfig(dataset="digits4", protocol="lodo", partition="domain", rounds=args.rounds,
                     local_steps=args.local_steps, batch_size=64,
                     lr=0.05, lr_schedule="cosine", eval_every=2, device=args.device)
    domains = load_dataset("digits4", progress=False).domains
    start = time.perf_counter()
    for method in args.methods:
        for seed in args.seeds:
            for target in domains:
                run_dir = out / method / f"seed{seed}" / target
                if (run_dir / DONE).exists():
                    continue
                print(f"{method} seed {seed} target {target}", flush=True)
                if (run_dir / CONFIG).exists():
                    resume_experiment(run_dir, quiet=True)
                else:
                    run_experiment(base.updated(method=method, seed=seed, targets=[target]), run_dir, quiet=True)
    wall = time.perf_counter() - start
    table, paths = write_report([out / m for m in args.methods], out / "report", which="selected")
    print(to_markdown(table))
    print(f"wall time {wall:.0f} s; report in {paths['markdown']}")


if __name__ == "__main__":
    main()
