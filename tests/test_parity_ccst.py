"""Parity of ccst's reference mode with JeremyCJM/CCST (fixture: ``python -m parity.ccst``, see its docstring).

CCST with ``reference_code=true`` and the ``adain`` backend, loaded from weight files holding the generator's
seeded weights: ``image_styles`` (single-image styles), ``dataset_style`` (the overall style from pooled sums,
over the same two batches) and ``transfer`` (encoder -> AdaIN -> decoder; the decoder's float output, caught by
a forward hook, and the uint8 image) at alpha 1 to the overall style and at alpha 0.6 to a single style. The code
normalises the content with the unbiased variance: reference mode does too, the default does not (checked).
"""

from __future__ import annotations

import types

import pytest
import torch
from safetensors.torch import save_file

from fedstyle.algorithms import METHODS
from fedstyle.style.transfer.base import Style
from parity import ccst as generator
from parity.common import relative_error

from parity_steps import CPU, assert_weight_sums, checked_settings, outputs_of, parity_fixture

STYLE_TOLERANCE = 1e-4  # float32 sums of squares in the code (E[f^2] - mu^2), float64 here
OUTPUT_TOLERANCE = 1e-4
fixture = parity_fixture("ccst")


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory, fixture):
    state = generator.weights()
    assert_weight_sums(state, fixture, approx=1e-12)
    folder = tmp_path_factory.mktemp("adain")
    files = {}
    for part in ("vgg", "decoder"):
        files[part] = folder / f"{part}.safetensors"
        save_file({k[len(part) + 1:]: v.contiguous() for k, v in state.items() if k.startswith(part + ".")},
                  str(files[part]))
    return files


def _backend(weight_files, reference: bool):
    algo = METHODS.get("ccst")({"reference_code": reference, "style_backend": "adain", "style_device": "cpu",
                                "vgg_weights": str(weight_files["vgg"]),
                                "decoder_weights": str(weight_files["decoder"])}, num_classes=4, num_clients=3)
    return algo.backend(types.SimpleNamespace(device=CPU))


def test_fixture_is_the_generators(fixture):
    assert checked_settings(fixture, generator) == {k: [list(b) for b in v] if k == "overall_batches" else v
                                                    for k, v in generator.SETTINGS.items()}
    for key, images in generator.images().items():
        assert float(images.double().sum()) == float(fixture[f"image_sum/{key}"]), key


def test_styles_transfer_and_the_unbiased_content_switch(fixture, weight_files):
    backend = _backend(weight_files, reference=True)
    assert backend.unbiased_content and backend.encoder_id.endswith("+unbiased-content")
    images = generator.images()
    style_images, content = images["style"], images["content"]

    single = backend.image_styles(style_images)
    assert relative_error(single.tensors["mean"], fixture["single/mean"]) < STYLE_TOLERANCE
    assert relative_error(single.tensors["std"], fixture["single/std"]) < STYLE_TOLERANCE
    overall = backend.dataset_style(style_images[a:b] for a, b in generator.OVERALL_BATCHES)
    assert relative_error(overall.tensors["mean"], fixture["overall/mean"]) < STYLE_TOLERANCE
    assert relative_error(overall.tensors["std"], fixture["overall/std"]) < STYLE_TOLERANCE

    with outputs_of(backend.decoder) as decoded:
        image = backend.transfer(content, overall, alpha=1.0)
        backend.transfer(content[:1], single.select(torch.tensor([0])), alpha=generator.SINGLE_ALPHA)
    assert relative_error(decoded[0], fixture["transfer/overall"]) < OUTPUT_TOLERANCE
    assert relative_error(decoded[1], fixture["transfer/single"]) < OUTPUT_TOLERANCE
    theirs = fixture["transfer/overall"].clamp(0, 1).mul(255).add(0.5).floor().int()  # save_image's rounding
    assert int((image.int() - theirs).abs().max()) <= 1

    default = _backend(weight_files, reference=False)  # population variance: ~1 / (2 HW) off at 8 x 8 maps
    assert not default.unbiased_content
    with outputs_of(default.decoder) as decoded:
        default.transfer(content, Style(overall.backend, default.encoder_id, overall.tensors))  # the same numbers
    assert relative_error(decoded[0], fixture["transfer/overall"]) > OUTPUT_TOLERANCE  # 1.1e-3 measured
