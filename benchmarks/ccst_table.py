"""CCST benchmark (issue 3 §4): ``fedstyle reproduce ccst --scale full`` on digits4, plus the setup table.

Rows: FedAvg, MixStyle, FedDG (amplitude exchange), JiGen, RSC, CCST with single-image and overall styles at
K = 1, 2, 3, CCST (overall, K = 3) + MixStyle — the preset fedstyle/experiments/presets/ccst.toml,
which also puts the paper's numbers beside fedstyle's and checks its claims. Setting (as
docs/results/ccst.md): leave-one-domain-out, one client per source domain, ConvNet, 8 rounds x 15
local steps of batch 64, 3 seeds. A second table gives the setup phase: style computation and
stylization throughput (images per second) and the style-bank bytes. Finished runs are reused;
``--workers`` runs several at once (a GPU holds many digits-sized jobs).

``--setting many_clients`` (issue 21 §9) runs CCST where clients are not domains: PARDON's table's
setting (benchmarks/pardon_table.py, full scale) — Bai et al.'s lambda partition, lambda = 0.1,
100 clients, 20 % sampled per round, batch 32, lr 0.05 cosine, 10 rounds x 8 local steps (fixed
steps, so that both CCST rows train as many steps as FedAvg), evaluation every 2 rounds,
leave-one-domain-out over every domain, 3 seeds, ``lite`` styles. Rows: FedAvg, CCST (overall,
K = 3) as Algorithm 1 (``keep_original=own_domain``: at 100 clients an image keeps its original
with probability 3 / 100) and CCST with every original kept plus 3 restyled copies
(``keep_original=always``). The tables give source-validation accuracy ("Src-val") beside the
target accuracy, for the model selected on source validation and for the last round's model.

    python benchmarks/ccst_table.py [--out runs/ccst] [--device cuda --workers 8] [--backend lite]
                                    [--datasets digits4 fashion4] [--scale smoke|small|full]
                                    [any `fedstyle reproduce` option: --dry-run, --report-only, --launcher ray ...]
    python benchmarks/ccst_table.py --setting many_clients [--out runs/ccst-many-clients]
                                    [--datasets digits4 fashion4] [--targets mnist] [--rows fedavg ccst-always]
                                    [--seeds 0] [--rounds 2] [--local-steps 1] [--backend fft]
                                    [--device cuda --workers 8] [--dry-run | --report-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from fedstyle.cli.main import main as fedstyle
from fedstyle.data import load_dataset
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_markdown, write_report
from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep, select

#: the paper's setting (``fedstyle reproduce ccst``) or PARDON's many-clients setting (issue 21 §9)
SETTINGS = ("paper", "many_clients")
MANY_CLIENTS = 100  # PARDON's N (pardon.txt: 100 clients, 20 % per round, lambda = 0.1)
MANY_FRACTION, MANY_LAMBDA = 0.2, 0.1
MANY_ROUNDS, MANY_LOCAL_STEPS, MANY_EVAL_EVERY, MANY_SEEDS = 10, 8, 2, (0, 1, 2)  # pardon_table.py's full scale
MANY_K = 3


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
            # stylize=lazy makes the images during training: its rate is training_stylized_images_per_s
            values = [s.get(key, s.get(f"training_{key}")) for s in setups if key in s or f"training_{key}" in s]
            return statistics.fmean(values) if values else float("nan")

        lines.append(f"| {dataset} | {label} | {mean('style_images_per_s'):,.0f} | "
                     f"{mean('stylized_images_per_s'):,.0f} | "
                     f"{mean('style_seconds'):.1f} | {mean('stylize_seconds'):.1f} | "
                     f"{mean('setup_bytes_up'):,.0f} | {mean('setup_bytes_down'):,.0f} |")
    return "\n".join(lines)


def many_clients_variants(backend: str, k: int = MANY_K) -> list[Variant]:
    """FedAvg and the two readings of CCST's original image at 100 clients (names are the folders)."""
    ccst = {"style_type": "overall", "k": k, "style_backend": backend}
    return [Variant("fedavg", "fedavg"),
            Variant("ccst-algorithm1", "ccst", {**ccst, "keep_original": "own_domain"}),
            Variant("ccst-always", "ccst", {**ccst, "keep_original": "always"})]


