"""Backend ``adain``: the AdaIN network of Huang & Belongie (ICCV'17) with its public weights.

Encoder: VGG-19 "normalised" up to relu4_1 (512 channels, stride 8), fed RGB in [0, 1] without
ImageNet normalisation (its first 1x1 convolution does that). Decoder: the encoder's mirror image
(reflection padding, nearest-neighbour upsampling). Both are ``nn.Sequential`` with exactly the
layer lists of the public PyTorch port (naoto0804/pytorch-AdaIN, ``net.py``), so its release files
``vgg_normalised.pth`` (all 53 layers; layers after relu4_1, index 30, are accepted and dropped)
and ``decoder.pth`` load unchanged, as ``.pth`` or converted to ``.safetensors``.

No weights can be downloaded at run time; give their paths (``vgg_weights=``, ``decoder_weights=``)
or put them in ``<cache dir>/adain/``. The offline default backend is ``lite``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.models.resnet import check_state_dict, read_state_dict
from fedstyle.style.transfer.base import TRANSFER_BACKENDS
from fedstyle.style.transfer.feature_adain import FeatureAdaIN

RELEASE_URL = "https://github.com/naoto0804/pytorch-AdaIN/releases/download/v0.0.0"
VGG_FILE = "vgg_normalised.pth"
DECODER_FILE = "decoder.pth"
#: index of relu4_1 in the public 53-layer ``vgg`` list; the encoder is ``vgg[:RELU4_1 + 1]``
RELU4_1 = 30
# VGG-19 convolutions as (in, out) channels with "M" for a 2x2 max-pool (ceil mode), after the 1x1 input conv.
VGG_LAYOUT = (
    (3, 64), (64, 64), "M", (64, 128), (128, 128), "M", (128, 256), (256, 256), (256, 256), (256, 256), "M",
    (256, 512), (512, 512), (512, 512), (512, 512), "M", (512, 512), (512, 512), (512, 512), (512, 512),
)
# Decoder convolutions (in, out) with "U" for a 2x nearest upsampling; ReLU after every conv but the last.
DECODER_LAYOUT = (
    (512, 256), "U", (256, 256), (256, 256), (256, 256), (256, 128), "U", (128, 128), (128, 64), "U", (64, 64), (64, 3),
)


def vgg_normalised() -> nn.Sequential:
    """The public 53-layer ``vgg`` list (conv1x1, then [ReflectionPad, Conv3x3, ReLU] blocks and pools)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 3, (1, 1))]
    for item in VGG_LAYOUT:
        if item == "M":
            layers.append(nn.MaxPool2d((2, 2), (2, 2), (0, 0), ceil_mode=True))
        else:
            layers += [nn.ReflectionPad2d((1, 1, 1, 1)), nn.Conv2d(item[0], item[1], (3, 3)), nn.ReLU()]
    return nn.Sequential(*layers)


def adain_decoder() -> nn.Sequential:
    """The public ``decoder`` list: [ReflectionPad, Conv3x3, ReLU] blocks with nearest upsampling, no final ReLU."""
    layers: list[nn.Module] = []
    for item in DECODER_LAYOUT:
        if item == "U":
            layers.append(nn.Upsample(scale_factor=2, mode="nearest"))
        else:
            layers += [nn.ReflectionPad2d((1, 1, 1, 1)), nn.Conv2d(item[0], item[1], (3, 3)), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _layer_index(key: str) -> int:
    match = re.match(r"(\d+)\.", key)
    return int(match.group(1)) if match else -1


def load_public_weights(module: nn.Sequential, path: str | os.PathLike, required_upto: int | None = None) -> None:
    """Load a public AdaIN state dict into ``module`` after checking every key and shape.

    Keys of layers after ``required_upto`` may be missing (an encoder saved truncated at relu4_1).
    A missing, unexpected or mis-shaped key raises ConfigError naming the file and that key.
    """
    path = os.fspath(path)
    state = read_state_dict(path)
    expected = module.state_dict()
    is_encoder = required_upto is not None
    what = "the AdaIN VGG encoder (vgg_normalised.pth)" if is_encoder else "the AdaIN decoder (decoder.pth)"
    check_state_dict(state, expected, path, what,
                     may_be_missing=lambda key: required_upto is not None and _layer_index(key) > required_upto)
    module.load_state_dict(state, strict=False)


def find_weights(given: str | os.PathLike | None, filename: str, option: str) -> Path:
    """The weights file given, else ``<cache dir>/adain/<filename>``; a clear error when neither exists."""
    if given is not None:
        return Path(given)
    from fedstyle.data.cache import cache_dir

    default = cache_dir() / "adain" / filename
    if default.is_file():
        return default
    raise ConfigError(
        f"the adain backend needs the public AdaIN weights {filename}, which cannot be downloaded here: get "
        f"{RELEASE_URL}/{filename} on a machine with internet access and pass {option}=PATH (or put it at "
        f"{default}). The offline default backend `lite` needs no download."
    )


@TRANSFER_BACKENDS.register("adain")
class AdaINTransfer(FeatureAdaIN):
    """AdaIN with VGG-19 relu4_1 features (512 channels) and the public weights.

    Options: ``vgg_weights``, ``decoder_weights`` (paths; default ``<cache dir>/adain/``),
    ``device`` (auto), ``min_size`` (images with a shorter side below it are upsampled to it before
    encoding, 64 by default so that relu4_1 maps are at least 8 x 8), ``batch_size``.
    """

    name = "adain"

    def __init__(
        self,
        vgg_weights: str | os.PathLike | None = None,
        decoder_weights: str | os.PathLike | None = None,
        device: str | torch.device = "auto",
        min_size: int = 64,
        batch_size: int = 32,
    ):
        vgg_path = find_weights(vgg_weights, VGG_FILE, "vgg_weights")
        decoder_path = find_weights(decoder_weights, DECODER_FILE, "decoder_weights")
        vgg = vgg_normalised()
        load_public_weights(vgg, vgg_path, required_upto=RELU4_1)
        decoder = adain_decoder()
        load_public_weights(decoder, decoder_path)
        encoder = nn.Sequential(*list(vgg.children())[: RELU4_1 + 1])
        super().__init__(encoder, decoder, "vgg19_normalised.relu4_1", min_size, device, batch_size)
