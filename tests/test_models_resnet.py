"""ResNet: torchvision-compatible names and shapes, initialisation, checkpoint loading and its errors."""

from __future__ import annotations

import functools
import math
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from fedstyle.errors import ConfigError
from fedstyle.models import ResNet, load_torchvision_weights, resnet18, resnet50

# torchvision.models.resnet18().state_dict(): names and shapes in order, written out from the
# architecture (conv1 7x7/2, bn1, 4 stages of 2 BasicBlocks, a 1x1/2 downsample conv+BN at the
# first block of layer2..4, fc 512->1000). 122 entries; the fedstyle backbone has all but fc.*.
TORCHVISION_RESNET18 = """
conv1.weight (64, 3, 7, 7)
bn1.weight (64,)
bn1.bias (64,)
bn1.running_mean (64,)
bn1.running_var (64,)
bn1.num_batches_tracked ()
layer1.0.conv1.weight (64, 64, 3, 3)
layer1.0.bn1.weight (64,)
layer1.0.bn1.bias (64,)
layer1.0.bn1.running_mean (64,)
layer1.0.bn1.running_var (64,)
layer1.0.bn1.num_batches_tracked ()
layer1.0.conv2.weight (64, 64, 3, 3)
layer1.0.bn2.weight (64,)
layer1.0.bn2.bias (64,)
layer1.0.bn2.running_mean (64,)
layer1.0.bn2.running_var (64,)
layer1.0.bn2.num_batches_tracked ()
layer1.1.conv1.weight (64, 64, 3, 3)
layer1.1.bn1.weight (64,)
layer1.1.bn1.bias (64,)
layer1.1.bn1.running_mean (64,)
layer1.1.bn1.running_var (64,)
layer1.1.bn1.num_batches_tracked ()
layer1.1.conv2.weight (64, 64, 3, 3)
layer1.1.bn2.weight (64,)
layer1.1.bn2.bias (64,)
layer1.1.bn2.running_mean (64,)
layer1.1.bn2.running_var (64,)
layer1.1.bn2.num_batches_tracked ()
layer2.0.conv1.weight (128, 64, 3, 3)
layer2.0.bn1.weight (128,)
layer2.0.bn1.bias (128,)
layer2.0.bn1.running_mean (128,)
layer2.0.bn1.running_var (128,)
layer2.0.bn1.num_batches_tracked ()
layer2.0.conv2.weight (128, 128, 3, 3)
layer2.0.bn2.weight (128,)
layer2.0.bn2.bias (128,)
layer2.0.bn2.running_mean (128,)
layer2.0.bn2.running_var (128,)
layer2.0.bn2.num_batches_tracked ()
layer2.0.downsample.0.weight (128, 64, 1, 1)
layer2.0.downsample.1.weight (128,)
layer2.0.downsample.1.bias (128,)
layer2.0.downsample.1.running_mean (128,)
layer2.0.downsample.1.running_var (128,)
layer2.0.downsample.1.num_batches_tracked ()
layer2.1.conv1.weight (128, 128, 3, 3)
layer2.1.bn1.weight (128,)
layer2.1.bn1.bias (128,)
layer2.1.bn1.running_mean (128,)
layer2.1.bn1.running_var (128,)
layer2.1.bn1.num_batches_tracked ()
layer2.1.conv2.weight (128, 128, 3, 3)
layer2.1.bn2.weight (128,)
layer2.1.bn2.bias (128,)
layer2.1.bn2.running_mean (128,)
layer2.1.bn2.running_var (128,)
layer2.1.bn2.num_batches_tracked ()
layer3.0.conv1.weight (256, 128, 3, 3)
layer3.0.bn1.weight (256,)
layer3.0.bn1.bias (256,)
layer3.0.bn1.running_mean (256,)
layer3.0.bn1.running_var (256,)
layer3.0.bn1.num_batches_tracked ()
layer3.0.conv2.weight (256, 256, 3, 3)
layer3.0.bn2.weight (256,)
layer3.0.bn2.bias (256,)
layer3.0.bn2.running_mean (256,)
layer3.0.bn2.running_var (256,)
layer3.0.bn2.num_batches_tracked ()
layer3.0.downsample.0.weight (256, 128, 1, 1)
layer3.0.downsample.1.weight (256,)
layer3.0.downsample.1.bias (256,)
layer3.0.downsample.1.running_mean (256,)
layer3.0.downsample.1.running_var (256,)
layer3.0.downsample.1.num_batches_tracked ()
layer3.1.conv1.weight (256, 256, 3, 3)
layer3.1.bn1.weight (256,)
layer3.1.bn1.bias (256,)
layer3.1.bn1.running_mean (256,)
layer3.1.bn1.running_var (256,)
layer3.1.bn1.num_batches_tracked ()
layer3.1.conv2.weight (256, 256, 3, 3)
layer3.1.bn2.weight (256,)
layer3.1.bn2.bias (256,)
layer3.1.bn2.running_mean (256,)
layer3.1.bn2.running_var (256,)
layer3.1.bn2.num_batches_tracked ()
layer4.0.conv1.weight (512, 256, 3, 3)
layer4.0.bn1.weight (512,)
layer4.0.bn1.bias (512,)
layer4.0.bn1.running_mean (512,)
layer4.0.bn1.running_var (512,)
layer4.0.bn1.num_batches_tracked ()
layer4.0.conv2.weight (512, 512, 3, 3)
layer4.0.bn2.weight (512,)
layer4.0.bn2.bias (512,)
layer4.0.bn2.running_mean (512,)
layer4.0.bn2.running_var (512,)
layer4.0.bn2.num_batches_tracked ()
layer4.0.downsample.0.weight (512, 256, 1, 1)
layer4.0.downsample.1.weight (512,)
layer4.0.downsample.1.bias (512,)
layer4.0.downsample.1.running_mean (512,)
layer4.0.downsample.1.running_var (512,)
layer4.0.downsample.1.num_batches_tracked ()
layer4.1.conv1.weight (512, 512, 3, 3)
layer4.1.bn1.weight (512,)
layer4.1.bn1.bias (512,)
layer4.1.bn1.running_mean (512,)
layer4.1.bn1.running_var (512,)
layer4.1.bn1.num_batches_tracked ()
layer4.1.conv2.weight (512, 512, 3, 3)
layer4.1.bn2.weight (512,)
layer4.1.bn2.bias (512,)
layer4.1.bn2.running_mean (512,)
layer4.1.bn2.running_var (512,)
layer4.1.bn2.num_batches_tracked ()
fc.weight (1000, 512)
fc.bias (1000,)"""


