"""Cost of methods per round, side by side in one process on identical settings.

Every method gets the same dataset, partition, local steps, batch size, backbone and device; rounds
are interleaved (round r of every method, then round r + 1), so a machine whose load drifts slows
every method alike. Reported per method: the median seconds per round of the simulator's round
(query phase, local training, aggregation or mixing — no evaluation), the gradient steps a round
takes (summed over the clients or devices that train in it), and the split the method itself
records with ``ctx.timed`` (``train_metrics``: k-means, oversampling, attention, ...) as seconds per
round and share of the round. Beside wall time, the process's CPU time per round (all its threads):
on a machine shared with other jobs its ratio is the steadier figure (on a GPU, read the wall time).
A one-time setup exchange (CCST's stylization; pass ``ccst:stylize=eager`` to make every image
there rather than in the first rounds' batches) is timed apart.

Ratios are per gradient step (seconds per round / steps per round), so a star round of
``--clients-per-round`` clients and a peer-to-peer round, where every device takes every step, compare:

- ``x <first method>``: against the first method (FedAvg by default);
- ``x <p2p baseline>``: peer-to-peer methods (StyleDDG, DSGD: those that do not run on the star) also
  against ``--p2p-baseline`` (default: the first peer-to-peer method listed, e.g. ``dsgd``), the same
  decentralized SGD on the same graph (``--topology``, default ring) without the method's style work:
  the method's own overhead. Their ratio to FedAvg adds what DSGD's mixing costs per step.

Peer-to-peer methods run on the same partition (``--clients`` devices; ``--p2p-clients`` to change it).
With ``--local-steps`` every star client and every device takes that many steps per round, so the star
methods' ratios are also their ratios per round; by epochs, a method that enlarges its data (CCST's
d x K images) takes more steps.

    python benchmarks/method_cost.py --methods fedavg,stablefdg [--backbone resnet18] [--device cuda]
    python benchmarks/method_cost.py --methods fedavg,stablefdg,stablefdg:oversample_ratio=0.25
    python benchmarks/method_cost.py --methods fedavg,mixstyle,dsu,ccst:stylize=eager,stablefdg,fedgca,dsgd,styleddg \\
        --local-steps 7 --rounds 8 --threads 1 --out bench/cost.json --markdown bench/cost.md   # issue 23's table

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
from fedstyle.algorithms import METHODS  # noqa: E402
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


def is_p2p(method: str) -> bool:
    """A method that cannot run on the star (StyleDDG, DSGD) is timed on the peer-to-peer simulator."""
    return "star" not in METHODS.get(method).topologies


def steps_in_round(sim, round_index: int, clients: list[int]) -> int:
    """Gradient steps a round takes: every device every step (peer-to-peer), or each sampled client's own."""
    if hasattr(sim, "steps_per_round"):
        return sim.steps_per_round() * sim.num_clients
    train = sim.settings.train_settings(round_index)
    return sum(train.steps_for(sim.clients[c]) for c in clients)


