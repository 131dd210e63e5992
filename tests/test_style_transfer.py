"""Image style transfer: the shared encoder -> AdaIN -> decoder base, the offline `lite` backend, demo and CLI.

Most equations are checked on a backend whose encoder and decoder are identities, so "features" are
the pixels themselves and every expected value can be computed by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.style.stats import adain
from fedstyle.style.transfer import DEFAULT_BACKEND, TRANSFER_BACKENDS, FeatureAdaIN, Style, StyleMismatchError
from fedstyle.style.transfer.feature_adain import ADAIN_EPS, module_fingerprint


class PixelAdaIN(FeatureAdaIN):
    """Identity encoder and decoder: AdaIN directly on pixel values in [0, 1]."""

    name = "pixel"

    def __init__(self, min_size: int = 1, batch_size: int = 128):
        super().__init__(nn.Identity(), nn.Identity(), "identity", min_size, "cpu", batch_size)

    def style(self, mean, std) -> Style:
        return Style(self.name, self.encoder_id, {"mean": torch.tensor([mean]), "std": torch.tensor([std])})


def image(values, channels: int = 3) -> torch.Tensor:
    """One uint8 image (1, channels, 2, 2) with the same 2 x 2 values in every channel."""
    return torch.tensor(values, dtype=torch.uint8).view(1, 1, 2, 2).repeat(1, channels, 1, 1)


def test_fingerprint_tells_apart_encoders_that_differ_only_in_a_layer_without_weights():
    """An encoder and the same encoder with a final ReLU share every weight but not their features (PARDON's [:-1]
    cut): their cached styles must not be shared, so their fingerprints differ (issue 49)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    cut, full = nn.Sequential(conv), nn.Sequential(conv, nn.ReLU())
    assert cut.state_dict().keys() == full.state_dict().keys()  # the same weights ...
    assert module_fingerprint(cut) != module_fingerprint(full)  # ... another structure
    assert module_fingerprint(full) == module_fingerprint(nn.Sequential(conv, nn.ReLU()))  # stable for one structure
    other = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    assert module_fingerprint(other) != module_fingerprint(full)  # other weights


def test_transfer_matches_hand_computed_adain():
    # content x = (0, 51, 102, 153) / 255 = (0, .2, .4, .6): mu = .3, var = .05; target mu = .5, sigma = .1
    # out = .5 + .1 (x - .3) / sqrt(.05 + 1e-5) = .5 + (-.134151, -.044717, .044717, .134151)
    # * 255 = 93.29, 116.10, 138.90, 161.71 -> rounded to uint8
    backend = PixelAdaIN()
    out = backend.transfer(image([[0, 51], [102, 153]]), backend.style([0.5] * 3, [0.1] * 3))
    assert out.dtype == torch.uint8
    assert out[0, 0].tolist() == [[93, 116], [139, 162]]
    assert torch.equal(out[0, 0], out[0, 2])


def test_adain_output_has_the_target_channel_statistics():
    features = torch.randn(2, 5, 6, 7) * 3 + 1
    mu_t, sigma_t = torch.rand(2, 5, 1, 1), torch.rand(2, 5, 1, 1) + 0.5
    out = adain(features, mu_t, sigma_t, eps=ADAIN_EPS)
    var, mean = torch.var_mean(out, dim=(2, 3), keepdim=True, correction=0)
    torch.testing.assert_close(mean, mu_t, atol=1e-5, rtol=0)
    torch.testing.assert_close(var.sqrt(), sigma_t, atol=1e-4, rtol=1e-4)


def test_image_styles_are_per_image_channel_moments():
    backend = PixelAdaIN()
    styles = backend.image_styles(torch.cat([image([[0, 51], [102, 153]]), image([[255, 255], [0, 0]])]))
    assert styles.tensors["mean"].shape == (2, 3)
    torch.testing.assert_close(styles.tensors["mean"][:, 0], torch.tensor([0.3, 0.5]))
    torch.testing.assert_close(styles.tensors["std"][:, 0], torch.tensor([math.sqrt(0.05 + ADAIN_EPS),
                                                                           math.sqrt(0.25 + ADAIN_EPS)]))


def test_dataset_style_streams_the_moments_of_all_pixels():
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (n, 3, 4, 5), dtype=torch.uint8, generator=generator) for n in (3, 1, 6)]
    backend = PixelAdaIN(batch_size=2)  # chunks inside batches as well
    style = backend.dataset_style(iter(batches))  # a generator: one pass, nothing kept
    pixels = torch.cat(batches).double() / 255.0
    var, mean = torch.var_mean(pixels, dim=(0, 2, 3), correction=0)
    assert len(style) == 1
    torch.testing.assert_close(style.tensors["mean"][0], mean.float())
    torch.testing.assert_close(style.tensors["std"][0], (var + ADAIN_EPS).sqrt().float())


