"""Accuracy benchmark: digits4 leave-one-domain-out, every domain left out in turn, 3 seeds.

One client per source domain (CCST's setting), ConvNet, FedAvg against local MixStyle and local
DSU (stages 1-3, p = 0.5). Finished runs in --out are reused, so an interrupted benchmark
continues where it stopped. Prints the table and writes report.md / report.csv / accuracy.png.

    python benchmarks/accuracy.py [--out runs/accuracy] [--rounds 8] [--local-steps 15] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse

from fedstyle.data import load_dataset
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_markdown, write_report
from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep

METHODS = ["fedavg", "mixstyle", "dsu"]


def digits4_lodo_base(args: argparse.Namespace) -> RunConfig:
    """The shared setting of the digits4 benchmarks (also used by ccst_table.py)."""
    return RunConfig(dataset="digits4", protocol="lodo", partition="domain", rounds=args.rounds,
                     local_steps=args.local_steps, batch_size=64,
                     lr=0.05, lr_schedule="cosine", eval_every=2, device=args.device)


def add_common_flags(parser: argparse.ArgumentParser, out: str) -> None:
    parser.add_argument("--out", default=out)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--local-steps", type=int, default=15, help="local steps of batch 64 per round")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (worker processes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(parser, "runs/accuracy")
    parser.add_argument("--methods", nargs="+", default=METHODS)
    args = parser.parse_args()

    variants = [Variant(m, m) for m in args.methods]
    domains = load_dataset("digits4", progress=False).domains
    jobs = plan_jobs(digits4_lodo_base(args), variants, args.seeds, domains, args.out)
    wall = run_sweep(jobs, workers=args.workers)
    table, paths = write_report([f"{args.out}/{v.name}" for v in variants], f"{args.out}/report", which="selected")
    print(to_markdown(table))
    print(f"wall time {wall:.0f} s; report in {paths['markdown']}")


if __name__ == "__main__":
    main()