def keep_large_blocks_on_heap() -> bool:
    """glibc only: serve blocks above 32 MB from the heap and keep them there, as the environment's
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` would. By default glibc maps every block above
    32 MB afresh and page-faults it on each touch: a batch of 128 ConvNet images (FedGCA's four views of
    32) has 33.5 MB maps at layer1, FedAvg's 32 images 8 MB ones, so the default penalises the larger
    batch. Returns whether glibc took the settings."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt's parameter numbers (malloc.h)
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def build_runs(args, tokens: list[str]) -> dict[str, dict]:
    target = load_dataset(args.dataset, data_root=args.data_root, progress=False).domains[0]
    base = RunConfig(dataset=args.dataset, data_root=args.data_root, resolution=args.resolution, targets=[target],
                     partition="per_domain", clients=args.clients, clients_per_round=args.clients_per_round,
                     backbone=args.backbone, batch_size=args.batch_size, local_epochs=args.local_epochs,
                     local_steps=args.local_steps,
                     rounds=args.warmup + args.rounds, lr_schedule="constant", device=args.device, seed=args.seed)
    runs = {}
    for token in tokens:
        method, hp = parse_method(token)
        config = base.updated(method=method, hparams=hp)
        if is_p2p(method):  # every device trains every step: no sampling
            config = config.updated(topology=args.topology, clients=args.p2p_clients or args.clients,
                                    clients_per_round=0)
        exp = build_experiment(config, progress=False)
        start = time.perf_counter()
        setup = exp.simulator.setup()
        runs[token] = {"sim": exp.simulator, "topology": config.topology, "p2p": is_p2p(method),
                       "setup_s": time.perf_counter() - start if setup else 0.0,
                       "seconds": [], "cpu": [], "steps": [], "parts": {}, "device": str(exp.device)}
    return runs


def time_rounds(args, runs: dict[str, dict]) -> None:
    for r in range(args.warmup + args.rounds):
        for token, run in runs.items():  # interleaved: load drift hits every method alike
            cpu = time.process_time()
            result = run["sim"].run_round(r)
            cpu = time.process_time() - cpu
            steps = steps_in_round(run["sim"], r, result.clients)
            print(f"round {r} {token}: {result.seconds:.2f} s, CPU {cpu:.2f} s, {steps} steps"
                  f"{' (warm-up)' if r < args.warmup else ''}", file=sys.stderr, flush=True)
            if r < args.warmup:
                continue
            run["seconds"].append(result.seconds)
            run["cpu"].append(cpu)
            run["steps"].append(steps)
            for name, seconds in round_parts(result, run["sim"]).items():
                run["parts"].setdefault(name, []).append(seconds)


def round_parts(result, sim) -> dict[str, float]:
    """Seconds per round of each ``*_seconds`` metric of a round. The clients' metrics arrive as means over the
    round's clients, so x clients is the round's total; the server's own (``sim.server.metrics``, e.g. FedOMG's
    ``server_opt_seconds``, taken once a round, and overriding a client key of the same name in
    ``result.metrics``) are already per round."""
    server = getattr(getattr(sim, "server", None), "metrics", None) or {}
    return {key[: -len("_seconds")]: value * (1 if key in server else len(result.clients))
            for key, value in result.metrics.items() if key.endswith("_seconds")}


def summarise(run: dict) -> dict:
    wall, cpu = statistics.median(run["seconds"]), statistics.median(run["cpu"])
    steps = statistics.median(run["steps"])
    parts = {name: statistics.fmean(v) for name, v in sorted(run["parts"].items())}
    return {"topology": run["topology"], "seconds_per_round": wall, "cpu_seconds_per_round": cpu,
            "steps_per_round": steps, "seconds_per_step": wall / steps, "cpu_seconds_per_step": cpu / steps,
            "rounds": run["seconds"], "cpu_rounds": run["cpu"], "setup_seconds": run["setup_s"], "parts": parts}


def add_ratios(figures: dict[str, dict], baseline: str, key: str) -> None:
    """``figures[m][key] = {"wall": ..., "cpu": ...}``: per-step cost of m over the baseline's."""
    base = figures[baseline]
    for fig in figures.values():
        fig[key] = {"of": baseline, "wall": fig["seconds_per_step"] / base["seconds_per_step"],
                    "cpu": fig["cpu_seconds_per_step"] / base["cpu_seconds_per_step"]}