def reference_resnet18() -> list[tuple[str, tuple[int, ...]]]:
    entries = []
    for line in TORCHVISION_RESNET18.strip().splitlines():
        name, shape = line.split(" ", 1)
        entries.append((name, tuple(int(d) for d in shape.strip("()").split(",") if d.strip())))
    return entries


def test_resnet18_state_dict_is_torchvision_without_fc():
    reference = reference_resnet18()
    assert len(reference) == 122
    assert [name for name, _ in reference[-2:]] == ["fc.weight", "fc.bias"]
    ours = [(name, tuple(t.shape)) for name, t in resnet18().state_dict().items()]
    assert ours == reference[:-2]


def test_resnet50_state_dict_names_and_count():
    model = resnet50()
    state = model.state_dict()
    assert len(state) + 2 == 320  # torchvision's 320 entries include fc.weight and fc.bias
    assert sum(name.endswith("num_batches_tracked") for name in state) == 53  # 1 + 16*3 + 4 BNs
    expected_shapes = {
        "conv1.weight": (64, 3, 7, 7),
        "layer1.0.conv1.weight": (64, 64, 1, 1),
        "layer1.0.conv2.weight": (64, 64, 3, 3),
        "layer1.0.conv3.weight": (256, 64, 1, 1),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1),
        "layer1.0.downsample.1.running_var": (256,),
        "layer2.0.conv2.weight": (128, 128, 3, 3),
        "layer2.0.downsample.0.weight": (512, 256, 1, 1),
        "layer3.5.bn3.weight": (1024,),
        "layer4.2.conv3.weight": (2048, 512, 1, 1),
        "layer4.2.bn3.num_batches_tracked": (),
    }
    for name, shape in expected_shapes.items():
        assert tuple(state[name].shape) == shape, name
    assert "layer1.1.downsample.0.weight" not in state and "layer3.6.conv1.weight" not in state
    assert sum(t.numel() for t in model.parameters()) + 2048 * 1000 + 1000 == 25_557_032


