"""Accuracy of a set of weights on named evaluation sets (batched, no augmentation)."""

from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import nn

from fedstyle.devices import inference_batch
from fedstyle.federation.client import load_weights

#: images per evaluation forward pass on a GPU (on the CPU: fedstyle.devices.CPU_INFERENCE_BATCH)
EVAL_BATCH = 512


class EvalSet:
    """uint8 images and labels of one evaluation set (a source-validation split or a held-out domain)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@torch.no_grad()
def accuracy(model: nn.Module, data: EvalSet, transform: Callable, device: torch.device,
             batch_size: int | None = None) -> float:
    """Top-1 accuracy of ``model`` in eval mode on ``data``, in passes of ``batch_size`` images (default: by
    device, :func:`fedstyle.devices.inference_batch`)."""
    batch_size = batch_size or inference_batch(device, EVAL_BATCH)
    if len(data) == 0:
        return float("nan")
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(data), batch_size):
        x = data.images[start : start + batch_size].to(device, non_blocking=True)
        y = data.labels[start : start + batch_size].to(device, non_blocking=True)
        correct += (model(transform(x, train=False)).argmax(1) == y).sum()
    return int(correct) / len(data)


def evaluate(
    model: nn.Module,
    weights: Mapping[str, torch.Tensor],
    sets: Mapping[str, EvalSet],
    transform: Callable,
    device: torch.device,
) -> dict[str, float]:
    """Load ``weights`` into ``model`` and return the accuracy (a fraction) on every set."""
    load_weights(model, weights)
    return {name: accuracy(model, data, transform, device) for name, data in sets.items()}
