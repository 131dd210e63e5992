"""ConvNet, stage slots shared by all backbones, and the backbone registry."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.models import (
    BACKBONES,
    Classifier,
    ConvNet,
    build_backbone,
    build_model,
    input_normalization,
    style_stages,
)
from fedstyle.models.resnet import RESNET18_URL, RESNET50_URL, resnet18
from fedstyle.style import STYLE_OPS


class CallRecorder(nn.Module):
    """A style op that records the shapes it was called with and adds a marker."""

    def __init__(self, marker: float = 0.0):
        super().__init__()
        self.calls: list[tuple[int, ...]] = []
        self.marker = marker

    def forward(self, x):
        self.calls.append(tuple(x.shape))
        return x + self.marker


# -- ConvNet -----------------------------------------------------------------------------------
def test_convnet_shapes_and_feature_dim():
    torch.manual_seed(0)
    model = ConvNet(input_size=32).eval()
    assert model.stage_names == ("layer1", "layer2", "layer3", "layer4")
    x = torch.randn(3, 3, 32, 32)
    assert [tuple(model.forward_until(x, s).shape) for s in model.stage_names] == [
        (3, 64, 16, 16),
        (3, 64, 8, 8),
        (3, 64, 4, 4),
        (3, 64, 2, 2),
    ]
    assert model.feature_dim == 256
    out = model(x)
    assert out.shape == (3, 256)
    torch.testing.assert_close(out, model.forward_maps(x).flatten(1))  # flattened, not pooled


@pytest.mark.parametrize("size, dim", [(28, 64), (64, 1024), (16, 64), (33, 256)])
def test_convnet_feature_dim_follows_input_size(size, dim):
    model = ConvNet(input_size=size).eval()
    assert model.feature_dim == dim
    assert model(torch.zeros(2, 3, size, size)).shape == (2, dim)


def test_convnet_rejects_other_input_sizes():
    with pytest.raises(ConfigError, match="built for 32x32.*input_size=28"):
        ConvNet(input_size=32)(torch.zeros(1, 3, 28, 28))
    with pytest.raises(ConfigError, match=">= 16"):
        ConvNet(input_size=8)


def test_convnet_layers_with_and_without_batch_norm():
    with_bn = ConvNet()
    assert [type(m).__name__ for m in with_bn.layer1] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    assert with_bn.layer1[0].bias is None
    dassl = ConvNet(batch_norm=False)
    assert [type(m).__name__ for m in dassl.layer1] == ["Conv2d", "ReLU", "MaxPool2d"]
    # Dassl cnn_digitsdg: 4 biased 3x3 convolutions with 64 filters.
    assert sum(p.numel() for p in dassl.parameters()) == (3 * 9 * 64 + 64) + 3 * (64 * 9 * 64 + 64)


# -- stage slots (Backbone API) on the concrete backbones ------------------------------------------
BACKBONE_FACTORIES = {
    "convnet": lambda: ConvNet(input_size=32),
    "resnet18": resnet18,
}


@pytest.mark.parametrize("name", sorted(BACKBONE_FACTORIES))
def test_inserted_op_runs_in_training_only(name):
    torch.manual_seed(0)
    model = BACKBONE_FACTORIES[name]()
    recorder = CallRecorder()
    model.insert_op("layer2", recorder)
    x = torch.randn(2, 3, 32, 32)
    model.train()
    model(x)
    assert len(recorder.calls) == 1 and recorder.calls[0][1] in (64, 128)
    model.eval()
    model(x)
    assert len(recorder.calls) == 1
    assert not any(key.startswith("stage_ops") for key in model.state_dict())  # the recorder has no state


@pytest.mark.parametrize("name", sorted(BACKBONE_FACTORIES))
def test_inserted_op_changes_the_training_output(name):
    torch.manual_seed(0)
    model = BACKBONE_FACTORIES[name]().train()
    x = torch.randn(2, 3, 32, 32)
    plain = model(x)
    model.insert_op("layer1", CallRecorder(marker=1.0))
    assert not torch.allclose(model(x), plain)


@pytest.mark.parametrize("name", sorted(BACKBONE_FACTORIES))
def test_forward_until_and_from_compose_to_forward(name):
    torch.manual_seed(0)
    model = BACKBONE_FACTORIES[name]().eval()
    x = torch.randn(2, 3, 32, 32)
    full = model.forward_maps(x)
    for stage in model.stage_names:
        torch.testing.assert_close(model.forward_from(model.forward_until(x, stage), stage), full)
    torch.testing.assert_close(model.pool(full), model(x))


def test_unknown_stage_is_a_config_error():
    with pytest.raises(ConfigError, match="no stage 'layer5'"):
        resnet18().insert_op("layer5", CallRecorder())


# -- registry ----------------------------------------------------------------------------------
def test_registry_names():
    assert BACKBONES.names() == ["cnn_digitsdg", "convnet", "efficientnet_lite0", "resnet18", "resnet50"]
    with pytest.raises(UnknownNameError, match="resnet18"):
        build_backbone("vgg16", 224)


def test_a_backbone_registered_for_a_while_builds_and_is_gone_after():
    """The learning check's narrow ConvNet (tests/learning.py check_backbone) through Registry.unregister."""
    from learning import WIDTH, check_backbone

    with check_backbone():
        model = build_model(f"convnet_{WIDTH}ch", num_classes=10, input_size=32)
        assert model.backbone.out_channels == WIDTH and model.backbone.feature_dim == WIDTH * 2 * 2
    assert f"convnet_{WIDTH}ch" not in BACKBONES
    assert BACKBONES.names() == ["cnn_digitsdg", "convnet", "efficientnet_lite0", "resnet18", "resnet50"]
    with pytest.raises(UnknownNameError, match="convnet"):
        BACKBONES.unregister("vgg16")


