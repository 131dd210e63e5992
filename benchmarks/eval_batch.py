"""Evaluation's batch size on the CPU: ms per image of an eval-mode forward pass, per backbone and batch size.

fedstyle evaluates in passes of ``fedstyle.devices.inference_batch(device, 512)`` images: 512 on a GPU, 32 on
the CPU. This prints why (the best of ``--repeats`` passes over ``--images`` random images at each batch size)
and the largest difference of the logits between the smallest and the largest batch.

    python benchmarks/eval_batch.py [--threads 1 2] [--batches 32 64 128 512] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from fedstyle.models.registry import build_backbone

#: backbone, input size, images per measurement
BACKBONES = (("convnet", 32, 512), ("resnet18", 64, 256), ("efficientnet_lite0", 64, 256))


def per_image_ms(model, x: torch.Tensor, batches: list[int], repeats: int) -> dict[int, float]:
    """The best of ``repeats`` passes per batch size, the sizes taken in turn within each repeat (so a slow
    spell of the machine does not land on one size)."""
    best = {b: float("inf") for b in batches}
    for b in batches:
        model(x[:b])  # oneDNN builds its primitives for this shape once
    for _ in range(repeats):
        for b in batches:
            start = time.perf_counter()
            for s in range(0, len(x), b):
                model(x[s : s + b])
            best[b] = min(best[b], (time.perf_counter() - start) / len(x) * 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, size, images in BACKBONES:
            model = build_backbone(name, size).to(args.device).eval()
            x = torch.randn(images, 3, size, size, device=args.device)
            batches = sorted({min(b, images) for b in args.batches})
            with torch.no_grad():
                times = per_image_ms(model, x, batches, args.repeats)
                small = torch.cat([model(x[s : s + batches[0]]) for s in range(0, images, batches[0])])
                large = torch.cat([model(x[s : s + batches[-1]]) for s in range(0, images, batches[-1])])
            row = "  ".join(f"{b:>4}: {t:6.3f}" for b, t in times.items())
            print(f"{threads} thread(s)  {name:<19} {size:>3} px  ms/image at batch  {row}   "
                  f"max |logit diff| {float((small - large).abs().max()):.1e}")


if __name__ == "__main__":
    main()
