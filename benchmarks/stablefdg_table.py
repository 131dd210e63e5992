"""StableFDG benchmark (issue 10 §4): the paper's claim on offline data.

The paper's setting (Park et al., NeurIPS'23, Section 4.1) scaled to the machine: 30 clients, 10
sampled per round, ConvNet, leave-one-domain-out over every target, 3 seeds, on digits4 and
fashion4 (the PACS-like benchmark), in two client distributions:

* single-domain: ``--partition per_domain --clients 30`` (10 single-domain clients per source
  domain, each domain split evenly at random; Table 1);
* multi-domain: ``--partition dirichlet --alpha 0.5 --clients 30`` (per source domain, proportions
  over the 30 clients ~ Dirichlet(0.5); Table 2). (``--partition lambda`` is Bai et al.'s scheme, not this.)

Rows: FedAvg, FedBN, MixStyle, DSU, CCST (overall, K = 3), FedDG-FFT, StableFDG, and the ablation
rows of Table 3: StableFDG style only (``attention=false``) and attention only (``share=false
oversample=false mixstyle=false``); on request (``--rows``), ``stablefdg_no_explore``: every part but the
exploration (Eq. 4-5; issue 35). The claim to check: StableFDG > DSU >= MixStyle > FedAvg (PACS
multi-domain: 83.75 / 80.78 / 80.31 / 77.02); the script prints whether it holds per table and by how much.

Scales (local steps of batch 32 per round; SGD lr 0.05, momentum 0.9, wd 5e-4, cosine):

* ``smoke``: digits4, 6 clients (3 per round), 1 round of 1 step, target = the first domain, seed 0,
  CCST with K = 1 and the fft backend — checks the grid end to end (18 runs; a few seconds each
  on an idle 2-core CPU, mostly start-up and evaluation).
* ``full``: 30 clients, 10 per round, 8 rounds of 5 local steps (400 steps of batch 32 per run,
  the scale of benchmarks/ccst_table.py), every target, seeds 0 1 2, evaluation every 4 rounds
  (the paper reports the final model; the source-validation selection is reported too), CCST with
  K = 3 and the lite backend: 9 rows x 4 targets x 3 seeds x 2 distributions = 216 runs per dataset.

Runs land in ``OUT/<dataset>/<single|multi>/<variant>/seed<k>/<target>``; finished runs are reused,
interrupted ones resumed. ``--workers`` runs several at once (a GPU holds many ConvNet runs).

    python benchmarks/stablefdg_table.py --scale smoke
    python benchmarks/stablefdg_table.py --scale full --device cuda --workers 12 [--dataset digits4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedstyle, not an installed one
from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.experiments.config import RunConfig  # noqa: E402
from fedstyle.experiments.report import to_markdown, write_report  # noqa: E402
from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep, select  # noqa: E402
from fedstyle.experiments.verdict import judge_chain  # noqa: E402

DATASETS = ("digits4", "fashion4")
#: distribution name -> partition settings (Section 4.1)
DISTRIBUTIONS = {"single": {"partition": "per_domain"}, "multi": {"partition": "dirichlet", "alpha": 0.5}}
SCALES = {
    "smoke": {"clients": 6, "per_round": 3, "rounds": 1, "local_steps": 1, "eval_every": 1, "seeds": [0],
              "all_targets": False, "ccst": {"k": 1, "style_backend": "fft"}, "datasets": ("digits4",)},
    "full": {"clients": 30, "per_round": 10, "rounds": 8, "local_steps": 5, "eval_every": 4, "seeds": [0, 1, 2],
             "all_targets": True, "ccst": {"k": 3}, "datasets": DATASETS},
}
#: rows that are no table of the paper: run only when ``--rows`` names them
ON_REQUEST = ("stablefdg_no_explore",)
#: the claim's rows, in the order StableFDG > DSU >= MixStyle > FedAvg
CLAIM = ("stablefdg", "dsu", "mixstyle", "fedavg")


def variants(ccst: dict, reference: bool = False) -> list[Variant]:
    extra = [Variant("stablefdg_reference", "stablefdg", {"reference_code": True})] if reference else []
    return [
        Variant("fedavg", "fedavg"),
        Variant("fedbn", "fedbn"),
        Variant("mixstyle", "mixstyle"),
        Variant("dsu", "dsu"),
        Variant("ccst", "ccst", {"style_type": "overall", **ccst}),
        Variant("feddg_fft", "feddg_fft"),
        Variant("stablefdg", "stablefdg"),
        Variant("stablefdg_style_only", "stablefdg", {"attention": False}),
        Variant("stablefdg_attention_only", "stablefdg", {"share": False, "oversample": False, "mixstyle": False}),
        # Eq. 4-5 off, everything else on: what the exploration itself costs (issue 35 section 2)
        Variant("stablefdg_no_explore", "stablefdg", {"explore": False}),
    ] + extra


def base_config(dataset: str, distribution: str, scale: dict, device: str, data_root: str | None,
                rounds_factor: int = 1) -> RunConfig:
    return RunConfig(dataset=dataset, data_root=data_root, protocol="lodo", clients=scale["clients"],
                     clients_per_round=scale["per_round"],
                     backbone="convnet", rounds=scale["rounds"] * rounds_factor, local_steps=scale["local_steps"],
                     batch_size=32, lr=0.05, lr_schedule="cosine", eval_every=scale["eval_every"] * rounds_factor,
                     device=device,
                     **DISTRIBUTIONS[distribution])


def claim_lines(table, dataset: str) -> list[str]:
    """The claim StableFDG > DSU >= MixStyle > FedAvg, each link judged by fedstyle's rule
    (:mod:`fedstyle.experiments.verdict`: paired per (target, seed), 95 % t interval of the mean difference)."""
    rows = {}
    for row in table.rows:
        for name, label in (("stablefdg", "StableFDG"), ("dsu", "DSU"), ("mixstyle", "MixStyle"), ("fedavg", "FedAvg")):
            if row.label == label:
                rows[name] = row.cell_accuracies(dataset)
    if any(n not in rows for n in CLAIM):
        return ["claim: not all of StableFDG, DSU, MixStyle, FedAvg have results"]
    lines = []
    for better, worse, verdict in judge_chain(list(CLAIM), rows):
        lines.append(f"claim {better} > {worse}: **{verdict.status}** ({verdict.text()})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=tuple(SCALES), default="smoke")
    parser.add_argument("--dataset", choices=(*DATASETS, "both"), default=None,
                        help="default: digits4 for smoke, both for full")
    parser.add_argument("--distribution", choices=(*DISTRIBUTIONS, "both"), default="both")
    parser.add_argument("--out", default="runs/stablefdg")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (worker processes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the scale's")
    parser.add_argument("--fashion-root", default=None, help="folder of fashion4's idx files (default: Debian's)")
    parser.add_argument("--with-reference", action="store_true",
                        help="add a row StableFDG (reference code): the public code's choices (reference_code=true: "
                        "oversampling only at the first firing stage, k-means centres for the first half of the "
                        "batch, next-sample attention partners, no sharing in round 0, equal client weights); "
                        "exploration is once per forward in both rows")
    parser.add_argument("--rows", nargs="+", default=None,
                        help="run only these rows (folder names: fedavg fedbn mixstyle dsu ccst feddg_fft stablefdg "
                        "stablefdg_style_only stablefdg_attention_only, and on request stablefdg_no_explore: Eq. 4-5 "
                        "off; default: all but the on-request ones)")
    parser.add_argument("--targets", nargs="+", default=None, help="run only these target domains (default: the scale's)")
    parser.add_argument("--rounds-factor", type=int, default=1,
                        help="train K times the scale's rounds (same steps per round; a budget check; give another --out)")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    args = parser.parse_args()

    scale = SCALES[args.scale]
    seeds = args.seeds or scale["seeds"]
    datasets = scale["datasets"] if args.dataset is None else DATASETS if args.dataset == "both" else (args.dataset,)
    distributions = tuple(DISTRIBUTIONS) if args.distribution == "both" else (args.distribution,)
    all_rows = variants(scale["ccst"], args.with_reference)
    try:
        keep = select([v.name for v in all_rows], args.rows, "row")
    except ValueError as err:
        parser.error(str(err))
    # a row outside the paper's tables runs only when named
    rows = [v for v in all_rows if v.name in keep and (args.rows is not None or v.name not in ON_REQUEST)]
    out = Path(args.out)
    jobs, tables = [], []
    for dataset in datasets:
        root = args.fashion_root if dataset == "fashion4" else None
        domains = load_dataset(dataset, data_root=root, progress=False).domains
        targets = domains if scale["all_targets"] else domains[:1]
        if args.targets is not None:
            try:
                targets = select(domains, [t for t in args.targets if t in domains] or args.targets, f"{dataset} domain")
            except ValueError as err:
                parser.error(str(err))
        for distribution in distributions:
            folder = out / dataset / distribution
            tables.append((dataset, distribution, folder))
            if not args.report_only:
                base = base_config(dataset, distribution, scale, args.device, root, args.rounds_factor)
                jobs += plan_jobs(base, rows, seeds, targets, folder)
    print(f"{len(jobs)} runs to do ({args.scale}: {len(rows)} rows x {len(seeds)} seeds x targets x "
          f"{len(distributions)} distributions x {len(datasets)} datasets, finished ones skipped)")
    wall = run_sweep(jobs, workers=args.workers)
    for dataset, distribution, folder in tables:
        dirs = [folder / v.name for v in all_rows if (folder / v.name).exists()]
        if not dirs:
            continue
        for which in ("selected", "last"):
            table, paths = write_report(dirs, folder / f"report-{which}", which=which)
            print(f"\n## {dataset}, {distribution}-domain distribution ({which} model)\n")
            print(to_markdown(table))
            print("\n".join(claim_lines(table, dataset)))
    print(f"\nwall time {wall:.0f} s; reports in {out}/<dataset>/<distribution>/report-<selected|last>/")


if __name__ == "__main__":
    main()
