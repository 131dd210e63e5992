"""The ConvNet's activation layout: one training step and one eval-mode forward, NCHW against channels-last.

fedstyle's ConvNet turns its input channels-last (``ConvNet.run_stage``) because oneDNN's convolutions,
BatchNorm and max-pooling run faster on NHWC maps on a CPU. This prints both layouts' times (the NCHW row is
what the ConvNet did before) and checks that the two compute the same values (the largest difference of the
loss over the timed steps).

    python benchmarks/convnet_layout.py [--threads 1] [--batch 32] [--size 32] [--steps 30] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fedstyle.models.convnet import ConvNet


def forward(model: ConvNet, x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    if not channels_last:  # the layout before: every stage on NCHW maps
        for name in model.stage_names:
            x = getattr(model, name)(x)
        return model.pool(x)
    return model.pool(model.forward_stages(x))


def timed_steps(channels_last: bool, args) -> tuple[float, float, list[float]]:
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = ConvNet(args.size).to(device)
    head = torch.nn.Linear(model.feature_dim, 10).to(device)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    losses = []
    for i in range(args.steps + 5):
        if i == 5:
            start = time.perf_counter()
        loss = F.cross_entropy(head(forward(model, x, channels_last)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    step = (time.perf_counter() - start) / args.steps
    model.eval()
    big = torch.randn(256, 3, args.size, args.size, device=device)
    with torch.no_grad():
        forward(model, big, channels_last)
        start = time.perf_counter()
        for _ in range(5):
            forward(model, big, channels_last)
    per_image = (time.perf_counter() - start) / 5 / len(big)
    return step, per_image, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = {layout: timed_steps(layout == "channels-last", args) for layout in ("NCHW", "channels-last")}
    for layout, (step, per_image, _) in rows.items():
        print(f"{layout:14s} train step {step * 1e3:7.1f} ms   eval forward {per_image * 1e3:6.3f} ms/image")
    diff = max(abs(a - b) for a, b in zip(rows["NCHW"][2], rows["channels-last"][2]))
    print(f"largest loss difference over {args.steps + 5} steps: {diff:.2e}")


if __name__ == "__main__":
    main()
