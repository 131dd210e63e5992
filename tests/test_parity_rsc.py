"""Parity of RSC's ``reference_code`` mode with the self-challenging forward of the authors' ResNet
(DeLightCMU/RSC ``Domain_Generalization/models/resnet.py``; fixture: ``python -m parity.rsc``, see its docstring)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.rsc import RSC
from fedstyle.models.base import Classifier
from fedstyle.models.resnet import BasicBlock, ResNet
from parity import rsc as generator
from parity.common import gradient_errors, read_fixture, relative_error, seeded_weights, weight_sums

FIXTURE = read_fixture("rsc")
#: measured: masks equal; logits <= 1e-7, loss 0 (the same float), gradients <= 2.2e-7
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}
NAMES = {"class_classifier.": "head."}  # the authors' name prefix -> fedstyle's (else under backbone.)


def _fedstyle_name(authors: str) -> str:
    for theirs, ours in NAMES.items():
        if authors.startswith(theirs):
            return ours + authors[len(theirs):]
    return "backbone." + authors


def _model() -> Classifier:
    """fedstyle's ResNet with the generator's replacement: layer1-3 identities, layer4 one conv + ReLU."""
    backbone = ResNet(BasicBlock, (1, 1, 1, 1))
    backbone.layer1 = backbone.layer2 = backbone.layer3 = nn.Identity()
    backbone.layer4 = generator.reduced_layer4()
    model = Classifier(backbone, generator.CLASSES)
    ours = {v: k for k, v in NAMES.items()}
    authors = {}
    for key, value in model.state_dict().items():
        prefix = key.split(".")[0] + "."
        authors[ours[prefix] + key[len(prefix):] if prefix in ours else key[len("backbone."):]] = value.shape
    state = seeded_weights(authors, seed=0)
    for key, value in weight_sums(state).items():
        assert torch.equal(value, FIXTURE[key]), key
    model.load_state_dict({_fedstyle_name(k): v for k, v in state.items()}, strict=True)
    return model.train()


def _ctx() -> ClientContext:
    return ClientContext(client_id=0, data=None, state={}, train=None, round=0, num_clients=1,
                         device=torch.device("cpu"), seed=0)


def test_fixture_provenance():
    assert FIXTURE.meta["repository"] == generator.REPOSITORY and FIXTURE.meta["commit"] == generator.COMMIT
    assert FIXTURE.settings == generator.SETTINGS


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

    logits = []
    model.head.register_forward_hook(lambda module, args, out: logits.append(out.detach()))
    model.zero_grad()
    loss = algo.training_loss(_ctx(), model, images, labels, {})
    loss.backward()
    MEASURED[f"{mode}/logits"] = relative_error(logits[-1], FIXTURE[f"{mode}/logits"])  # the muted forward
    MEASURED[f"{mode}/loss"] = relative_error(loss.detach().reshape(1), FIXTURE[f"{mode}/loss"])
    assert MEASURED[f"{mode}/logits"] <= OUT_TOL and MEASURED[f"{mode}/loss"] <= LOSS_TOL
    by_fedstyle = {k: p.grad for k, p in model.named_parameters()}
    authors = [k.split("#")[0][len(f"{mode}/grad/"):] for k in FIXTURE.tensors if k.startswith(f"{mode}/grad/")]
    errors = gradient_errors(FIXTURE.tensors, {a: by_fedstyle[_fedstyle_name(a)] for a in set(authors)},
                             prefix=f"{mode}/grad/")
    assert len(errors) == len(by_fedstyle)
    MEASURED[f"{mode}/grad"] = max(errors.values())
    assert MEASURED[f"{mode}/grad"] <= GRAD_TOL, max(errors.items(), key=lambda kv: kv[1])
