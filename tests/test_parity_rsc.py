"""Parity of RSC's ``reference_code`` mode with the self-challenging forward of the authors' ResNet
(DeLightCMU/RSC ``Domain_Generalization/models/resnet.py``; fixture: ``python -m parity.rsc``, see its docstring)."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms.rsc import RSC
from fedstyle.models.base import Classifier
from parity import rsc as generator
from parity.common import read_fixture

from parity_steps import Renaming, checked_settings, compare_step, run_step, seeded_model, small_resnet

FIXTURE = read_fixture("rsc")
#: measured: masks equal; logits <= 1e-7, loss 0 (the same float), gradients <= 2.2e-7
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}
NAMES = Renaming({"class_classifier.": "head."})  # the authors' name prefix -> fedstyle's (else under backbone.)


def _model() -> Classifier:
    """fedstyle's ResNet with the generator's replacement: layer1-3 identities, layer4 one conv + ReLU."""
    model = small_resnet(generator.CLASSES, reduced=True)
    seeded_model(model, NAMES.to_authors, FIXTURE)
    return model.train()


def test_fixture_provenance():
    assert checked_settings(FIXTURE, generator) == generator.SETTINGS


def test_reference_mode_settings():
    algo = RSC({"reference_code": True}, num_classes=2, num_clients=1)
    assert algo.hp["drop_b"] == 0.3 and algo.channel_drop == 1 / 3.2 and algo.hp["drop_f"] == 1 / 3
    given = RSC({"reference_code": True, "drop_f": 0.25, "drop_b": 0.5}, num_classes=2, num_clients=1)
    assert (given.channel_drop, given.hp["drop_b"], given.margin) == (0.25, 0.5, 1e-4)
    default = RSC({}, num_classes=2, num_clients=1)
    assert (default.channel_drop, default.hp["drop_b"], default.margin) == (1 / 3, 1 / 3, 0.0)


@pytest.mark.parametrize("mode", sorted(generator.CHOICE))
def test_step_matches_the_authors_forward(mode):
    model = _model()
    algo = RSC({"reference_code": True, "mode": mode}, num_classes=generator.CLASSES, num_clients=1)
    images, labels = generator.model_input()
    expected = FIXTURE[f"{mode}/mask"]

    maps = model.backbone.forward_maps(images)
    mask, muted = algo.rsc_mask(model, maps, labels, mode == "spatial")
    assert torch.equal(mask.expand_as(expected), expected)  # same entries muted, same samples
    assert 0 < int(muted.sum()) <= round(0.3 * generator.BATCH)

    model.zero_grad()
    step = run_step(algo, model, images, labels)
    result = compare_step(FIXTURE, step, f"{mode}/", to_authors=NAMES.to_authors,
                          logits=step.outputs["head"][-1])  # the muted forward
    assert len(result.grads) == len(step.grads)  # every parameter
    MEASURED.update(result.measured(f"{mode}/"))
    result.assert_within(OUT_TOL, LOSS_TOL, GRAD_TOL)