def test_dataset_style_of_nothing_is_refused():
    with pytest.raises(StyleMismatchError, match="no images"):
        PixelAdaIN().dataset_style([])


def test_alpha_interpolates_features_and_zero_reconstructs():
    backend = PixelAdaIN()
    content = image([[0, 51], [102, 153]])
    style = backend.style([0.5] * 3, [0.1] * 3)
    assert torch.equal(backend.transfer(content, style, alpha=0.0), content)
    half = backend.transfer(content, style, alpha=0.5)
    full = backend.transfer(content, style, alpha=1.0).float()
    expected = ((0.5 * full / 255 + 0.5 * content.float() / 255) * 255)
    assert (half.float() - expected).abs().max() <= 1.0  # both sides rounded to uint8
    with pytest.raises(ConfigError, match="alpha"):
        backend.transfer(content, style, alpha=1.5)


def test_one_style_per_image_or_one_for_all():
    backend = PixelAdaIN()
    content = torch.cat([image([[0, 51], [102, 153]])] * 3)
    bank = Style.concat([backend.style([0.2] * 3, [0.1] * 3), backend.style([0.8] * 3, [0.1] * 3),
                         backend.style([0.5] * 3, [0.1] * 3)])
    out = backend.transfer(content, bank)
    torch.testing.assert_close(out.float().mean(dim=(1, 2, 3)) / 255, torch.tensor([0.2, 0.8, 0.5]), atol=0.005,
                               rtol=0)
    with pytest.raises(StyleMismatchError, match="one style for all 3"):
        backend.transfer(content, bank.select([0, 1]))


def test_styles_of_another_backend_or_encoder_are_refused():
    backend = PixelAdaIN()
    content = image([[0, 51], [102, 153]])
    for backend_name, encoder in (("fft", backend.encoder_id), ("pixel", "identity@2:000000000000")):
        foreign = Style(backend_name, encoder, {"mean": torch.zeros(1, 3), "std": torch.ones(1, 3)})
        with pytest.raises(StyleMismatchError, match="cannot use a style made by"):
            backend.transfer(content, foreign)
    # min_size changes the features, so it is part of the encoder id
    assert PixelAdaIN(min_size=8).encoder_id != backend.encoder_id


def test_grayscale_content_becomes_three_channels():
    backend = PixelAdaIN()
    style = backend.style([0.5, 0.4, 0.3], [0.1, 0.1, 0.1])
    grey = image([[0, 51], [102, 153]], channels=1)
    out = backend.transfer(grey, style)
    assert out.shape == (1, 3, 2, 2)
    assert torch.equal(out, backend.transfer(grey.repeat(1, 3, 1, 1), style))
    assert backend.image_styles(grey).tensors["mean"].shape == (1, 3)


