"""ResNet-18/50 with torchvision's parameter names, so torchvision ImageNet checkpoints load as-is.

The backbone's state dict equals torchvision's ``resnet18()``/``resnet50()`` state dict without
``fc.weight``/``fc.bias`` (the classifier head lives in :class:`fedstyle.models.base.Classifier`).
Bottleneck puts the stride on the 3x3 convolution (ResNet v1.5), as torchvision does.
The ImageNet checkpoints expect RGB in [0, 1] normalised with ``IMAGENET_MEAN``/``IMAGENET_STD``.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from typing import Callable, Mapping

import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.io import not_a_readable_file
from fedstyle.models.base import Backbone, kaiming_init

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Official torchvision ImageNet weights (IMAGENET1K_V1); fedstyle never downloads them itself.
RESNET18_URL = "https://download.pytorch.org/models/resnet18-f37072fd.pth"
RESNET50_URL = "https://download.pytorch.org/models/resnet50-0676ba61.pth"


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(Backbone):
    """ResNet backbone; stages ``stem`` (conv1, bn1, relu, maxpool) and ``layer1`` .. ``layer4``."""

    stage_names = ("stem", "layer1", "layer2", "layer3", "layer4")

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: tuple[int, int, int, int]):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.feature_dim = 512 * block.expansion
        self.reset_parameters()

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride), nn.BatchNorm2d(planes * block.expansion)
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def reset_parameters(self) -> None:
        """torchvision's initialisation: Kaiming normal (fan_out) convolutions, BN weight 1, bias 0."""
        kaiming_init(self)

    def run_stage(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "stem":
            return self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return getattr(self, name)(x)


def resnet18() -> ResNet:
    return ResNet(BasicBlock, (2, 2, 2, 2))


def resnet50() -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3))


# -- checkpoints -------------------------------------------------------------------------------
def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a ``.pth``/``.pt`` (torch.save) or ``.safetensors`` file, on the CPU.

    Unwraps ``{"state_dict": ...}`` and strips the ``module.`` prefix of DataParallel checkpoints.
    """
    path = os.fspath(path)
    problem = not_a_readable_file(path)
    if problem:
        raise ConfigError(f"weights file {path!r} {problem}; pass the path of a downloaded checkpoint")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            raw: object = load_file(path, device="cpu")
        else:
            with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: the error below says it
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt file, wrong format, pickled non-tensor objects
        raise ConfigError(f"weights file {path!r} is not a PyTorch (torch.save) or safetensors weights file"
                          f"{_why_unreadable(exc)}") from None
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    if not isinstance(raw, Mapping) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        raise ConfigError(f"weights file {path!r} does not hold a state dict (a mapping of names to tensors)")
    return {(k[len("module.") :] if k.startswith("module.") else k): v for k, v in raw.items()}


def _why_unreadable(exc: Exception) -> str:
    """What torch or safetensors found wrong with a weights file, as ``": ..."`` on one line (or "").

    Never torch's own text for a pickle that its safe loader refuses: seven lines that advise loading
    with ``weights_only=False``, which runs any code the file holds. A file that pickles other objects
    than tensors is named by the first such object, with how to save the tensors alone."""
    text = str(exc)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return (f": it pickles {found.group(1)}, not only tensors (fedstyle loads tensors alone, never code); "
                "save the state dict alone: torch.save(model.state_dict(), PATH)")
    if isinstance(exc, (pickle.UnpicklingError, KeyError, EOFError)) or "weights_only" in text:
        return ""  # garbage (a KeyError: an unknown pickle opcode), an empty file, torch's advice: nothing to add
    first = text.strip().splitlines()[0].split(". ")[0] if text.strip() else ""
    return f" ({first[:160]})" if first else ""


def check_state_dict(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    what: str,
    may_be_missing: Callable[[str], bool] = lambda key: False,
) -> None:
    """Raise ConfigError naming the file and the first key of ``state`` that does not match ``expected``.

    A key of ``expected`` absent from ``state`` is an error unless ``may_be_missing(key)``; a key of
    ``state`` absent from ``expected``, or of another shape, always is. ``what`` names the network.
    """
    path = os.fspath(path)
    for key in expected:
        if key not in state and not may_be_missing(key):
            raise ConfigError(f"weights file {path!r} does not match {what}: missing key {key!r} "
                              f"(is it a checkpoint of this architecture?)")
    for key, tensor in state.items():
        if key not in expected:
            raise ConfigError(f"weights file {path!r} does not match {what}: unexpected key {key!r}")
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise ConfigError(f"weights file {path!r} does not match {what}: key {key!r} has shape "
                              f"{tuple(tensor.shape)}, expected {tuple(expected[key].shape)}")


def load_matching_state_dict(
    backbone: Backbone, state: Mapping[str, torch.Tensor], path: str | os.PathLike, ignore_prefixes: tuple[str, ...]
) -> None:
    """Copy ``state`` into ``backbone`` after checking that names and shapes match exactly.

    Keys under ``ignore_prefixes`` (a classifier head) are dropped. BatchNorm ``num_batches_tracked``
    counters may be absent (checkpoints saved before PyTorch 0.4.1 lack them); they are then reset
    to 0. Any other missing or unexpected key, or a shape mismatch, raises ConfigError naming the
    file and the first offending key.
    """
    state = {k: v for k, v in state.items() if not k.startswith(ignore_prefixes)}
    # Style ops inserted into the backbone are not part of any checkpoint.
    expected = {k: v for k, v in backbone.state_dict().items() if not k.startswith("stage_ops.")}
    check_state_dict(state, expected, path, type(backbone).__name__,
                     may_be_missing=lambda key: key.endswith("num_batches_tracked"))
    full = dict(state)
    for key, value in expected.items():
        full.setdefault(key, torch.zeros_like(value))  # only num_batches_tracked can be missing here
    backbone.load_state_dict(full, strict=False)


def load_torchvision_weights(backbone: ResNet, path: str | os.PathLike) -> ResNet:
    """Load a torchvision ResNet checkpoint (``.pth`` or ``.safetensors``) into ``backbone``; ``fc.*`` is ignored."""
    load_matching_state_dict(backbone, read_state_dict(path), path, ignore_prefixes=("fc.",))
    return backbone
