"""CCST benchmark (issue 3 §4): digits4 leave-one-domain-out, all four targets, 3 seeds.

Rows: FedAvg; CCST with single-image and overall styles at K = 1, 2, 3; CCST (overall, K = 3) +
MixStyle; FedDG-FFT (amplitude exchange). Same setting as benchmarks/accuracy.py (one client per
source domain, ConvNet, 8 rounds x 15 local steps of batch 64). A second table gives the setup
phase: style computation and stylization throughput (images per second) and the style-bank bytes.
Finished runs are reused; ``--workers`` runs several at once (a GPU holds many digits-sized jobs).

    python benchmarks/ccst_table.py [--out runs/ccst] [--device cuda --workers 6] [--backend lite]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import add_common_flags, digits4_lodo_base  # noqa: E402

from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.experiments.report import to_markdown, write_report  # noqa: E402
from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep  # noqa: E402


def variants(backend: str) -> list[Variant]:
    rows = [Variant("fedavg", "fedavg")]
    for style_type in ("single", "overall"):
        for k in (1, 2, 3):
            rows.append(Variant(f"ccst-{style_type}-k{k}", "ccst",
                                {"style_type": style_type, "k": k, "style_backend": backend}))
    rows.append(Variant("ccst-overall-k3-mixstyle", "ccst",
                        {"style_type": "overall", "k": 3, "style_backend": backend, "style": "mixstyle"}))
    rows.append(Variant("feddg-fft", "feddg_fft"))
    return rows


def setup_table(out: Path, rows: list[Variant]) -> str:
    """Markdown: per variant, mean over its runs of the setup metrics (summed over clients) and the setup bytes."""
    lines = ["| variant | style img/s | stylize img/s | style s | stylize s | bank bytes up | bank bytes down |",
             "|---|---|---|---|---|---|---|"]
    for v in rows:
        summaries = [json.loads(p.read_text()) for p in sorted((out / v.name).glob("seed*/*/summary.json"))]
        setups = [s.get("setup", {}) for s in summaries if s.get("setup")]
        if not setups:
            continue

        def mean(key: str) -> float:
            values = [s[key] for s in setups if key in s]
            return statistics.fmean(values) if values else float("nan")

        lines.append(f"| {v.name} | {mean('style_images_per_s'):,.0f} | {mean('stylized_images_per_s'):,.0f} | "
                     f"{mean('style_seconds'):.1f} | {mean('stylize_seconds'):.1f} | "
                     f"{mean('setup_bytes_up'):,.0f} | {mean('setup_bytes_down'):,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(parser, "runs/ccst")
    parser.add_argument("--backend", default="lite", help="CCST style backend: lite (offline default), adain, fft")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    args = parser.parse_args()

    rows = variants(args.backend)
    domains = load_dataset("digits4", progress=False).domains
    jobs = [] if args.report_only else plan_jobs(digits4_lodo_base(args), rows, args.seeds, domains, args.out)
    wall = run_sweep(jobs, workers=args.workers)
    out = Path(args.out)
    table, paths = write_report([out / v.name for v in rows], out / "report", which="selected")
    print(to_markdown(table))
    print()
    print(setup_table(out, rows))
    print(f"\nwall time {wall:.0f} s; report in {paths['markdown']}")


if __name__ == "__main__":
    main()