def test_small_images_are_upsampled_for_the_encoder_and_resized_back():
    backend = PixelAdaIN(min_size=8)
    content = torch.randint(0, 256, (2, 3, 4, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert backend.prepare(content).shape == (2, 3, 8, 12)  # shorter side to min_size, aspect kept
    out = backend.transfer(content, backend.style([0.5] * 3, [0.2] * 3))
    assert out.shape == content.shape
    # alpha = 0 with identity nets: upsample then antialiased downsample returns about the content
    assert (backend.transfer(content, backend.style([0.5] * 3, [0.2] * 3), alpha=0.0).int() - content.int()).abs(
    ).float().mean() < 40


def test_zero_variance_channels_give_no_nan():
    backend = PixelAdaIN()
    flat = image([[7, 7], [7, 7]])
    style = backend.dataset_style([flat])
    torch.testing.assert_close(style.tensors["std"], torch.full((1, 3), math.sqrt(ADAIN_EPS)))
    out = backend.transfer(flat, backend.style([0.5] * 3, [0.3] * 3))
    assert torch.equal(out, torch.full_like(out, 128))  # the constant mu_t = 0.5 -> 127.5 -> 128
    assert not torch.isnan(backend.image_styles(flat).tensors["std"]).any()


def test_bad_images_get_a_clear_error():
    backend = PixelAdaIN()
    with pytest.raises(ConfigError, match="uint8"):
        backend.image_styles(torch.rand(1, 3, 4, 4))
    with pytest.raises(ConfigError, match=r"\(B, 3, H, W\)"):
        backend.image_styles(torch.zeros(1, 4, 4, 4, dtype=torch.uint8))


# -- the lite backend -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lite():
    return TRANSFER_BACKENDS.get(DEFAULT_BACKEND)(device="cpu")


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory):
    from fedstyle.data.digits4 import load_digits4

    mp = pytest.MonkeyPatch()
    mp.setenv("FEDSTYLE_CACHE", str(tmp_path_factory.mktemp("digits4-style-cache")))
    yield load_digits4(per_class=3, progress=False)
    mp.undo()


def test_default_backend_is_the_shipped_lite_decoder(lite):
    from fedstyle.style.transfer.lite import SHIPPED_DECODER

    assert DEFAULT_BACKEND == "lite" and SHIPPED_DECODER.is_file()
    assert SHIPPED_DECODER.stat().st_size < 2_100_000
    assert lite.metadata["command"].startswith("fedstyle style train-decoder")
    assert lite.encoder_id.startswith(f"efficientnet_lite0.{lite.metadata['stage']}@{lite.min_size}:")


def test_shipped_decoder_is_what_the_default_command_trains(lite):
    from dataclasses import asdict

    from fedstyle.style.transfer.decoder_training import DecoderTrainingConfig

    defaults = DecoderTrainingConfig()
    assert lite.metadata["command"] == defaults.command()
    assert {k: lite.metadata[k] for k in ("stage", "width", "image_size", "steps", "seed")} == {
        k: str(v) for k, v in asdict(defaults).items() if k in ("stage", "width", "image_size", "steps", "seed")}
    assert lite.min_size == defaults.image_size


def test_style_distance_by_hand():
    from fedstyle.style.transfer.quality import style_distance

    a = Style("lite", "e", {"mean": torch.tensor([[0.0, 0.0], [1.0, 1.0]]), "std": torch.tensor([[1.0, 1.0]] * 2)})
    b = Style("lite", "e", {"mean": torch.tensor([[3.0, 4.0]]), "std": torch.tensor([[1.0, 2.0]])})
    # ||(3, 4)|| + ||(0, 1)|| = 5 + 1;  ||(2, 3)|| + 1 = sqrt(13) + 1
    torch.testing.assert_close(style_distance(a, b), torch.tensor([6.0, math.sqrt(13) + 1]))
    with pytest.raises(StyleMismatchError):
        style_distance(a, Style("fft", "e", b.tensors))


def test_lite_really_moves_the_style(lite, small_digits):
    """Criterion (a) on a few digits: 6 images per domain restyled to each other domain's overall style."""
    from fedstyle.style.transfer.quality import style_distance

    before, after = [], []
    for target in small_digits.domains:
        style = lite.dataset_style([small_digits.images[target]])
        content = torch.cat([small_digits.images[d][:6] for d in small_digits.domains if d != target])
        before.append(style_distance(lite.image_styles(content), style))
        after.append(style_distance(lite.image_styles(lite.transfer(content, style)), style))
    ratio = torch.cat(after).mean() / torch.cat(before).mean()
    assert ratio <= 0.5, ratio


def test_lite_transfer_shapes_and_determinism(lite, small_digits):
    content = small_digits.images["syn"][:3]
    style = lite.image_styles(small_digits.images["mnistm"][:3])
    out = lite.transfer(content, style)
    assert out.shape == content.shape and out.dtype == torch.uint8
    assert torch.equal(out, lite.transfer(content, style))
    assert style.tensors["mean"].shape == (3, lite.decoder[1].in_channels)


def test_lite_decoder_file_errors_name_file_and_key(tmp_path, lite):
    from safetensors.torch import save_file

    from fedstyle.style.transfer.lite import LiteTransfer

    state = {k: v.clone(memory_format=torch.contiguous_format) for k, v in lite.decoder.state_dict().items()}
    first = next(iter(state))
    bad = dict(state)
    bad[first] = torch.zeros(1)
    path = tmp_path / "bad.safetensors"
    save_file(bad, str(path), metadata=lite.metadata)
    with pytest.raises(ConfigError, match=rf"bad\.safetensors.*{first}.*shape"):
        LiteTransfer(decoder_weights=path, device="cpu")
    missing = {k: v for k, v in state.items() if k != first}
    save_file(missing, str(path), metadata=lite.metadata)
    with pytest.raises(ConfigError, match=rf"bad\.safetensors.*missing key '{first}'"):
        LiteTransfer(decoder_weights=path, device="cpu")
    save_file(state, str(path), metadata={"format": "something else"})
    with pytest.raises(ConfigError, match="not a lite decoder"):
        LiteTransfer(decoder_weights=path, device="cpu")
    with pytest.raises(ConfigError, match="train-decoder"):
        LiteTransfer(decoder_weights=tmp_path / "absent.safetensors", device="cpu")


def test_train_decoder_writes_a_reproducible_loadable_file(tmp_path):
    from safetensors.torch import load_file

    from fedstyle.style.transfer.decoder_training import DecoderTrainingConfig, train_decoder
    from fedstyle.style.transfer.lite import LiteTransfer

    pool = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    config = DecoderTrainingConfig(steps=2, batch_size=4, image_size=16, width=4, datasets=(), photos=False)
    a = train_decoder(config, out=tmp_path / "a.safetensors", device="cpu", quiet=True, pool=pool)
    b = train_decoder(config, out=tmp_path / "b.safetensors", device="cpu", quiet=True, pool=pool)
    first, second = load_file(str(a)), load_file(str(b))
    assert all(torch.equal(first[k], second[k]) for k in first)
    backend = LiteTransfer(decoder_weights=a, device="cpu")
    assert backend.min_size == 16 and "--width 4" in backend.metadata["command"]
    assert backend.transfer(pool[:2], backend.image_styles(pool[2:3])).shape == (2, 3, 16, 16)
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


@pytest.mark.parametrize("change, message", [({"style_weight": float("nan")}, "--style-weight must be a number >= 0"),
                                             ({"lr": float("nan")}, "--lr must be a number > 0"),
                                             ({"style_weight": -1.0}, "--style-weight must be a number >= 0")])
def test_train_decoder_refuses_a_weight_or_lr_that_is_not_a_number(tmp_path, change, message):
    from fedstyle.style.transfer.decoder_training import DecoderTrainingConfig, train_decoder

    config = DecoderTrainingConfig(steps=2, batch_size=4, image_size=16, width=4, datasets=(), photos=False, **change)
    with pytest.raises(ConfigError, match=message):
        train_decoder(config, out=tmp_path / "d.safetensors", device="cpu", quiet=True,
                      pool=torch.zeros(4, 3, 16, 16, dtype=torch.uint8))


def test_a_diverged_decoder_is_an_error_and_nothing_is_written(tmp_path):
    """An lr of 1e30 made an all-NaN decoder that was written with exit status 0."""
    from fedstyle.errors import NonFiniteLossError
    from fedstyle.style.transfer.decoder_training import DecoderTrainingConfig, train_decoder

    pool = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    # step 1's loss is finite (it comes before the first update); the weights are not: found at the end, step 3
    config = DecoderTrainingConfig(steps=3, batch_size=4, image_size=16, width=4, lr=1e30, datasets=(), photos=False)
    with pytest.raises(NonFiniteLossError, match=r"diverged by step 3 .*nothing was written. Lower --lr \(now 1e\+30"):
        train_decoder(config, out=tmp_path / "d.safetensors", device="cpu", quiet=True, pool=pool)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("backend, options, message", [
    ("lite", {"bogus": "1"}, "the lite backend takes no option 'bogus'; its options: decoder_weights, "),
    ("fft", {"decoder_weights": "x"}, "the fft backend takes no option 'decoder_weights'; its options: band"),
    ("lite", {"batch_size": "abc"}, r"--hp batch_size=abc: batch_size takes a whole number \(default 128\)"),
    ("lite", {"batch_size": "64.5"}, r"--hp batch_size=64.5: batch_size takes a whole number"),
])
def test_style_demo_options_are_checked_against_the_backend(backend, options, message):
    """--hp names and values a backend does not take were TypeErrors and ValueErrors from its constructor."""
    from fedstyle.style.transfer.demo import typed_options

    with pytest.raises(ConfigError, match=message):
        typed_options(backend, options)


def test_style_demo_options_get_their_defaults_type():
    from fedstyle.style.transfer.demo import typed_options

    assert typed_options("lite", {"batch_size": "64", "decoder_weights": "d.safetensors"}) == {
        "batch_size": 64, "decoder_weights": "d.safetensors"}


def test_style_demo_writes_a_png(tmp_path, tiny_root):
    from PIL import Image

    from fedstyle.style.transfer.demo import style_demo

    # the fft backend: the grid's making is what is checked here (the lite backend's transfer is checked above,
    # and its CNN took ~8 of this test's 10 CPU seconds)
    out = style_demo(tmp_path / "grid.png", dataset="folder", data_root=str(tiny_root), backend="fft", per_domain=1,
                     device="cpu")
    with Image.open(out) as png:
        assert png.format == "PNG" and png.size[0] > 300


# -- command line ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["style", "--help"], ["style", "train-decoder", "--help"],
                                  ["style", "demo", "--help"]])
def test_style_cli_help(argv, capsys):
    from fedstyle.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "example" in capsys.readouterr().out


def test_cli_training_defaults_equal_the_config_defaults():
    from dataclasses import asdict

    from fedstyle.cli.style import TRAIN_DEFAULTS
    from fedstyle.style.transfer.decoder_training import DecoderTrainingConfig

    assert TRAIN_DEFAULTS == asdict(DecoderTrainingConfig())


def test_cli_demo_with_unknown_backend_lists_the_valid_ones(tmp_path, capsys):
    from fedstyle.cli.main import main

    assert main(["style", "demo", "--backend", "nope", "--out", str(tmp_path / "x.png")]) == 2
    assert "lite" in capsys.readouterr().err
