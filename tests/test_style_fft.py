"""The ``fft`` style backend (FedDG amplitude exchange) on hand-checkable cases."""

from __future__ import annotations

import pytest
import torch

from fedstyle.errors import ConfigError
from fedstyle.style.transfer import TRANSFER_BACKENDS, Style, StyleMismatchError
from fedstyle.style.transfer.fft import exchange_amplitude, low_frequency_mask


def backend(**options):
    return TRANSFER_BACKENDS.get("fft")(device="cpu", **options)


def random_images(n=4, size=8, seed=0, channels=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)


def constant(value, n=1, size=8):
    return torch.full((n, 3, size, size), value, dtype=torch.uint8)


def test_mask_is_feddgs_centred_square_in_unshifted_layout():
    # 8 x 8, band 1/8: b = floor(8 / 8) = 1 -> frequencies -1, 0, 1 on each axis (indices 7, 0, 1)
    mask = low_frequency_mask(8, 8, 0.125)
    expected = torch.zeros(8, 8, dtype=torch.bool)
    for i in (7, 0, 1):
        for j in (7, 0, 1):
            expected[i, j] = True
    assert torch.equal(mask, expected)
    assert low_frequency_mask(8, 8, 0.0).sum() == 0  # band 0: nothing exchanged
    assert low_frequency_mask(8, 8, 0.05).sum() == 1  # b = 0: the zero frequency only (FedDG's L = 0)
    assert bool(low_frequency_mask(8, 6, 1.0).all()) and bool(low_frequency_mask(8, 8, 0.5).all())  # everything
    assert not bool(low_frequency_mask(8, 6, 0.5).all())  # b = 3 from the shorter side misses the Nyquist row
    assert torch.equal(low_frequency_mask(7, 7, 0.2), low_frequency_mask(7, 7, 0.2).flip(0).roll(1, 0))  # symmetric


def test_band_zero_and_ratio_zero_are_the_identity():
    x = random_images()
    style = backend().image_styles(random_images(seed=1))
    assert torch.equal(backend(band=0.0).transfer(x, style, 1.0), x)
    assert torch.equal(backend(band=0.5).transfer(x, style, 0.0), x)


def test_constant_images_hand_computed():
    # a constant image has all its amplitude at the zero frequency (value * H * W) with phase 0,
    # so moving the zero-frequency amplitude from 100 * 64 to 40 * 64 gives the constant 40
    fft = backend(band=0.05)
    style = fft.image_styles(constant(40))
    assert float(style.tensors["amplitude"][0, 0, 0, 0]) == pytest.approx(40 * 64)
    assert torch.equal(fft.transfer(constant(100), style, 1.0), constant(40))
    assert torch.equal(fft.transfer(constant(100), style, 0.5), constant(70))  # (1 - lam) * 100 + lam * 40
    zero = fft.transfer(constant(0), fft.image_styles(constant(0)), 1.0)  # zero variance, zero amplitude: no NaN
    assert torch.equal(zero, constant(0))


def test_full_band_ratio_one_gives_the_style_amplitude_and_keeps_the_phase():
    g = torch.Generator().manual_seed(0)
    content = torch.rand(2, 3, 8, 8, generator=g, dtype=torch.float64)
    target = torch.fft.fft2(torch.rand(2, 3, 8, 8, generator=g, dtype=torch.float64)).abs()
    spectrum = torch.fft.fft2(content)
    out = exchange_amplitude(spectrum, target, band=0.5, lam=1.0)
    out_spectrum = torch.fft.fft2(out)
    assert torch.allclose(out_spectrum.abs(), target, atol=1e-9)
    # phase kept: the output spectrum is the style amplitude times the content's unit phasor
    assert torch.allclose(out_spectrum, target * torch.exp(1j * spectrum.angle()), atol=1e-9)


