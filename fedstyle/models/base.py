"""Backbones with named stages, and slots where style operations run between stages.

A backbone is a sequence of named stages (``stem``, ``layer1`` ... ``layer4``). Feature-level
style operations (MixStyle, DSU, the FedDG methods' ops) are inserted after named stages with
:meth:`Backbone.insert_op` without editing the backbone; they run in training mode only.
Methods that need the features between stages call :meth:`Backbone.forward_until` and
:meth:`Backbone.forward_from` instead.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from fedstyle.errors import ConfigError


def kaiming_init(model: nn.Module) -> None:
    """torchvision's initialisation: Kaiming normal (fan_out) convolutions, BatchNorm weight 1 and bias 0."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class Backbone(nn.Module):
    """Base class: subclasses set ``stage_names`` and ``feature_dim`` and implement ``run_stage``."""

    stage_names: tuple[str, ...] = ()
    feature_dim: int = 0

    def __init__(self) -> None:
        super().__init__()
        # ModuleDict so that ops move with .to(device); ops without parameters add no state keys.
        self.stage_ops = nn.ModuleDict()

    def run_stage(self, name: str, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Global average pooling of the last stage's output to (B, feature_dim)."""
        return torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)

    # -- style-op slots -----------------------------------------------------------------
    def insert_op(self, stage: str, op: nn.Module) -> None:
        """Run ``op`` on the output of ``stage`` in training mode (after any ops already there)."""
        if stage not in self.stage_names:
            raise ConfigError(f"{type(self).__name__} has no stage {stage!r}; stages: {', '.join(self.stage_names)}")
        if stage in self.stage_ops:
            existing = self.stage_ops[stage]
            self.stage_ops[stage] = nn.Sequential(*(list(existing) if isinstance(existing, nn.Sequential) else [existing]), op)
        else:
            self.stage_ops[stage] = op

    def clear_ops(self) -> None:
        self.stage_ops = nn.ModuleDict()

    def after_stage(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if self.training and name in self.stage_ops:
            x = self.stage_ops[name](x)
        return x

    # -- forward ------------------------------------------------------------------------
    def forward_until(self, x: torch.Tensor, stage: str) -> torch.Tensor:
        """Run the stages up to and including ``stage`` (with their ops); return that output."""
        for name in self.stage_names:
            x = self.after_stage(name, self.run_stage(name, x))
            if name == stage:
                return x
        raise ConfigError(f"no stage {stage!r}; stages: {', '.join(self.stage_names)}")

    def forward_from(self, x: torch.Tensor, stage: str) -> torch.Tensor:
        """Continue from the output of ``stage`` through the remaining stages; return stage maps."""
        names = self.stage_names
        if stage not in names:
            raise ConfigError(f"no stage {stage!r}; stages: {', '.join(names)}")
        for name in names[names.index(stage) + 1 :]:
            x = self.after_stage(name, self.run_stage(name, x))
        return x

    def forward_maps(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's feature maps (B, C, h, w), before pooling."""
        for name in self.stage_names:
            x = self.after_stage(name, self.run_stage(name, x))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.forward_maps(x))


class Classifier(nn.Module):
    """A backbone followed by a linear head; ``features`` gives the pooled representation."""

    def __init__(self, backbone: Backbone, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def insert_ops(self, stages: Sequence[str], make_op) -> None:
        """Insert a fresh ``make_op()`` after each named stage."""
        for stage in stages:
            self.backbone.insert_op(stage, make_op())
