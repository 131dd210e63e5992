"""StyleDDG benchmark (issue 13 §3): the paper's decentralized setting on offline data.

One domain per device, leave-one-domain-out, every target of digits4 and fashion4, 3 seeds, in two
networks: m = 3 devices on a complete graph (one per source domain, ``--partition domain``) and
m = 9 on a random geometric graph of radius 0.8 (three per source domain, ``--partition per_domain``).
Rows (the paper's Tables 1-3): FedBN, FedBN + MixStyle, FedBN + DSU — star topology, one client per
device, all clients every round — and DSGD, DSGD + MixStyle, DSGD + DSU, StyleDDG on the graph
(Metropolis-Hastings mixing every iteration). MixStyle / DSU run inside each device at stages 1-3
with p = 0.5; StyleDDG with its defaults (p = 0.5, alpha = 3, Beta(0.1, 0.1)).

Budget, equal for every row of a network: each device makes the same number of SGD steps of batch
64 (lr 0.05, momentum 0.9, cosine). ``--scale full``: 8 rounds x 15 steps (m = 3) or 8 x 5 steps
(m = 9, a third of the data per device), i.e. 120 / 40 iterations and ~3.8 passes over a digits4
device's data (~0.5 over a fashion4 device's); on the graph a round is 15 (5) iterations, each one
gradient step and one gossip step; the star rows average every 15 (5) local steps; evaluation after
rounds 4 and 8 (the average model selected by source validation). 2 datasets x 2
networks x 7 rows x 4 targets x 3 seeds = 336 runs. ``--scale smoke``: digits4, target optdigits
(the smallest), seed 0, 1 round x 2 (m = 3) / 1 (m = 9) steps, every row for m = 3 and FedBN, DSGD,
StyleDDG for m = 9: 10 runs, to check the script (~2 min on an idle 2-core CPU).

Prints, per dataset and network, the accuracy table (average model, selected by source
validation), the devices' own models (last round: accuracy mean ± std over devices, consensus
distance) and the traffic: bytes per edge and iteration of the weights and of the shares (StyleDDG's
batch styles) for the graph rows, bytes per client and round for the star rows.

    PYTHONPATH=. python benchmarks/styleddg_table.py --scale smoke --out runs/styleddg-smoke
    PYTHONPATH=. python benchmarks/styleddg_table.py --scale full --device cuda --workers 12 --out runs/styleddg
    PYTHONPATH=. python benchmarks/styleddg_table.py --scale full --out runs/styleddg --report-only
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from fedstyle.data import load_dataset
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.report import to_markdown, write_report
from fedstyle.experiments.sweep import Variant, plan_jobs, run_sweep, select

STAR_ROWS = [
    Variant("fedbn", "fedbn"),
    Variant("fedbn-mixstyle", "fedbn", {"style": "mixstyle"}),
    Variant("fedbn-dsu", "fedbn", {"style": "dsu"}),
]
GRAPH_ROWS = [
    Variant("dsgd", "dsgd"),
    Variant("dsgd-mixstyle", "dsgd", {"style": "mixstyle"}),
    Variant("dsgd-dsu", "dsgd", {"style": "dsu"}),
    Variant("styleddg", "styleddg"),
]
ROWS = STAR_ROWS + GRAPH_ROWS


@dataclass(frozen=True)
class Network:
    """A network of the paper: m devices on a graph, and the star the FedBN rows use instead."""

    name: str
    devices: int
    topology: str
    partition: str
    local_steps: dict  # scale -> local steps per round


NETWORKS = [
    Network("m3-complete", 3, "complete", "domain", {"full": 15, "smoke": 2}),
    Network("m9-rgg0.8", 9, "rgg", "per_domain", {"full": 5, "smoke": 1}),
]
SCALES = {  # rounds, eval_every, datasets, seeds, targets (None: all), rows of the m = 9 network (None: all)
    # full: evaluations at rounds 4 and 8 (an m = 9 evaluation tests 1 + 9 models on the whole target domain)
    "full": dict(rounds=8, eval_every=4, datasets=("digits4", "fashion4"), seeds=(0, 1, 2), targets=None, m9_rows=None),
    # smoke: evaluating 1 + 9 models dominates an m = 9 run on a CPU, so only one row per kind runs there
    "smoke": dict(rounds=1, eval_every=1, datasets=("digits4",), seeds=(0,), targets=("optdigits",),
                  m9_rows=("fedbn", "dsgd", "styleddg")),
}


def base_config(dataset: str, network: Network, scale: str, args) -> RunConfig:
    return RunConfig(dataset=dataset, data_root=args.data_root if dataset == "fashion4" else None,
                     protocol="lodo", partition=network.partition,
                     clients=network.devices if network.partition != "domain" else None,
                     topology=network.topology, radius=0.8, rounds=SCALES[scale]["rounds"] * args.rounds_factor,
                     local_steps=network.local_steps[scale], batch_size=64, lr=0.05, lr_schedule="cosine",
                     eval_every=SCALES[scale]["eval_every"] * args.rounds_factor, device=args.device)


def plan(args) -> tuple[list, list[tuple[str, Network, Path, list[str]]]]:
    """The jobs still to run, and each (dataset, network) table's folder and targets."""
    jobs, tables = [], []
    scale = SCALES[args.scale]
    seeds = args.seeds or list(scale["seeds"])
    for dataset in args.datasets or scale["datasets"]:
        domains = list(scale["targets"] or load_dataset(dataset, data_root=args.data_root if dataset == "fashion4"
                                                        else None, progress=False).domains)
        if args.targets:
            domains = select(domains, [t for t in args.targets if t in domains] or args.targets, f"{dataset} domain")
        for network in NETWORKS:
            if args.networks and network.name not in args.networks:
                continue
            out = Path(args.out) / dataset / network.name
            tables.append((dataset, network, out, domains))
            if args.report_only:
                continue
            graph = base_config(dataset, network, args.scale, args)
            keep = scale["m9_rows"] if network.devices == 9 else None
            star_rows, graph_rows = ([v for v in rows if (keep is None or v.name in keep)
                                      and (args.rows is None or v.name in args.rows)]
                                     for rows in (STAR_ROWS, GRAPH_ROWS))
            jobs += plan_jobs(graph.updated(topology="star"), star_rows, seeds, domains, out)
            jobs += plan_jobs(graph, graph_rows, seeds, domains, out)
    return jobs, tables


