"""Parity of DSU's ``reference_code`` mode with the authors' ``DistributionUncertainty`` and ``UResNet``
(lixiaotong97/DSU ``dsu.py``; fixture: ``python -m parity.dsu``, see its docstring)."""

from __future__ import annotations

import torch

from fedstyle.algorithms.dsu import LocalDSU
from fedstyle.models.base import Classifier
from fedstyle.models.registry import build_model
from fedstyle.style import dsu as dsu_op
from parity import dsu as generator
from parity.common import read_fixture, relative_error

from parity_steps import Renaming, checked_settings, compare_step, replayed_step, seeded_model, small_resnet

FIXTURE = read_fixture("dsu")
#: measured: module output 6e-8, its gradient 1e-7; logits 1.3e-6, loss 2.4e-7, gradients <= 3.6e-6
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}
NAMES = Renaming({"head.": "head."})  # the authors' UResNet: fedstyle's backbone names bare, the head as it is


def _replay(monkeypatch, fired, noise):
    """fedstyle's DSU draws replaced by the authors' recorded ones, in call order."""
    fired, noise = list(fired), list(noise)
    monkeypatch.setattr(dsu_op, "fires", lambda p: fired.pop(0))
    monkeypatch.setattr(torch, "randn_like", lambda like, **kw: noise.pop(0).reshape(like.shape).to(like))
    return fired, noise


def _model() -> tuple[Classifier, LocalDSU]:
    model = small_resnet(generator.CLASSES)
    algo = LocalDSU({"reference_code": True}, num_classes=generator.CLASSES, num_clients=1)
    algo.configure_model(model)
    return model, algo


def test_fixture_provenance():
    assert checked_settings(FIXTURE, generator) == generator.SETTINGS


def test_reference_mode_places_dsu_at_the_authors_positions():
    model, algo = _model()
    assert algo.hp["style_stages"] == ",".join(generator.STAGES)
    assert sorted(model.backbone.stage_ops) == sorted(generator.STAGES)
    assert LocalDSU({"reference_code": True, "style_stages": "layer2"}, num_classes=2, num_clients=1).hp[
        "style_stages"] == "layer2"  # an explicit choice wins
    assert LocalDSU({}, num_classes=2, num_clients=1).hp["style_stages"] == "layer1,layer2,layer3"
    convnet = build_model("convnet", 2, 32)  # no stem: the reference positions it has
    LocalDSU({"reference_code": True}, num_classes=2, num_clients=1).configure_model(convnet)
    assert sorted(convnet.backbone.stage_ops) == ["layer1", "layer2", "layer3", "layer4"]


def test_one_sample_or_one_position_passes_through():
    """Where the authors' unbiased variances are NaN (dsu.py:48, 57: one sample, or a 1 x 1 map such as layer4
    on small inputs), fedstyle's DSU leaves the features as they are."""
    op = dsu_op.DSU(p=1.0).train()
    for shape in ((1, 3, 4, 4), (4, 3, 1, 1)):
        x = torch.randn(shape)
        assert op(x) is x


def test_module_matches_the_authors_distribution_uncertainty(monkeypatch):
    x, w = generator.module_input()
    x.requires_grad_(True)
    op = dsu_op.DSU(p=generator.P, eps=generator.EPS).train()
    left = _replay(monkeypatch, [generator.MODULE_FIRE_DRAW <= generator.P],
                   [FIXTURE["module/noise_mean"], FIXTURE["module/noise_std"]])
    out = op(x)
    (out * w).sum().backward()
    assert all(not rest for rest in left)
    MEASURED["module/out"] = relative_error(out, FIXTURE["module/out"])
    MEASURED["module/grad_x"] = relative_error(x.grad, FIXTURE["module/grad_x"])
    assert MEASURED["module/out"] <= OUT_TOL and MEASURED["module/grad_x"] <= OUT_TOL


def test_resnet_step_matches_the_authors_uresnet(monkeypatch):
    model, algo = _model()
    state = seeded_model(model, NAMES.to_authors, FIXTURE, prefix="model/weight_sum/")
    assert len(state) == len(FIXTURE.group("model/weight_sum/"))
    model.train()

    fired = FIXTURE["model/fired"].tolist()[1:]  # pertubration0 (conv1 -> bn1) has no fedstyle stage: not fired
    noise = [FIXTURE[f"model/noise{i}"] for i in range(2 * sum(fired))]
    left = _replay(monkeypatch, fired, noise)
    step = replayed_step(monkeypatch, algo, model, *generator.model_input(), left=left)

    result = compare_step(FIXTURE, step, "model/", to_authors=NAMES.to_authors, logits=step.outputs["head"][0])
    MEASURED.update(result.measured("model/"))  # every parameter's gradient
    result.assert_within(OUT_TOL, LOSS_TOL, GRAD_TOL)
