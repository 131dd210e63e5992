"""The small Digits-DG CNN: four blocks of conv3x3(64)-[BN]-ReLU-maxpool2, flattened.

The architecture of Zhou et al. (DDAIG, AAAI'20), used for Digits-DG by MixStyle and StableFDG
through Dassl's ``cnn_digitsdg``. Dassl's version has no BatchNorm and biased convolutions;
``batch_norm=False`` reproduces it exactly, ``batch_norm=True`` (the default here) adds BN after
each convolution (bias-free convolutions then, since BN's shift makes a bias redundant).
"""

from __future__ import annotations

import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.models.base import Backbone


def conv_block(in_channels: int, out_channels: int, batch_norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=not batch_norm)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(out_channels))
    layers += [nn.ReLU(inplace=True), nn.MaxPool2d(2)]
    return nn.Sequential(*layers)


class ConvNet(Backbone):
    """Digits-DG CNN; the representation is the flattened last map (64 x 2 x 2 = 256 at 32 x 32)."""

    stage_names = ("layer1", "layer2", "layer3", "layer4")

    def __init__(self, input_size: int = 32, channels: int = 64, batch_norm: bool = True):
        super().__init__()
        if input_size < 16:
            raise ConfigError(f"ConvNet needs input_size >= 16 (four 2x2 max-pools), got {input_size}")
        self.input_size = int(input_size)
        self.layer1 = conv_block(3, channels, batch_norm)
        self.layer2 = conv_block(channels, channels, batch_norm)
        self.layer3 = conv_block(channels, channels, batch_norm)
        self.layer4 = conv_block(channels, channels, batch_norm)
        side = self.input_size
        for _ in self.stage_names:
            side //= 2  # MaxPool2d(2) floors odd sizes
        self.feature_dim = channels * side * side
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Dassl's init_network_weights(init_type="kaiming"): fan_in Kaiming normal, zero biases.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    @property
    def out_channels(self) -> int:
        """Channels of the last map (64), not the flattened ``feature_dim`` (C x h x w)."""
        return int(self.layer4[0].out_channels)

    def run_stage(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "layer1":
            if x.shape[-2:] != (self.input_size, self.input_size):
                raise ConfigError(
                    f"ConvNet was built for {self.input_size}x{self.input_size} inputs but got "
                    f"{x.shape[-2]}x{x.shape[-1]}; resize the images or build it with input_size={x.shape[-1]}"
                )
            # channels-last activations (NHWC): every later map inherits the layout from its input, and
            # oneDNN's convolutions, BatchNorm and max-pooling skip their NCHW reorders (one CPU thread:
            # benchmarks/convnet_layout.py). The values are the same: the learning check's runs gave its
            # fixture's late losses to the last digit. The weights keep their layout (checkpoints,
            # averaging and Flower's arrays see plain contiguous tensors). Not under torch.func.vmap (batched
            # clients), which cannot query a memory format.
            if not torch._C._functorch.is_functorch_wrapped_tensor(x):
                x = x.contiguous(memory_format=torch.channels_last)
        return getattr(self, name)(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Flatten (no pooling): the Digits-DG network keeps the spatial layout of the last map."""
        return torch.flatten(x, 1)