def markdown(args, report: dict, first: str, p2p_base: str | None) -> str:
    local = f"{args.local_steps} local steps" if args.local_steps else f"{args.local_epochs} local epoch(s)"
    p2p = (f"; peer-to-peer methods on a {args.topology} of {args.p2p_clients or args.clients} devices, every "
           "device every step" if p2p_base else "")
    star = f"star: {args.clients} clients ({args.clients_per_round} per round)"
    lines = [f"{args.dataset}, {args.backbone}, {star}{p2p}; "
             f"{local} of batch {args.batch_size}, {args.rounds} timed rounds after {args.warmup} warm-up, device "
             f"{report['device']}, {report['torch_threads']} torch threads"
             f"{', large blocks kept on the heap' if args.heap_blocks else ''}. Ratios per gradient step; "
             f"x {first} for every method" + (f", x {p2p_base} for the peer-to-peer ones" if p2p_base else "") + ".",
             ""]
    head = ["method", "topology", "steps/round", "wall s/round", "CPU s/round", "CPU ms/step",
            f"CPU x {first}", f"wall x {first}"]
    if p2p_base:
        head += [f"CPU x {p2p_base}", f"wall x {p2p_base}"]
    head += ["setup s", "time split (s/round, share of the round)"]
    lines += ["| " + " | ".join(head) + " |", "|---|---|" + "--:|" * (len(head) - 4) + "--:|---|"]
    for token, fig in report["methods"].items():
        split = ", ".join(f"{n} {s:.3f} ({100 * s / fig['seconds_per_round']:.0f}%)"
                          for n, s in fig["parts"].items()) or "-"
        row = [token, fig["topology"], f"{fig['steps_per_round']:.0f}", f"{fig['seconds_per_round']:.2f}",
               f"{fig['cpu_seconds_per_round']:.2f}", f"{1000 * fig['cpu_seconds_per_step']:.1f}",
               f"{fig['vs_first']['cpu']:.2f}x", f"{fig['vs_first']['wall']:.2f}x"]
        if p2p_base:
            own = fig.get("vs_p2p")
            row += [f"{own['cpu']:.2f}x", f"{own['wall']:.2f}x"] if own else ["-", "-"]
        row += [f"{fig['setup_seconds']:.1f}", split]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="fedavg,stablefdg", help="comma-separated; the first is the baseline")
    parser.add_argument("--backbone", default="convnet")
    parser.add_argument("--dataset", default="digits4")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--resolution", type=int, default=None, help="image side (default: the dataset's)")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--topology", default="ring", help="graph of the peer-to-peer methods")
    parser.add_argument("--p2p-clients", type=int, default=0, help="devices of the peer-to-peer methods (0: --clients)")
    parser.add_argument("--p2p-baseline", default=None,
                        help="the peer-to-peer methods' own baseline (default: the first peer-to-peer method listed)")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--local-steps", type=int, default=0, help="local steps per round (> 0 overrides epochs)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per method")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (allocator, kernels)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is; on a machine "
                        "shared with other jobs 1 is far steadier: a 2-thread op waits for the other thread's turn)")
    parser.add_argument("--heap-blocks", action="store_true",
                        help="glibc: keep blocks above 32 MB on the heap (see keep_large_blocks_on_heap)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    parser.add_argument("--markdown", default=None, help="also write the table as markdown here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.heap_blocks and not keep_large_blocks_on_heap():
        raise SystemExit("--heap-blocks: this C library did not take mallopt's settings (glibc only)")

    tokens = [t.strip() for t in args.methods.split(",") if t.strip()]
    if len(set(tokens)) != len(tokens):
        raise SystemExit(f"--methods lists a method twice: {tokens}")
    p2p_tokens = [t for t in tokens if is_p2p(parse_method(t)[0])]
    p2p_base = args.p2p_baseline or (p2p_tokens[0] if p2p_tokens else None)
    if p2p_base is not None and p2p_base not in p2p_tokens:
        raise SystemExit(f"--p2p-baseline {p2p_base!r} is not a peer-to-peer method of --methods {tokens}")
    runs = build_runs(args, tokens)
    time_rounds(args, runs)

    report = {"settings": dict(vars(args)), "device": runs[tokens[0]]["device"],
              "torch_threads": torch.get_num_threads(), "methods": {t: summarise(r) for t, r in runs.items()}}
    add_ratios(report["methods"], tokens[0], "vs_first")
    if p2p_base:
        p2p_figures = {t: report["methods"][t] for t in p2p_tokens}
        add_ratios(p2p_figures, p2p_base, "vs_p2p")
    for fig in report["methods"].values():  # the earlier keys: ratios to the first method
        fig["ratio"], fig["cpu_ratio"] = fig["vs_first"]["wall"], fig["vs_first"]["cpu"]
    table = markdown(args, report, tokens[0], p2p_base)
    print("\n" + table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(table)
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