def _summaries(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("seed*/*/summary.json"))]


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def devices_table(out: Path) -> str:
    """The graph rows' devices: last-round target accuracy mean and std over devices (averaged over runs),
    the average model's last-round accuracy beside it, and the consensus distance."""
    lines = ["| Method | average model (last) | devices: mean | devices: std | consensus distance |",
             "|:--|--:|--:|--:|--:|"]
    for v in GRAPH_ROWS:
        runs = _summaries(out / v.name)
        if not runs:
            continue
        label = runs[0]["label"]
        avg = _mean(100 * t["last"] for s in runs for t in s["targets"].values())
        mean = _mean(100 * d["mean"] for s in runs for d in s["device_target_acc_last"].values())
        std = _mean(100 * d["std"] for s in runs for d in s["device_target_acc_last"].values())
        lines.append(f"| {label} | {avg:.1f} | {mean:.1f} | {std:.1f} | "
                     f"{_mean(s['consensus_distance_last'] for s in runs):.3g} |")
    return "\n".join(lines)


def traffic_table(out: Path) -> str:
    """Bytes: per edge and iteration on the graph (weights and shares apart), per client and round on the star."""
    lines = ["| Method | weights bytes per edge·iteration | share bytes per edge·iteration | share numbers | "
             "share / weights | MB sent per device | s per run |", "|:--|--:|--:|--:|--:|--:|--:|"]
    for v in ROWS:
        runs = _summaries(out / v.name)
        if not runs:
            continue
        s = runs[0]
        per_device = _mean(r["bytes_up"] / r["num_clients"] for r in runs) / 1e6
        seconds = _mean(r["seconds"] for r in runs)
        edge = s["traffic"].get("per_edge_iteration")
        if s["topology"] == "star":  # per client and round, up (weights + payload)
            per_round = s["bytes_up"] / (s["num_clients"] * s["rounds"])
            lines.append(f"| {s['label']} (star) | {per_round:,.0f} per client·round | — | — | — | "
                         f"{per_device:,.1f} | {seconds:.1f} |")
        elif edge:
            lines.append(f"| {s['label']} | {edge['model_bytes']:,.0f} | {edge['payload_bytes']:,.0f} | "
                         f"{edge['payload_values']:,.0f} | {100 * edge['payload_fraction_of_model']:.3g}% | "
                         f"{per_device:,.1f} | {seconds:.1f} |")
        else:  # a run from before the per-edge counters
            lines.append(f"| {s['label']} | — | — | — | — | {per_device:,.1f} | {seconds:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/styleddg")
    parser.add_argument("--scale", choices=tuple(SCALES), default="smoke")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: 0 1 2 (full), 0 (smoke)")
    parser.add_argument("--datasets", nargs="+", choices=("digits4", "fashion4"),
                        help="default: digits4 fashion4 (full), digits4 (smoke)")
    parser.add_argument("--data-root", help="fashion4: folder of the Fashion-MNIST idx files (default: found)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (worker processes)")
    parser.add_argument("--rows", nargs="+", help=f"run only these rows ({' '.join(v.name for v in ROWS)}; default: all)")
    parser.add_argument("--targets", nargs="+", help="run only these target domains (default: the scale's)")
    parser.add_argument("--networks", nargs="+", choices=[n.name for n in NETWORKS], help="default: both")
    parser.add_argument("--rounds-factor", type=int, default=1,
                        help="train K times the scale's rounds (same steps per round, evaluations as often relative "
                        "to the run: a budget check; give another --out)")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    args = parser.parse_args()

    try:
        select([v.name for v in ROWS], args.rows, "row")
        jobs, tables = plan(args)
    except ValueError as err:
        parser.error(str(err))
    print(f"{len(jobs)} runs to do ({args.scale})")
    wall = run_sweep(jobs, workers=args.workers)
    for dataset, network, out, _ in tables:
        if not out.exists():
            continue
        table, paths = write_report([out / v.name for v in ROWS if (out / v.name).exists()], out / "report",
                                    which="selected")
        print(f"\n## {dataset}, {network.name} ({network.devices} devices; FedBN rows on a star)\n")
        print(to_markdown(table))
        print(f"\nDevices' own models (graph rows, last round):\n\n{devices_table(out)}")
        print(f"\nTraffic:\n\n{traffic_table(out)}")
        print(f"\nreport in {paths['markdown']}")
    print(f"\nwall time {wall:.0f} s for {len(jobs)} runs")


if __name__ == "__main__":
    main()
