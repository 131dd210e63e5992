"""FedDG-GA's gap pass on the CPU: seconds per pass over one client, three ways.

FedDG-GA measures the global and the local model's loss on each sampled client's data every round
(``fedstyle.algorithms.feddg_ga.local_loss_and_accuracy``). A client of a run is rows of a shared pool, and
``ClientData.images`` gathers every row of the client when read. This times one pass over a fashion4-sized
client (``--rows`` of a ``--pool`` of random 3 x 32 x 32 images, the leaderboard's ConvNet), best of
``--repeats``:

- ``images[a:b] per batch``: each batch read through ``images`` (every row gathered per batch; the pass
  before ClientData.take);
- ``take per batch``: what the pass does now (only the batch's rows gathered);
- ``gap_fraction=F``: the pass over a kept random subset of ``F`` of the rows.

It also says whether the first two give the same loss and accuracy to the bit.

    python benchmarks/feddg_ga_gap.py [--threads 1] [--pool 70000] [--rows 14000] [--fraction 0.1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fedstyle.algorithms.feddg_ga import local_loss_and_accuracy
from fedstyle.data.client import ClientData, SamplePool
from fedstyle.devices import inference_batch
from fedstyle.models.registry import build_model


@torch.no_grad()
def pass_reading_every_row(model, data: ClientData, batch_size: int) -> tuple[float, float]:
    """The pass as it read before ClientData.take: ``data.images[a:b]`` gathers the whole client per batch."""
    model.eval()
    loss, correct, n = 0.0, 0, len(data)
    for start in range(0, n, batch_size):
        x = data.transform(data.images[start : start + batch_size], train=False)
        y = data.labels[start : start + batch_size]
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum").double())
        correct += int((logits.argmax(dim=1) == y).sum())
    return loss / n, correct / n


def best_seconds(run, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pool", type=int, default=70_000, help="images in the shared pool (Fashion-MNIST's 70,000)")
    parser.add_argument("--rows", type=int, default=14_000, help="the client's rows of the pool")
    parser.add_argument("--fraction", type=float, default=0.1, help="gap_fraction of the third line")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    pool = SamplePool(torch.randint(0, 256, (args.pool, 3, 32, 32), dtype=torch.uint8, generator=g),
                      torch.randint(0, 10, (args.pool,), generator=g), torch.zeros(args.pool, dtype=torch.long))
    data = ClientData.from_pool(pool, torch.randperm(args.pool, generator=g)[: args.rows],
                                lambda x, train=False: x.float().div(255).sub(0.5).div(0.5))
    model = build_model("convnet", 10, 32)
    cpu = torch.device("cpu")
    batch = inference_batch(cpu, 256)
    subset = torch.randperm(args.rows, generator=g)[: max(1, round(args.fraction * args.rows))].sort().values
    old_s, old = best_seconds(lambda: pass_reading_every_row(model, data, batch), args.repeats)
    new_s, new = best_seconds(lambda: local_loss_and_accuracy(model, data, cpu), args.repeats)
    sub_s, _ = best_seconds(lambda: local_loss_and_accuracy(model, data, cpu, positions=subset), args.repeats)
    print(f"{args.rows} of {args.pool} rows, batch {batch}, {args.threads} thread(s), best of {args.repeats}")
    print("| pass | s | images/s |\n|:--|--:|--:|")
    for name, seconds, images in (("images[a:b] per batch", old_s, args.rows), ("take per batch", new_s, args.rows),
                                  (f"gap_fraction={args.fraction}", sub_s, len(subset))):
        print(f"| {name} | {seconds:.2f} | {images / seconds:,.0f} |")
    print(f"same loss and accuracy to the bit: {old == new} ({old} vs {new})")


if __name__ == "__main__":
    main()
