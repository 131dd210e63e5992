"""Backbones with named stages, and slots where style operations run between stages.

A backbone is a sequence of named stages (``stem``, ``layer1`` ... ``layer4``). Feature-level
style operations (MixStyle, DSU, the FedDG methods' ops) are inserted after named stages with
:meth:`Backbone.insert_op` without editing the backbone; they run in training mode only.
Methods that need the features between stages call :meth:`Backbone.forward_stages` with a hook
(or :meth:`Backbone.forward_until` and :meth:`Backbone.forward_from`). Between the backbone and the
linear head sits a replaceable :class:`Neck` (default: the backbone's pooling).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from fedstyle.errors import ConfigError

#: How a classifier's BatchNorm layers train (:meth:`Classifier.set_batchnorm`).
BATCHNORM_MODES = ("train", "eval", "frozen")

#: ``hook(stage_name, output) -> output`` called after each stage by :meth:`Backbone.forward_stages`
StageHook = Callable[[str, torch.Tensor], torch.Tensor]


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

    @property
    def out_channels(self) -> int:
        """Channels of the last stage's maps (a neck that pools them has this width): ``feature_dim`` for
        backbones that pool; the ConvNet, which flattens, overrides it."""
        return self.feature_dim

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
        return self.forward_stages(x)

    def forward_stages(self, x: torch.Tensor, hook: StageHook | None = None) -> torch.Tensor:
        """Run every stage (with its inserted ops); after each, ``x = hook(stage_name, x)``.

        The hook sees each stage's output with whatever the method holds in hand (labels, a
        received style) and may return a batch of another size (StableFDG appends oversampled
        features after ``layer1``); later stages run on what it returns. Returns the last maps.
        """
        for name in self.stage_names:
            x = self.after_stage(name, self.run_stage(name, x))
            if hook is not None:
                x = hook(name, x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.forward_maps(x))


class Neck(nn.Module):
    """What turns the last stage's maps (B, C, h, w) into the classifier's input (B, out_dim).

    The default, :class:`PooledNeck`, is the backbone's own pooling. A method replaces it with
    :meth:`Classifier.set_neck` (StableFDG's attention highlighter); a neck's parameters are part
    of the model's state and aggregated like every other weight. ``forward`` takes keyword
    arguments a method may pass in training (e.g. ``partner`` indices); at test time it gets none.
    """

    def out_dim(self, backbone: "Backbone") -> int:
        raise NotImplementedError

    def classify(self, head: nn.Module, maps: torch.Tensor) -> torch.Tensor:
        """The logits of ``model(x)``: ``head(self(maps))``. A stochastic neck overrides it to average
        predictions over samples of its representation (FedSR's Monte-Carlo prediction)."""
        return head(self(maps))


class PooledNeck(Neck):
    """The backbone's pooling: global average pooling (ResNets, EfficientNet), or the ConvNet's
    flatten of its last map (the Digits-DG layout: C x h x w features, no pooling)."""

    def __init__(self, backbone: "Backbone"):
        super().__init__()
        self._pool = backbone.pool  # a bound method: no parameters, no state keys

    def out_dim(self, backbone: "Backbone") -> int:
        return backbone.feature_dim

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return self._pool(maps)


class Classifier(nn.Module):
    """backbone -> neck -> linear head. ``features`` gives the neck's output (the representation).

    ``model(x) == model.head(model.neck(model.backbone.forward_maps(x)))`` (the neck's
    :meth:`Neck.classify`; only a neck that averages over samples at test time, FedSR's with
    ``predict=mc``, differs); a method that needs the pieces calls them in that order
    (``forward_stages`` for the backbone with a hook).
    Class activation maps: with the default neck of a pooling backbone the head's weights
    W (K x C) apply to every position, M_k = sum_c W[k, c] F[c]; on the ConvNet, which flattens,
    the head holds a weight per channel and position, W (K x C*h*w), so M_k[h, w] =
    sum_c W[k, (c, h, w)] F[c, h, w] (see :meth:`class_activation_maps`).
    """

    def __init__(self, backbone: Backbone, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.num_classes = int(num_classes)
        self.neck: Neck = PooledNeck(backbone)
        self.head = nn.Linear(backbone.feature_dim, num_classes)
        self.batchnorm = "train"
        #: FixBN's switch round (1-based; 0 = never) and whether the round being trained is past it
        self.batchnorm_fix_round = 0
        self._batchnorm_fixed = False

    def set_batchnorm(self, mode: str, momentum: float | None = None, fix_round: int = 0) -> None:
        """How BatchNorm layers behave in training, for fine-tuning a pretrained backbone.

        ``train`` (default): batch statistics, running statistics updated. ``eval``: BatchNorm
        stays in eval mode whatever ``model.train()`` says (the running statistics, ImageNet's for a
        pretrained backbone, normalise every batch and are never updated; the affine weight and bias
        still train): the usual choice for small batches, and the PARDON reference code's "frozen
        BatchNorm". ``frozen``: as ``eval``, and the affine parameters are fixed too.

        ``momentum`` (PyTorch's convention: running = (1 - momentum) * running + momentum * batch)
        replaces every BatchNorm layer's own; None keeps them (PyTorch's 0.1 for the ResNets and the
        ConvNet, TensorFlow's 0.01 for EfficientNet-Lite0). It matters in ``train`` mode only: with
        0.01 the running statistics that evaluation uses still hold 74 % of ImageNet's after 30 steps
        (0.99^30) while the weights have adapted to the batch statistics (docs/results/pretrained.md
        'Fine-tuning with batch statistics').

        ``fix_round`` R > 0 (``train`` mode only) is FixBN (Zhong, Chen & Chao, "Making Batch Normalization
        Great in Federated Deep Learning", ICML 2024, arXiv:2303.06530): batch statistics in rounds 1 .. R-1
        (their exploration phase), then, from round R on, every client normalises with the global model's
        running statistics, which stop updating (their calibration phase; the affine weights still train).
        Training then normalises as evaluation does; with one domain per client, plain ``train`` mode
        normalises each client's batch by its own domain's statistics while evaluation uses the clients'
        average, which no client trained with. The federation calls :meth:`enter_round` before a client
        trains.
        """
        if mode not in BATCHNORM_MODES:
            raise ConfigError(f"batchnorm must be one of {', '.join(BATCHNORM_MODES)}, got {mode!r}")
        if momentum is not None and not 0.0 < momentum <= 1.0:
            raise ConfigError(f"batchnorm momentum must be in (0, 1], got {momentum}")
        if fix_round < 0 or (fix_round > 0 and mode != "train"):
            raise ConfigError(f"batchnorm fix round must be >= 0 (0 = never) and needs batchnorm=train (it ends "
                              f"a phase of batch statistics), got {fix_round} with batchnorm={mode}")
        self.batchnorm = mode
        self.batchnorm_fix_round = int(fix_round)
        self._batchnorm_fixed = False
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.requires_grad_(mode != "frozen")
                if momentum is not None:
                    module.momentum = float(momentum)
        self.train(self.training)

    def enter_round(self, round_number: int) -> None:
        """Tell the model which round (1-based, as metrics.jsonl counts) a client trains: FixBN's switch
        (:meth:`set_batchnorm`'s ``fix_round``); takes effect at the next :meth:`train`."""
        self._batchnorm_fixed = 0 < self.batchnorm_fix_round <= round_number

    @property
    def uses_batch_statistics(self) -> bool:
        """Whether BatchNorm normalises a training batch by its own statistics (``train`` mode before any
        FixBN switch), or by the running ones (``eval``, ``frozen``, FixBN's calibration phase)."""
        return self.batchnorm == "train" and not self._batchnorm_fixed

    def train(self, mode: bool = True) -> "Classifier":
        super().train(mode)
        if mode and not self.uses_batch_statistics:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def set_neck(self, neck: Neck) -> None:
        """Replace the neck and build a fresh head for its output width."""
        self.neck = neck
        self.head = nn.Linear(neck.out_dim(self.backbone), self.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck(self.backbone.forward_maps(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck.classify(self.head, self.backbone.forward_maps(x))

    def class_activation_maps(self, maps: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """CAM of ``classes`` (B,) on the last stage's ``maps`` (B, C, h, w): (B, h, w), before any
        normalisation (Zhou et al. 2016; FedGCA Eq. 3: M = sum_l W_l F_l).

        Needs the default neck: for pooling backbones W is shared across positions; for the
        flattening ConvNet the head's per-position weights are used.
        """
        if not isinstance(self.neck, PooledNeck):
            raise ConfigError(f"class activation maps need the pooled neck; this model has {type(self.neck).__name__}")
        b, c, h, w = maps.shape
        weight = self.head.weight[classes]  # (B, in_features)
        if weight.shape[1] == c:
            return torch.einsum("bc,bchw->bhw", weight, maps)
        if weight.shape[1] == c * h * w:
            return (weight.view(b, c, h, w) * maps).sum(1)
        raise ConfigError(f"the head takes {weight.shape[1]} features, neither C = {c} (pooled) nor C*h*w = "
                          f"{c * h * w} (flattened): class activation maps are not defined for this backbone")

    def insert_ops(self, stages: Sequence[str], make_op) -> None:
        """Insert a fresh ``make_op()`` after each named stage."""
        for stage in stages:
            self.backbone.insert_op(stage, make_op())
