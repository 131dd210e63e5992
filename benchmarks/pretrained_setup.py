"""How to fine-tune the pretrained track's EfficientNet-Lite0 on a CPU (issue 22): cost per step and the
BatchNorm / optimiser choice.

1. Cost: one SGD step of batch 32 (forward, backward, update) and evaluation per image, at 32, 64 and
   96 px, ImageNet weights, one torch thread (as a sweep worker runs).
2. Fine-tuning recipe: a short centralised fine-tuning of the pretrained network on fashion4's photo
   domain (60 images per class: 500 to train, 100 to validate; 64 px; crop + flip; seed 0), N steps
   of batch 32, for BatchNorm in train mode (Lite0's TensorFlow momentum 0.01, or PyTorch's 0.1) or
   eval mode, with SGD (momentum 0.9, weight decay 5e-4) or Adam at several learning rates; the
   validation accuracy in eval mode is what a federated run selects on.

    PYTHONPATH=. python benchmarks/pretrained_setup.py [--steps 30] [--skip-cost]

Needs the Fashion-MNIST idx files (apt install dataset-fashion-mnist, or --data-root).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fedstyle.data import BatchTransform, load_dataset
from fedstyle.models import build_model
from fedstyle.models.efficientnet import LITE_MEAN, LITE_STD

#: (batchnorm mode, BatchNorm momentum, optimiser, learning rate)
RECIPES = [
    ("train", 0.01, "sgd", 1e-3), ("train", 0.01, "sgd", 1e-2), ("train", 0.1, "sgd", 1e-3),
    ("train", 0.1, "sgd", 1e-2), ("train", 0.1, "adam", 3e-4),
    ("eval", 0.01, "sgd", 1e-3), ("eval", 0.01, "sgd", 3e-3), ("eval", 0.01, "sgd", 1e-2),
    ("eval", 0.01, "adam", 3e-5), ("eval", 0.01, "adam", 3e-4),
]


def step_cost(sides=(32, 64, 96), batch=32, repeats=5) -> None:
    print("| px | train step, batch 32 (ms) | evaluation (ms / image) |\n|--:|--:|--:|")
    for side in sides:
        model = build_model("efficientnet_lite0", 10, side, pretrained=True).train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        x, y = torch.randn(batch, 3, side, side), torch.randint(0, 10, (batch,))

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        for _ in range(2):
            step()
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        train_ms = (time.perf_counter() - start) / repeats * 1000
        model.eval()
        with torch.no_grad():
            start = time.perf_counter()
            for _ in range(3):
                model(torch.randn(256, 3, side, side))
        eval_ms = (time.perf_counter() - start) / (3 * 256) * 1000
        print(f"| {side} | {train_ms:.0f} | {eval_ms:.2f} |", flush=True)


def recipes(steps: int, data_root: str | None) -> None:
    data = load_dataset("fashion4", data_root=data_root, resolution=64, progress=False).subset_per_class(60)
    images, labels = data.images["photo"], data.labels["photo"]
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, val = order[:500], order[500:]
    transform = BatchTransform(LITE_MEAN, LITE_STD, "crop_flip")
    print(f"\n| BatchNorm | BN momentum | optimiser | lr | last loss | validation accuracy after {steps} steps |")
    print("|---|--:|---|--:|--:|--:|")
    for mode, bn_momentum, optimiser, lr in RECIPES:
        torch.manual_seed(0)
        draw = torch.Generator().manual_seed(1)
        model = build_model("efficientnet_lite0", data.num_classes, 64, pretrained=True)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum = bn_momentum
        model.set_batchnorm(mode)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = (torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=5e-4) if optimiser == "sgd"
               else torch.optim.Adam(params, lr=lr))
        for _ in range(steps):
            batch = train[torch.randint(0, len(train), (32,), generator=draw)]
            opt.zero_grad()
            loss = F.cross_entropy(model(transform(images[batch], train=True)), labels[batch])
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(transform(images[val], train=False)).argmax(1) == labels[val]).float().mean().item()
        print(f"| {mode} | {bn_momentum} | {optimiser} | {lr:g} | {loss.item():.2f} | {accuracy:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="fine-tuning steps per recipe (default 30)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a sweep worker)")
    parser.add_argument("--data-root", help="folder of the Fashion-MNIST idx files")
    parser.add_argument("--skip-cost", action="store_true", help="only the fine-tuning recipes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_cost:
        step_cost()
    recipes(args.steps, args.data_root)


if __name__ == "__main__":
    main()