def test_partial_band_interpolates_inside_and_keeps_outside():
    g = torch.Generator().manual_seed(1)
    content = torch.rand(1, 3, 16, 16, generator=g, dtype=torch.float64)
    target = torch.fft.fft2(torch.rand(1, 3, 16, 16, generator=g, dtype=torch.float64)).abs()
    spectrum = torch.fft.fft2(content)
    out = torch.fft.fft2(exchange_amplitude(spectrum, target, band=0.125, lam=0.25))
    mask = low_frequency_mask(16, 16, 0.125)
    expected = 0.75 * spectrum.abs() + 0.25 * target
    assert torch.allclose(out.abs()[..., mask], expected[..., mask], atol=1e-9)
    assert torch.allclose(out[..., ~mask], spectrum[..., ~mask], atol=1e-9)
    assert torch.allclose(out.angle()[..., mask], spectrum.angle()[..., mask], atol=1e-6)


def test_per_image_ratios():
    fft = backend(band=0.05)
    content = torch.cat([constant(100), constant(100)])
    style = fft.image_styles(constant(40))
    out = fft.transfer(content, style, torch.tensor([0.0, 1.0]))
    assert torch.equal(out, torch.cat([constant(100), constant(40)]))
    with pytest.raises(ConfigError, match="ratios"):
        fft.transfer(content, style, torch.tensor([0.5, 0.5, 0.5]))


def test_uint8_in_and_out_shape_kept_and_grayscale_becomes_rgb():
    fft = backend()
    x = random_images(3, 8)
    out = fft.transfer(x, fft.image_styles(random_images(3, 8, seed=2)), 1.0)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    gray = random_images(2, 8, channels=1)
    styles = fft.image_styles(gray)
    assert styles.tensors["amplitude"].shape == (2, 3, 8, 8)
    out = fft.transfer(gray, styles.select([1, 0]), 1.0)
    assert out.shape == (2, 3, 8, 8) and out.dtype == torch.uint8
    with pytest.raises(ConfigError, match="uint8"):
        fft.image_styles(x.float())


def test_dataset_style_is_the_streamed_mean_amplitude():
    fft = backend()
    images = random_images(10, 8)
    overall = fft.dataset_style([images[:3], images[3:7], images[7:]])
    assert len(overall) == 1 and overall.backend == "fft"
    mean = fft.image_styles(images).tensors["amplitude"].double().mean(0, keepdim=True)
    assert torch.allclose(overall.tensors["amplitude"].double(), mean, rtol=1e-5)
    with pytest.raises(ConfigError, match="one size"):
        fft.dataset_style([random_images(2, 8), random_images(2, 16)])
    with pytest.raises(StyleMismatchError, match="empty"):
        fft.dataset_style([])


def test_mismatched_styles_are_refused():
    fft = backend()
    x = random_images(2, 8)
    foreign = Style("lite", "efficientnet", {"mean": torch.zeros(1, 4), "std": torch.ones(1, 4)})
    with pytest.raises(StyleMismatchError, match="lite"):
        fft.transfer(x, foreign)
    with pytest.raises(ConfigError, match="same image size"):
        fft.transfer(x, fft.image_styles(random_images(1, 16)))
    with pytest.raises(ConfigError, match="band"):
        backend(band=2.0)


def test_stylize_to_one_style_is_cached_and_row_aligned():
    from fedstyle.style.transfer.stylize import stylize_to_style

    backend = TRANSFER_BACKENDS.get("fft")(device="cpu")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 16, 16), generator=g, dtype=torch.uint8)
    style = backend.dataset_style([torch.randint(0, 256, (4, 3, 16, 16), generator=g, dtype=torch.uint8)])
    out, metrics = stylize_to_style("test-one-style", {"case": 1}, images, style, backend, 1.0, 2, mode="eager")
    assert out.shape == images.shape and metrics["stylized_images"] == 5
    expected = backend.transfer(images, style.select(torch.zeros(5, dtype=torch.long)), 1.0)
    assert torch.equal(out, expected)  # row i is image i restyled
    again, metrics = stylize_to_style("test-one-style", {"case": 1}, images, style, backend, 1.0, 2, mode="eager")
    assert metrics.get("cache_hits") == 1.0 and torch.equal(again, out)
    lazy, metrics = stylize_to_style("test-one-style", {"case": 1}, images, style, backend, 1.0, 2)  # default: lazy
    assert metrics["cached_images"] == 5 and torch.equal(lazy.materialize(), out) and lazy.count.images == 0
    with pytest.raises(ConfigError, match="one style"):
        stylize_to_style("test-one-style", {}, images, Style.concat([style, style]), backend, 1.0, 2)
