"""How far `--client-batching on` lands from the sequential path in float32, beside how far the sequential
path lands from itself when every initial weight moves by one float32 step (docs/guide/usage.md, "Client batching").

Both paths compute the same thing; the batched convolutions round differently, and training amplifies any
rounding (ties in ReLU and max-pooling that a rounding flips, BatchNorm over flat images). The one-step
nudge (``torch.nextafter`` towards +inf on every trainable initial weight) measures that amplification on
the same setting, so the batched difference can be read against it. Per seed, the largest absolute
difference from the sequential run after ``--rounds`` rounds, of the global weights and of BatchNorm's
running statistics. On CPU the batched path is slower (docs/guide/usage.md); this measures only the numbers.

    python benchmarks/batching_rounding.py --method fedavg --seeds 0 1 2
    python benchmarks/batching_rounding.py --method ccst --hp style_backend=fft --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fedstyle.experiments.build import build_experiment  # noqa: E402
from fedstyle.experiments.config import RunConfig  # noqa: E402


def final_state(config: RunConfig, nudge: bool = False) -> dict[str, torch.Tensor]:
    sim = build_experiment(config, progress=False).simulator
    if nudge:
        trainable = {k for k, _ in sim.model.named_parameters()}
        for key in trainable & sim.server.weights.keys():
            w = sim.server.weights[key]
            sim.server.weights[key] = torch.nextafter(w, torch.full_like(w, float("inf")))
    sim.setup()
    for r in range(config.rounds):
        sim.run_round(r)
    return {k: v.detach().double() for k, v in sim.server.weights.items() if v.is_floating_point()}


def largest(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], buffers: bool) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a if ("running_" in k) == buffers and a[k].numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="digits4")
    parser.add_argument("--target", default="mnist")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hp = dict(kv.split("=", 1) for kv in args.hp)
    print(f"{args.method} {hp or ''} on {args.dataset} (target {args.target}), {args.clients} clients, {args.rounds} "
          f"rounds x {args.local_steps} steps, float32 CPU: largest |difference| from the sequential run")
    print("| seed | batched: weights | batched: BN running stats | one-step nudge: weights | nudge: BN running stats |")
    print("|---|---|---|---|---|")
    for seed in args.seeds:
        config = RunConfig(dataset=args.dataset, targets=[args.target], method=args.method, hparams=hp,
                           clients=args.clients, rounds=args.rounds, local_steps=args.local_steps,
                           batch_size=args.batch_size, seed=seed, device="cpu", client_batching="off")
        sequential = final_state(config)
        batched = final_state(config.updated(client_batching="on"))
        nudged = final_state(config, nudge=True)
        print(f"| {seed} | {largest(sequential, batched, False):.1e} | {largest(sequential, batched, True):.1e} "
              f"| {largest(sequential, nudged, False):.1e} | {largest(sequential, nudged, True):.1e} |", flush=True)


if __name__ == "__main__":
    main()