@pytest.mark.parametrize("name, size, dim", [("convnet", 32, 256), ("cnn_digitsdg", 32, 256), ("resnet18", 32, 512)])
def test_build_model(name, size, dim):
    torch.manual_seed(0)
    model = build_model(name, num_classes=7, input_size=size)
    assert isinstance(model, Classifier)
    assert model.backbone.feature_dim == dim and model.head.in_features == dim
    model.eval()
    assert model(torch.randn(2, 3, size, size)).shape == (2, 7)


@pytest.mark.parametrize("name", ["convnet", "cnn_digitsdg", "resnet18", "resnet50", "efficientnet_lite0"])
def test_style_stages_exist_and_accept_style_ops(name):
    stages = style_stages(name)
    assert stages == ("layer1", "layer2", "layer3")
    backbone = build_backbone(name, 32)
    assert set(stages) <= set(backbone.stage_names)
    for stage in stages:
        backbone.insert_op(stage, STYLE_OPS.get("mixstyle")(p=1.0))
    backbone.train()
    out = backbone(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, backbone.feature_dim) and torch.isfinite(out).all()


def test_pretrained_resnet_without_weights_names_the_file_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty torch hub cache
    with pytest.raises(ConfigError) as info:
        build_backbone("resnet18", 224, pretrained=True)
    assert "resnet18-f37072fd.pth" in str(info.value) and RESNET18_URL in str(info.value)
    with pytest.raises(ConfigError, match="resnet50-0676ba61.pth"):
        build_backbone("resnet50", 224, pretrained=True)
    assert RESNET50_URL == "https://download.pytorch.org/models/resnet50-0676ba61.pth"


def test_resnet_weights_path_is_loaded(tmp_path):
    torch.manual_seed(5)
    state = resnet18().state_dict()
    path = tmp_path / "r18.pth"
    torch.save(state, path)
    model = build_model("resnet18", num_classes=3, input_size=64, pretrained=True, weights=path)
    assert torch.equal(model.backbone.layer3[1].conv2.weight, state["layer3.1.conv2.weight"])


def test_convnet_has_no_pretrained_weights():
    with pytest.raises(ConfigError, match="no pretrained weights"):
        build_backbone("convnet", 32, pretrained=True)


@pytest.mark.parametrize("kwargs", [{"input_size": 0}, {"num_classes": 1}])
def test_build_model_rejects_bad_sizes(kwargs):
    args = {"backbone_name": "convnet", "num_classes": 10, "input_size": 32} | kwargs
    with pytest.raises(ConfigError):
        build_model(**args)


def test_input_normalization():
    assert input_normalization("resnet50") == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    mean, std = input_normalization("efficientnet_lite0")
    assert mean == pytest.approx((127 / 255,) * 3) and std == pytest.approx((128 / 255,) * 3)
    assert input_normalization("convnet") is None
