"""Backbones with named stages (see :mod:`fedstyle.models.base`) and the backbone registry."""

from fedstyle.models.base import Backbone, Classifier
from fedstyle.models.convnet import ConvNet
from fedstyle.models.efficientnet import EfficientNetLite0, efficientnet_lite0
from fedstyle.models.necks import GaussianNeck, ProjectionNeck, gaussian_kl
from fedstyle.models.registry import (
    BACKBONES,
    BackboneSpec,
    build_backbone,
    build_model,
    input_normalization,
    style_stages,
)
from fedstyle.models.resnet import ResNet, load_torchvision_weights, resnet18, resnet50

__all__ = [
    "BACKBONES",
    "Backbone",
    "BackboneSpec",
    "Classifier",
    "ConvNet",
    "EfficientNetLite0",
    "GaussianNeck",
    "ProjectionNeck",
    "ResNet",
    "build_backbone",
    "build_model",
    "efficientnet_lite0",
    "gaussian_kl",
    "input_normalization",
    "load_torchvision_weights",
    "resnet18",
    "resnet50",
    "style_stages",
]