def test_parameter_count_resnet18():
    # torchvision resnet18 has 11,689,512 parameters including fc (512*1000 + 1000).
    assert sum(p.numel() for p in resnet18().parameters()) == 11_689_512 - 513_000


def test_stage_shapes_and_feature_dim():
    torch.manual_seed(0)
    model = resnet18().eval()
    assert model.stage_names == ("stem", "layer1", "layer2", "layer3", "layer4")
    x = torch.randn(2, 3, 64, 64)
    shapes = {}
    for stage in model.stage_names:
        x = model.run_stage(stage, x)
        shapes[stage] = tuple(x.shape)
    assert shapes == {
        "stem": (2, 64, 16, 16),
        "layer1": (2, 64, 16, 16),
        "layer2": (2, 128, 8, 8),
        "layer3": (2, 256, 4, 4),
        "layer4": (2, 512, 2, 2),
    }
    assert model.feature_dim == 512 and model.pool(x).shape == (2, 512)
    big = resnet50().eval()
    assert big.feature_dim == 2048 and big(torch.randn(1, 3, 32, 32)).shape == (1, 2048)


def test_torchvision_initialisation():
    torch.manual_seed(0)
    model = resnet18()
    weight = model.layer4[0].conv2.weight
    fan_out = 512 * 3 * 3
    assert weight.std().item() == pytest.approx(math.sqrt(2.0 / fan_out), rel=0.03)
    assert weight.mean().abs().item() < 0.001
    stem = model.conv1.weight  # fan_out = 64 * 49
    assert stem.std().item() == pytest.approx(math.sqrt(2.0 / (64 * 49)), rel=0.05)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)


# -- checkpoint loading ----------------------------------------------------------------------
@functools.cache
def _checkpoint() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    source = resnet18()
    for buffer_name, buffer in source.named_buffers():
        if buffer_name.endswith("running_mean"):
            buffer.normal_()
    state = {k: v.clone() for k, v in source.state_dict().items()}
    state["fc.weight"] = torch.randn(1000, 512)
    state["fc.bias"] = torch.randn(1000)
    return state


def torchvision_style_checkpoint() -> dict[str, torch.Tensor]:
    """A resnet18 state dict with fc.* and non-default running means, as torchvision saves it."""
    return dict(_checkpoint())


def assert_same_state(model: ResNet, state: dict[str, torch.Tensor]) -> None:
    ours = model.state_dict()
    for key, value in state.items():
        if not key.startswith("fc."):
            assert torch.equal(ours[key], value), key


def test_round_trip_pth(tmp_path):
    state = torchvision_style_checkpoint()
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    torch.manual_seed(1)
    model = resnet18()
    assert not torch.equal(model.conv1.weight, state["conv1.weight"])
    assert load_torchvision_weights(model, path) is model
    assert_same_state(model, state)


def test_round_trip_wrapped_and_module_prefixed(tmp_path):
    state = torchvision_style_checkpoint()
    path = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, path)
    model = load_torchvision_weights(resnet18(), path)
    assert_same_state(model, state)


def test_round_trip_safetensors(tmp_path):
    state = torchvision_style_checkpoint()
    path = tmp_path / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    assert_same_state(load_torchvision_weights(resnet18(), path), state)


