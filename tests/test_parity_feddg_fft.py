"""Parity of feddg_fft's ``fft`` style backend with liuquande/FedDG-ELCFS (fixture: ``python -m parity.feddg_fft``).

For fixed uint8 images at 16 x 16, 12 x 20 and 15 x 17: the amplitude spectrum (``FFTAmplitude.image_styles``),
the low-frequency amplitude interpolation for several bands and weights (``exchange_amplitude``, in float, and
``FFTAmplitude.transfer``, its rounded uint8 image), and training's full exchange, whose ``L = 0`` exchanges the
zero-frequency term: fedstyle's ``band = 0`` exchanges nothing, any band in (0, 1 / min(H, W)) is the code's L = 0.
"""

from __future__ import annotations

import pytest
import torch

from fedstyle.style.transfer.fft import FFTAmplitude, exchange_amplitude
from parity import feddg_fft as generator
from parity.common import relative_error

from parity_steps import checked_settings, parity_fixture

TOLERANCE = 1e-5  # float32 FFTs here, float64 in the authors' numpy
fixture = parity_fixture("feddg_fft")


def test_fixture_is_the_generators(fixture):
    settings = checked_settings(fixture, generator)
    assert settings["sizes"] == [list(s) for s in generator.SIZES]
    assert settings["interpolations"] == [list(s) for s in generator.INTERPOLATIONS]
    assert settings["full_exchanges"] == list(generator.FULL_EXCHANGES)
    for key, image in generator.images().items():
        assert torch.equal(fixture[key], image), key


def _styled(backend, fixture, i):
    return backend.image_styles(fixture[f"style/{i}"][None])


@pytest.mark.parametrize("i", range(len(generator.SIZES)))
def test_amplitude_spectrum(fixture, i):
    amplitude = _styled(FFTAmplitude(), fixture, i).tensors["amplitude"][0]
    assert relative_error(amplitude, fixture[f"amplitude/{i}"]) < TOLERANCE


def _check_exchange(fixture, i, band, lam, expected):
    content = fixture[f"content/{i}"][None]
    backend = FFTAmplitude(band=band)
    style = _styled(backend, fixture, i)
    spectrum = torch.fft.fft2(content.float(), dim=(-2, -1))
    ours = exchange_amplitude(spectrum, style.tensors["amplitude"], band, lam)[0]
    assert relative_error(ours, expected) < TOLERANCE, (i, band, lam)
    image = backend.transfer(content, style, alpha=lam)[0].int()
    theirs = expected.clamp(0, 255).round().int()
    assert int((image - theirs).abs().max()) <= 1 and float((image != theirs).float().mean()) < 0.01, (i, band, lam)


@pytest.mark.parametrize("i", range(len(generator.SIZES)))
@pytest.mark.parametrize("band,lam", generator.INTERPOLATIONS)
def test_continuous_interpolation(fixture, i, band, lam):
    """The demo's amp_spectrum_swap(ratio = 1 - lam) is fedstyle's lam."""
    _check_exchange(fixture, i, band, lam, fixture[f"interpolated/{i}/{band}/{lam}"])


@pytest.mark.parametrize("i", range(len(generator.SIZES)))
def test_trainings_full_exchange(fixture, i):
    """source_to_target_freq (lam = 1) at L = 0.1, and at training's L = 0 = fedstyle's band below 1 / min(H, W)."""
    _check_exchange(fixture, i, 0.1, 1.0, fixture[f"exchanged/{i}/0.1"])
    side = min(generator.SIZES[i])
    _check_exchange(fixture, i, 0.5 / side, 1.0, fixture[f"exchanged/{i}/0.0"])
    content = fixture[f"content/{i}"][None]
    backend = FFTAmplitude(band=0.0)  # fedstyle's band 0: no exchange at all (the code's L = 0 swaps the DC term)
    assert torch.equal(backend.transfer(content, _styled(backend, fixture, i)), content)
