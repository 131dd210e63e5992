"""Backbones with named stages (see :mod:`fedstyle.models.base`) and the backbone registry."""

from fedstyle.models.attention import AttentionNeck, same_class_partners
from fedstyle.models.base import Backbone, Classifier, Neck, PooledNeck
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
    "AttentionNeck",
    "BACKBONES",
    "Backbone",
    "BackboneSpec",
    "Classifier",
    "ConvNet",
    "EfficientNetLite0",
    "GaussianNeck",
    "ProjectionNeck",
    "Neck",
    "PooledNeck",
    "ResNet",
    "build_backbone",
    "build_model",
    "efficientnet_lite0",
    "gaussian_kl",
    "input_normalization",
    "load_torchvision_weights",
    "resnet18",
    "resnet50",
    "same_class_partners",
    "style_stages",
]
