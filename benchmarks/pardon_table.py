"""PARDON benchmark (issue 11 §4): PARDON's setting on offline data.

Bai et al.'s domain-heterogeneity partition (``--partition lambda``, lambda = 0.1), 100 clients,
20 % sampled per round, on digits4 and fashion4, leave-one-domain-out (every domain held out) and
leave-two-domains-out (test domain d_i, held-out validation domain d_{i+1}; model selection on
it), 3 seeds. Rows: FedAvg, FedGMA, FedDG-GA, CCST (overall styles, K = 3) and PARDON. A second
grid, PARDON's heterogeneity sweep: PARDON vs FedAvg at lambda in {0, 0.1, 1} on each dataset's
first LTDO split (as the paper's Fig. 3: one split, several lambdas; lambda = 0.1 is the main
grid's run). A last table gives the setup exchange: PARDON's one style up and S_g down per
client against CCST's style bank, and the style / stylization throughput.

Scales (per dataset; local training is a fixed number of steps, never epochs, so that every
method gets the same optimizer steps: an epoch over CCST's data, original plus K restyled copies,
would be K + 1 times as many steps as FedAvg's):

* ``full``: the issue's grid — 2 datasets x (4 LODO + 4 LTDO) x 6 methods x 3 seeds = 288 runs,
  plus 2 x 2 x 2 lambda runs x 3 seeds = 24 — with the training shortened to fit a GPU session:
  10 rounds (the paper: 50), 8 local steps of 32 (about 4 epochs of a digits4 client's ~60
  images, half an epoch of a fashion4 client's ~525), evaluation every 2 rounds; ``--rounds``
  overrides (``fedstyle reproduce pardon --scale full`` runs the same LODO grid);
* ``smoke``: digits4 only, 20 clients, one LODO target and one LTDO split, 1 seed, 2 rounds of one
  step, the ``fft`` style backend (no networks) and CCST with K = 1: 14 runs, a pipeline check.

Finished runs are reused; ``--workers`` runs several at once (a GPU holds many of these jobs).

    python benchmarks/pardon_table.py --scale full --device cuda --workers 12 --out runs/pardon
    python benchmarks/pardon_table.py --scale smoke --out /tmp/pardon-smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from fedstyle.data import load_dataset
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_markdown, write_report
from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep, select

DATASETS = ("digits4", "fashion4")
LAMBDAS = (0.0, 0.1, 1.0)


@dataclass(frozen=True)
class Scale:
    datasets: tuple[str, ...]
    clients: int
    fraction: float
    seeds: tuple[int, ...]
    lodo_targets: int  # how many domains are held out in turn (0: all)
    ltdo_splits: int  # how many (test, validation) splits (0: one per domain)
    rounds: int
    eval_every: int
    local: dict  # per dataset: local_steps (never epochs: see the docstring)
    backend: str
    ccst_k: int  # CCST's styles per image


SCALES = {
    "full": Scale(DATASETS, 100, 0.2, (0, 1, 2), 0, 0, 10, 2,
                  {"digits4": {"local_steps": 8}, "fashion4": {"local_steps": 8}}, "lite", 3),
    "smoke": Scale(("digits4",), 20, 0.2, (0,), 1, 1, 2, 2, {"digits4": {"local_steps": 1}}, "fft", 1),
}


def main_variants(backend: str, ccst_k: int) -> list[Variant]:
    return [Variant("fedavg", "fedavg"), Variant("fedgma", "fedgma"), Variant("fpl", "fpl"),
            Variant("feddg_ga", "feddg_ga"),
            Variant("ccst", "ccst", {"style_type": "overall", "k": ccst_k, "style_backend": backend}),
            Variant("pardon", "pardon", {"style_backend": backend})]


def ablation_variants(backend: str) -> list[Variant]:
    """Rows that run only when named in ``--rows``: the paper's ablation v3 (Table V), cross-entropy on
    the originals AND their S_g transfers in one BatchNorm batch, without the triplet and L2 terms
    (gamma1 = gamma2 = 0): it separates the S_g data from the contrastive terms. (With the defaults,
    gamma1 = gamma2 = 0 alone is FedAvg at twice the forward cost: CE is on the originals only.)"""
    return [Variant("pardon-v3", "pardon", {"style_backend": backend, "gamma1": 0.0, "gamma2": 0.0,
                                            "ce_views": "both", "batchnorm_stats": "joint"},
                    label="PARDON-v3: CE on x and x' (gamma1 = gamma2 = 0)"),
            # the public code's choices (issue 34), and the same with the client style fedstyle's reference
            # mode had before it: the mean of the cluster styles instead of their pooled moments
            Variant("pardon-ref", "pardon", {"style_backend": backend, "reference_code": True},
                    label="PARDON (reference code)"),
            Variant("pardon-ref-mean", "pardon", {"style_backend": backend, "reference_code": True,
                                                  "client_style": "mean"},
                    label="PARDON (reference code, client style = mean of clusters)")]


def sweep_variants(backend: str) -> list[Variant]:
    return [Variant("fedavg", "fedavg"), Variant("pardon", "pardon", {"style_backend": backend})]


def base_config(scale: Scale, dataset: str, lam: float, rounds: int, device: str) -> RunConfig:
    return RunConfig(dataset=dataset, partition="lambda", lam=lam, clients=scale.clients, fraction=scale.fraction,
                     rounds=rounds, batch_size=32, lr=0.05, lr_schedule="cosine", eval_every=scale.eval_every,
                     device=device, **scale.local[dataset])


def ltdo_splits(domains: list[str], count: int) -> list[tuple[str, str]]:
    """(test domain d_i, validation domain d_{i+1}) for the first ``count`` domains (0: all)."""
    pairs = [(d, domains[(i + 1) % len(domains)]) for i, d in enumerate(domains)]
    return pairs[: count or len(pairs)]


@dataclass(frozen=True)
class Group:
    """One table: a dataset, a protocol, a lambda, its variants, and where its runs live."""

    dataset: str
    protocol: str
    lam: float
    variants: tuple[Variant, ...]
    folder: Path


def plan(scale: Scale, out: Path, rounds: int, device: str, rows: list[str] | None = None,
         sweep: bool = True, protocols: tuple[str, ...] = ("lodo", "ltdo"), targets: list[str] | None = None):
    """The tables and their unfinished jobs; ``rows`` keeps only those variants' jobs (the tables
    still list every variant with runs on disk), ``sweep=False`` leaves out the lambda sweep,
    ``targets`` keeps the LODO targets and LTDO test domains named (per dataset, those it has)."""
    groups, jobs = [], []

    optional = {v.name for v in ablation_variants(scale.backend)}

    def kept(variants):
        return tuple(v for v in variants if (v.name in rows if rows is not None else v.name not in optional))

    for dataset in scale.datasets:
        domains = load_dataset(dataset, progress=False).domains
        lodo = domains[: scale.lodo_targets or len(domains)]
        splits = ltdo_splits(domains, scale.ltdo_splits)
        if targets is not None and set(targets) & set(domains):
            lodo = [d for d in domains if d in targets]
            splits = [(t, v) for t, v in ltdo_splits(domains, 0) if t in targets]
        main = tuple(main_variants(scale.backend, scale.ccst_k) + ablation_variants(scale.backend))
        for protocol in protocols:
            folder = out / f"{dataset}-{protocol}-lam0.1"
            groups.append(Group(dataset, protocol, 0.1, main, folder))
            base = base_config(scale, dataset, 0.1, rounds, device).updated(protocol=protocol)
            if protocol == "lodo":
                jobs += plan_jobs(base, kept(main), scale.seeds, lodo, folder)
            else:
                for test, val in splits:
                    jobs += plan_jobs(base.updated(val_domain=val), kept(main), scale.seeds, [test], folder)
        test, val = splits[0]
        for lam in LAMBDAS:
            if lam == 0.1:
                continue  # the main LTDO grid holds it
            folder = out / f"{dataset}-ltdo-{test}-lam{lam:g}"
            variants = tuple(sweep_variants(scale.backend))
            groups.append(Group(dataset, "ltdo", lam, variants, folder))
            base = base_config(scale, dataset, lam, rounds, device).updated(protocol="ltdo", val_domain=val)
            if sweep:
                jobs += plan_jobs(base, kept(variants), scale.seeds, [test], folder)
    return groups, jobs


def setup_table(groups: list[Group]) -> str:
    """Per dataset and variant with a setup exchange: mean over runs of bytes and throughputs. The
    stylization columns average the runs that stylized; a run that found its images in the cache
    (an earlier run with the same partition and style) is counted under "cached"."""
    lines = ["| dataset | variant | setup bytes up (all clients) | setup bytes down | style img/s | "
             "stylize img/s | style s | stylize s | runs | cached |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    seen = set()
    for group in groups:
        for v in group.variants:
            setups = [json.loads(p.read_text()).get("setup") for p in sorted((group.folder / v.name).glob("seed*/*/summary.json"))]
            setups = [s for s in setups if s]
            if not setups or (group.dataset, v.name, group.folder) in seen:
                continue
            seen.add((group.dataset, v.name, group.folder))

            def mean(key: str, spec: str) -> str:
                # stylize=lazy makes the images during training: its rate is training_stylized_images_per_s
                values = [s.get(key, s.get(f"training_{key}")) for s in setups if key in s or f"training_{key}" in s]
                return format(statistics.fmean(values), spec) if values else "—"

            cached = sum(1 for s in setups if s.get("cache_hits"))
            lines.append(f"| {group.dataset} ({group.protocol}, λ={group.lam:g}) | {v.name} | "
                         f"{mean('setup_bytes_up', ',.0f')} | {mean('setup_bytes_down', ',.0f')} | "
                         f"{mean('style_images_per_s', ',.0f')} | {mean('stylized_images_per_s', ',.0f')} | "
                         f"{mean('style_seconds', '.1f')} | {mean('stylize_seconds', '.1f')} | {len(setups)} | "
                         f"{cached} |")
    return "\n".join(lines)


def report(groups: list[Group], out: Path) -> None:
    for group in groups:
        dirs = [group.folder / v.name for v in group.variants if (group.folder / v.name).exists()]
        if not dirs:
            continue
        print(f"\n## {group.dataset}, {group.protocol}, lambda = {group.lam:g}  ({group.folder})\n")
        for which in ("selected", "last"):
            table, paths = write_report(dirs, group.folder / f"report-{which}", which=which)
            print(to_markdown(table))
            print()
    print("\n## Setup exchange\n")
    print(setup_table(groups))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="smoke")
    parser.add_argument("--out", default=None, help="runs folder (default runs/pardon-<scale>)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (worker processes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="override the scale's seeds")
    parser.add_argument("--rounds", type=int, default=None, help="override the scale's rounds")
    parser.add_argument("--backend", default=None, help="style backend of CCST and PARDON (scale default: full lite, "
                        "smoke fft)")
    parser.add_argument("--rows", nargs="+", default=None,
                        help="run only these rows (fedavg fedgma fpl feddg_ga ccst pardon; default: these six) "
                        "or the rows run only when named: pardon-v3 (CE on the originals and their S_g transfers, "
                        "no triplet/L2), pardon-ref (reference_code=true) and pardon-ref-mean (reference_code=true "
                        "with client_style=mean, the reference mode before issue 34)")
    parser.add_argument("--no-lambda-sweep", action="store_true", help="leave out the lambda in {0, 1} runs")
    parser.add_argument("--protocols", nargs="+", choices=("lodo", "ltdo"), default=["lodo", "ltdo"])
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=None, help="default: the scale's")
    parser.add_argument("--targets", nargs="+", default=None,
                        help="LODO targets / LTDO test domains to run (each dataset takes those it has; default: all)")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    args = parser.parse_args()
    try:
        names = [v.name for v in main_variants("fft", 1) + ablation_variants("fft")]
        rows = None if args.rows is None else select(names, args.rows, "row")
    except ValueError as err:
        parser.error(str(err))

    scale = SCALES[args.scale]
    if args.seeds is not None:
        scale = Scale(**{**scale.__dict__, "seeds": tuple(args.seeds)})
    if args.backend is not None:
        scale = Scale(**{**scale.__dict__, "backend": args.backend})
    if args.datasets is not None:
        scale = Scale(**{**scale.__dict__, "datasets": tuple(args.datasets)})
    out = Path(args.out or f"runs/pardon-{args.scale}")
    groups, jobs = plan(scale, out, args.rounds or scale.rounds, args.device, rows, not args.no_lambda_sweep,
                        tuple(args.protocols), args.targets)
    if args.report_only:
        jobs = []
    print(f"{len(jobs)} runs to do in {out}", file=sys.stderr)
    wall = run_sweep(jobs, workers=args.workers)
    report(groups, out)
    print(f"\nwall time {wall:.0f} s ({len(jobs)} runs)")


if __name__ == "__main__":
    main()
