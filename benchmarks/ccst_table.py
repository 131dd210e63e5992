"""CCST benchmark (issue 3 §4): ``fedstyle reproduce ccst --scale full`` on digits4, plus the setup table.

Rows: FedAvg, MixStyle, FedDG (amplitude exchange), CCST with single-image and overall styles at
K = 1, 2, 3, CCST (overall, K = 3) + MixStyle — the preset fedstyle/experiments/presets/ccst.toml,
which also puts the paper's numbers beside fedstyle's and checks its claims. Setting (as
benchmarks/RESULTS.md): leave-one-domain-out, one client per source domain, ConvNet, 8 rounds x 15
local steps of batch 64, 3 seeds. A second table gives the setup phase: style computation and
stylization throughput (images per second) and the style-bank bytes. Finished runs are reused;
``--workers`` runs several at once (a GPU holds many digits-sized jobs).

    python benchmarks/ccst_table.py [--out runs/ccst] [--device cuda --workers 8] [--backend lite]
                                    [--datasets digits4 fashion4] [--scale smoke|small|full]
                                    [any `fedstyle reproduce` option: --dry-run, --report-only, --launcher ray ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from fedstyle.cli.main import main as fedstyle


def setup_table(out: Path) -> str:
    """Markdown: per dataset and row, mean over its runs of the setup metrics (summed over clients) and bytes."""
    lines = ["| dataset | row | style img/s | stylize img/s | style s | stylize s | bank bytes up | bank bytes down |",
             "|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(out.glob("*/**/summary.json")):
        summary = json.loads(path.read_text())
        if summary.get("setup"):
            groups.setdefault((summary["dataset"], summary["label"]), []).append(summary["setup"])
    for (dataset, label), setups in groups.items():

        def mean(key: str) -> float:
            values = [s[key] for s in setups if key in s]
            return statistics.fmean(values) if values else float("nan")

        lines.append(f"| {dataset} | {label} | {mean('style_images_per_s'):,.0f} | "
                     f"{mean('stylized_images_per_s'):,.0f} | "
                     f"{mean('style_seconds'):.1f} | {mean('stylize_seconds'):.1f} | "
                     f"{mean('setup_bytes_up'):,.0f} | {mean('setup_bytes_down'):,.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/ccst")
    parser.add_argument("--scale", default="full", help="the preset's scale (default: full)")
    parser.add_argument("--datasets", nargs="+", default=["digits4"],
                        help="the full scale's datasets to run (default: digits4, as RESULTS.md; add fashion4)")
    parser.add_argument("--backend", help="CCST style backend: lite (the preset's default), adain, fft")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--local-steps", type=int)
    parser.add_argument("--seeds", type=int, nargs="+")
    args, rest = parser.parse_known_args()
    argv = ["reproduce", "ccst", "--scale", args.scale, "--out", args.out, *rest]
    if args.scale == "full":
        argv += ["--only", "dataset=" + ",".join(args.datasets)]
    if args.backend:
        argv += ["--set", f"hparams.style_backend={args.backend}"]
    for key, value in (("rounds", args.rounds), ("local_steps", args.local_steps)):
        if value is not None:
            argv += ["--set", f"{key}={value}"]
    if args.seeds:
        argv += ["--set", f"seeds=[{','.join(map(str, args.seeds))}]"]
    code = fedstyle(argv)
    if "--dry-run" not in rest and Path(args.out).is_dir():
        print()
        print(setup_table(Path(args.out)))
    return code


if __name__ == "__main__":
    sys.exit(main())
