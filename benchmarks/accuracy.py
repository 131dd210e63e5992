"""Accuracy benchmark: ``fedstyle sweep benchmarks/accuracy.toml`` with the benchmark's old flags.

digits4 leave-one-domain-out, every domain left out in turn, 3 seeds; one client per source domain
(CCST's setting), ConvNet, FedAvg against local MixStyle and local DSU (stages 1-3, p = 0.5).
Finished runs in --out are reused, so an interrupted benchmark continues where it stopped. Prints
the table and writes report.md / report.csv / the plots into --out.

    python benchmarks/accuracy.py [--out runs/accuracy] [--rounds 8] [--local-steps 15] [--seeds 0 1 2]
                                  [--methods fedavg mixstyle dsu] [--workers N] [--device cuda]
                                  [any `fedstyle sweep` option: --dry-run, --report-only, --launcher ray ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedstyle.cli.main import main as fedstyle

GRID = Path(__file__).resolve().parent / "accuracy.toml"


def sweep_arguments(args: argparse.Namespace) -> list[str]:
    """The benchmark's own flags as `fedstyle sweep` options."""
    argv = []
    for key, value in (("rounds", args.rounds), ("local_steps", args.local_steps)):
        if value is not None:
            argv += ["--set", f"{key}={value}"]
    if args.seeds:
        argv += ["--set", f"seeds=[{','.join(map(str, args.seeds))}]"]
    return argv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="communication rounds (default: the file's, 8)")
    parser.add_argument("--local-steps", type=int, help="local steps of batch 64 per round (default: 15)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: 0 1 2")
    parser.add_argument("--methods", nargs="+", help="variants to run (default: fedavg mixstyle dsu)")
    args, rest = parser.parse_known_args()
    argv = ["sweep", str(GRID), *sweep_arguments(args), *rest]
    if args.methods:
        argv += ["--only", "variant=" + ",".join(args.methods)]
    return fedstyle(argv)


if __name__ == "__main__":
    sys.exit(main())