def many_clients(args: argparse.Namespace, rest: list[str]) -> int:
    """The many-clients table: plan, run the unfinished runs, print each dataset's reports."""
    extra = argparse.ArgumentParser(prog="ccst_table.py --setting many_clients")
    extra.add_argument("--device", default="auto")
    extra.add_argument("--workers", type=int, default=1, help="runs at once (worker processes)")
    extra.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    extra.add_argument("--dry-run", action="store_true", help="print the unfinished runs, run nothing")
    options = extra.parse_args(rest)  # anything else is an error here (no `fedstyle reproduce` behind this mode)
    backend = args.backend or "lite"
    variants = many_clients_variants(backend)
    try:
        rows = select([v.name for v in variants], args.rows, "row")
    except ValueError as err:
        extra.error(str(err))
    out = Path(args.out or "runs/ccst-many-clients")
    seeds = tuple(args.seeds) if args.seeds else MANY_SEEDS
    jobs, folders = [], []
    for dataset in args.datasets:
        domains = load_dataset(dataset, progress=False).domains
        targets = [d for d in domains if args.targets is None or d in args.targets]
        folder = out / f"{dataset}-lodo-lam{MANY_LAMBDA:g}"
        folders.append(folder)
        base = RunConfig(dataset=dataset, protocol="lodo", partition="lambda", lam=MANY_LAMBDA, clients=MANY_CLIENTS,
                         fraction=MANY_FRACTION, rounds=args.rounds or MANY_ROUNDS, batch_size=32, lr=0.05,
                         lr_schedule="cosine", local_steps=args.local_steps or MANY_LOCAL_STEPS,
                         eval_every=MANY_EVAL_EVERY, device=options.device)
        jobs += plan_jobs(base, [v for v in variants if v.name in rows], seeds, targets, folder)
    if options.dry_run:
        print("\n".join(f"{job.title}: {job.config.method} {job.config.hparams}" for job in jobs))
        print(f"{len(jobs)} runs to do in {out}")
        return 0
    if options.report_only:
        jobs = []
    print(f"{len(jobs)} runs to do in {out}", file=sys.stderr)
    wall = run_sweep(jobs, workers=options.workers)
    for folder in folders:
        dirs = [folder / v.name for v in variants if (folder / v.name).exists()]
        if not dirs:
            continue
        for which in ("selected", "last"):
            print(f"\n## {folder.name}: {which} model ({folder})\n")
            table, _ = write_report(dirs, folder / f"report-{which}", which=which)
            print(to_markdown(table))
    if out.is_dir():
        print()
        print(setup_table(out))
    print(f"\nwall time {wall:.0f} s ({len(jobs)} runs)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=SETTINGS, default="paper",
                        help="paper: the preset (one client per domain; default); many_clients: 100 clients, "
                        "lambda partition 0.1, 20 %% per round, CCST with keep_original=own_domain and =always")
    parser.add_argument("--out", default=None, help="runs folder (default runs/ccst; many_clients: "
                        "runs/ccst-many-clients)")
    parser.add_argument("--scale", default="full", help="the preset's scale (default: full)")
    parser.add_argument("--datasets", nargs="+", default=["digits4"],
                        help="the full scale's datasets to run (default: digits4, as docs/results/ccst.md; "
                        "add fashion4)")
    parser.add_argument("--backend", help="CCST style backend: lite (the preset's default), adain, fft")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--local-steps", type=int)
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--targets", nargs="+", default=None,
                        help="many_clients: the LODO targets to run (each dataset takes those it has; default: all)")
    parser.add_argument("--rows", nargs="+", default=None,
                        help="many_clients: fedavg ccst-algorithm1 ccst-always (default: all three)")
    args, rest = parser.parse_known_args()
    if args.setting == "many_clients":
        return many_clients(args, rest)
    if args.targets is not None or args.rows is not None:
        parser.error("--targets and --rows are options of --setting many_clients")
    args.out = args.out or "runs/ccst"
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