def test_checkpoint_without_num_batches_tracked_loads(tmp_path):
    # Checkpoints saved before PyTorch 0.4.1 have no num_batches_tracked counters.
    state = {k: v for k, v in torchvision_style_checkpoint().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "old.pth"
    torch.save(state, path)
    model = load_torchvision_weights(resnet18(), path)
    assert_same_state(model, state)
    assert model.bn1.num_batches_tracked.item() == 0


def test_inserted_style_ops_do_not_break_loading(tmp_path):
    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            return x

    state = torchvision_style_checkpoint()
    path = tmp_path / "r18.pth"
    torch.save(state, path)
    model = resnet18()
    model.insert_op("layer1", WithBuffer())
    assert_same_state(load_torchvision_weights(model, path), state)


def test_renamed_key_is_reported_with_file_and_key(tmp_path):
    state = torchvision_style_checkpoint()
    state["layer2.0.convX.weight"] = state.pop("layer2.0.conv1.weight")
    path = tmp_path / "renamed.pth"
    torch.save(state, path)
    with pytest.raises(ConfigError) as info:
        load_torchvision_weights(resnet18(), path)
    message = str(info.value)
    assert "renamed.pth" in message and "missing key 'layer2.0.conv1.weight'" in message


def test_unexpected_key_is_reported(tmp_path):
    state = torchvision_style_checkpoint()
    state["layer5.0.conv1.weight"] = torch.zeros(1)
    path = tmp_path / "extra.pth"
    torch.save(state, path)
    with pytest.raises(ConfigError, match=r"extra\.pth.*unexpected key 'layer5\.0\.conv1\.weight'"):
        load_torchvision_weights(resnet18(), path)


def test_wrong_shape_is_reported_with_both_shapes(tmp_path):
    state = torchvision_style_checkpoint()
    state["layer3.1.bn2.weight"] = torch.ones(128)
    path = tmp_path / "shape.pth"
    torch.save(state, path)
    with pytest.raises(ConfigError) as info:
        load_torchvision_weights(resnet18(), path)
    message = str(info.value)
    assert "shape.pth" in message and "'layer3.1.bn2.weight'" in message
    assert "(128,)" in message and "expected (256,)" in message


def test_resnet50_checkpoint_into_resnet18_fails(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "r50.pth"
    torch.save(resnet50().state_dict(), path)
    with pytest.raises(ConfigError, match=r"r50\.pth"):
        load_torchvision_weights(resnet18(), path)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_torchvision_weights(resnet18(), tmp_path / "nope.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="garbage.pth' is not a PyTorch .* or safetensors weights file"):
        load_torchvision_weights(resnet18(), garbage)
    not_a_state = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], not_a_state)
    with pytest.raises(ConfigError, match="does not hold a state dict"):
        load_torchvision_weights(resnet18(), not_a_state)


# -- issue 55 item 9: what is wrong with a --weights path, in one line --------------------------------
@pytest.mark.parametrize("make, said", [
    (lambda path: path.mkdir(), "is a directory"),
    (lambda path: os.mkfifo(path), r"is not a regular file \(a FIFO\)"),  # reading it would block forever
    (lambda path: path.symlink_to(path.parent / "gone.pth"), "is a broken symbolic link"),
], ids=["directory", "fifo", "broken-link"])
def test_a_weights_path_that_is_not_a_file_is_named_for_what_it_is(tmp_path, make, said):
    path = tmp_path / "weights.pth"
    make(path)
    with pytest.raises(ConfigError, match=said) as err:
        load_torchvision_weights(resnet18(), path)
    assert "does not exist" not in str(err.value) and "\n" not in str(err.value)


def _pickled_numpy(path):
    import numpy as np

    torch.save({"conv1.weight": np.zeros(3)}, path)


@pytest.mark.parametrize("write, detail", [
    (lambda path: path.write_bytes(bytes(range(256)) * 8), ""),  # garbage: an unknown pickle opcode
    (lambda path: path.write_bytes(b""), ""),
    (lambda path: path.write_bytes(b"hello, not a checkpoint"), ""),
    (lambda path: pickle.dump({"conv1.weight": [0.0]}, path.open("wb"), protocol=4), ""),  # a plain pickle
    (_pickled_numpy, "it pickles numpy"),  # a real torch.save file, holding other objects than tensors
], ids=["garbage", "empty", "text", "plain-pickle", "numpy-pickle"])
def test_a_file_that_is_not_weights_is_refused_in_one_line_without_torch_advice(tmp_path, write, detail, recwarn):
    # torch's own text is seven lines advising weights_only=False: loading so runs any code the file holds
    path = tmp_path / "weights.pth"
    write(path)
    with pytest.raises(ConfigError) as err:
        load_torchvision_weights(resnet18(), path)
    message = str(err.value)
    assert f"{str(path)!r} is not a PyTorch (torch.save) or safetensors weights file" in message
    assert detail in message and "\n" not in message and "weights_only" not in message
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no traceback chain to print either
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]  # nor torch's warning about the protocol
