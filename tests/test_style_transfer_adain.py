"""The `adain` backend: exactly the public pytorch-AdaIN layout, so vgg_normalised.pth / decoder.pth load unchanged."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from fedstyle.errors import ConfigError
from fedstyle.style.stats import adain
from fedstyle.style.transfer import TRANSFER_BACKENDS
from fedstyle.style.transfer.adain import RELU4_1, adain_decoder, vgg_normalised
from fedstyle.style.transfer.feature_adain import ADAIN_EPS

# Written from naoto0804/pytorch-AdaIN net.py: index in the nn.Sequential -> conv weight shape
# (every conv has a bias of shape (out,)). ReflectionPad / ReLU / MaxPool / Upsample hold no keys.
PUBLIC_VGG = {
    0: (3, 3, 1, 1), 2: (64, 3, 3, 3), 5: (64, 64, 3, 3), 9: (128, 64, 3, 3), 12: (128, 128, 3, 3),
    16: (256, 128, 3, 3), 19: (256, 256, 3, 3), 22: (256, 256, 3, 3), 25: (256, 256, 3, 3), 29: (512, 256, 3, 3),
    32: (512, 512, 3, 3), 35: (512, 512, 3, 3), 38: (512, 512, 3, 3), 42: (512, 512, 3, 3), 45: (512, 512, 3, 3),
    48: (512, 512, 3, 3), 51: (512, 512, 3, 3),
}
PUBLIC_DECODER = {
    1: (256, 512, 3, 3), 5: (256, 256, 3, 3), 8: (256, 256, 3, 3), 11: (256, 256, 3, 3), 14: (128, 256, 3, 3),
    18: (128, 128, 3, 3), 21: (64, 128, 3, 3), 25: (64, 64, 3, 3), 28: (3, 64, 3, 3),
}


def public_keys(table: dict[int, tuple]) -> dict[str, tuple]:
    keys = {}
    for index, shape in table.items():
        keys[f"{index}.weight"] = shape
        keys[f"{index}.bias"] = (shape[0],)
    return keys


def random_state(table: dict[int, tuple], upto: int | None = None) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in public_keys(table).items():
        if upto is None or int(key.split(".")[0]) <= upto:
            fan_in = max(1, int(torch.tensor(shape[1:]).prod())) if len(shape) > 1 else 1
            state[key] = torch.randn(shape, generator=generator) * (2.0 / fan_in) ** 0.5 if len(shape) > 1 else \
                torch.zeros(shape)
    return state


def test_layouts_match_the_public_networks():
    vgg, decoder = vgg_normalised(), adain_decoder()
    assert len(vgg) == 53 and isinstance(vgg[RELU4_1], torch.nn.ReLU) and vgg[RELU4_1 - 1].out_channels == 512
    assert {k: tuple(v.shape) for k, v in vgg.state_dict().items()} == public_keys(PUBLIC_VGG)
    assert {k: tuple(v.shape) for k, v in decoder.state_dict().items()} == public_keys(PUBLIC_DECODER)
    assert len(decoder) == 29 and isinstance(decoder[0], torch.nn.ReflectionPad2d)
    assert [type(m).__name__ for m in vgg[:8]] == ["Conv2d", "ReflectionPad2d", "Conv2d", "ReLU", "ReflectionPad2d",
                                                    "Conv2d", "ReLU", "MaxPool2d"]


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adain-weights")
    torch.save(random_state(PUBLIC_VGG, upto=RELU4_1), folder / "vgg_normalised.pth")  # truncated at relu4_1
    save_file(random_state(PUBLIC_DECODER), str(folder / "decoder.safetensors"))
    return folder / "vgg_normalised.pth", folder / "decoder.safetensors"


def test_public_files_load_and_transfer_runs(weight_files):
    vgg_path, decoder_path = weight_files
    backend = TRANSFER_BACKENDS.get("adain")(vgg_weights=vgg_path, decoder_weights=decoder_path, device="cpu")
    state = torch.load(vgg_path, weights_only=True)
    assert torch.equal(backend.encoder[2].weight, state["2.weight"])
    content = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    styles = backend.image_styles(content)
    assert styles.tensors["mean"].shape == (2, 512) and styles.encoder.startswith("vgg19_normalised.relu4_1@64:")
    out = backend.transfer(content, styles.select([1, 0]))
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.uint8
    # the AdaIN equation on the relu4_1 features: mean = mu_t, std = sigma_t * sqrt(var / (var + eps))
    features = backend.encode(content)
    mu_t, sigma_t = styles.tensors["mean"][[1, 0]], styles.tensors["std"][[1, 0]]
    restyled = adain(features, mu_t[..., None, None], sigma_t[..., None, None], eps=ADAIN_EPS)
    var, mean = torch.var_mean(restyled, dim=(2, 3), correction=0)
    content_var = torch.var(features, dim=(2, 3), correction=0)
    torch.testing.assert_close(mean, mu_t, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(var.sqrt(), sigma_t * (content_var / (content_var + ADAIN_EPS)).sqrt(), atol=1e-4,
                               rtol=1e-3)


def test_the_full_53_layer_vgg_file_loads(tmp_path):
    from fedstyle.style.transfer.adain import load_public_weights

    path = tmp_path / "vgg_normalised.pth"
    torch.save(random_state(PUBLIC_VGG), path)
    vgg = vgg_normalised()
    load_public_weights(vgg, path, required_upto=RELU4_1)
    assert torch.equal(vgg[51].weight, torch.load(path, weights_only=True)["51.weight"])


@pytest.mark.parametrize("damage, message", [
    ("drop", r"missing key '9\.weight'"),
    ("shape", r"key '9\.weight' has shape \(1,\)"),
    ("extra", r"unexpected key 'fc\.weight'"),
])
def test_wrong_weight_files_name_the_file_and_the_key(tmp_path, weight_files, damage, message):
    vgg_path, decoder_path = weight_files
    state = random_state(PUBLIC_VGG, upto=RELU4_1)
    if damage == "drop":
        del state["9.weight"]
    elif damage == "shape":
        state["9.weight"] = torch.zeros(1)
    else:
        state["fc.weight"] = torch.zeros(1)
    bad = tmp_path / "broken_vgg.pth"
    torch.save(state, bad)
    with pytest.raises(ConfigError, match=rf"broken_vgg\.pth.*{message}"):
        TRANSFER_BACKENDS.get("adain")(vgg_weights=bad, decoder_weights=decoder_path, device="cpu")


def test_decoder_file_given_for_the_encoder_is_refused(weight_files):
    vgg_path, decoder_path = weight_files
    with pytest.raises(ConfigError, match=r"decoder\.safetensors.*VGG encoder"):
        TRANSFER_BACKENDS.get("adain")(vgg_weights=decoder_path, decoder_weights=decoder_path, device="cpu")


def test_missing_weights_say_where_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path))
    with pytest.raises(ConfigError) as error:
        TRANSFER_BACKENDS.get("adain")(device="cpu")
    text = str(error.value)
    assert "https://github.com/naoto0804/pytorch-AdaIN/releases/download/v0.0.0/vgg_normalised.pth" in text
    assert "vgg_weights=PATH" in text and "`lite`" in text
