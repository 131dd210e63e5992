"""Parity of MixStyle's ``reference_code`` mode with the authors' MixStyle and their ResNet
(KaiyangZhou/mixstyle-release; fixture: ``python -m parity.mixstyle``, see its docstring)."""

from __future__ import annotations

import torch

from fedstyle.algorithms.mixstyle import LocalMixStyle
from fedstyle.style import mixstyle as ms
from parity import mixstyle as generator
from parity.common import read_fixture, relative_error

from parity_steps import Renaming, checked_settings, compare_step, replayed_step, seeded_model, small_resnet

FIXTURE = read_fixture("mixstyle")
#: measured: module output 6e-8, its gradient 5e-8; logits 1.1e-6, loss 2.3e-7, gradients <= 1.9e-6
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}
NAMES = Renaming({"classifier.": "head."})  # the authors' name prefix -> fedstyle's (else under backbone.)


def _replay(monkeypatch, fired, lambdas, perms):
    """fedstyle's MixStyle draws replaced by the authors' recorded ones, in call order."""
    fired, lambdas, perms = list(fired), list(lambdas), list(perms)
    monkeypatch.setattr(ms, "fires", lambda p: fired.pop(0))
    monkeypatch.setattr(ms.MixStyle, "sample_mix_weights", lambda self, batch, like: lambdas.pop(0).to(like))
    monkeypatch.setattr(torch, "randperm", lambda n, **kw: perms.pop(0))
    return fired, lambdas, perms


def test_fixture_provenance():
    assert checked_settings(FIXTURE, generator) == generator.SETTINGS


def test_module_matches_the_authors_mixstyle(monkeypatch):
    x, w = generator.module_input()
    x.requires_grad_(True)
    op = LocalMixStyle({"reference_code": True}, num_classes=2, num_clients=1)
    model = small_resnet(2)
    op.configure_model(model)
    mix = model.backbone.stage_ops["layer1"]
    assert isinstance(mix, ms.MixStyle) and mix.unbiased  # reference mode: torch.var's unbiased variance
    assert (mix.p, mix.alpha, mix.eps) == (generator.P, generator.ALPHA, generator.EPS)
    left = _replay(monkeypatch, [generator.MODULE_FIRE_DRAW <= generator.P], [FIXTURE["module/lambda"]],
                   [FIXTURE["module/perm"]])
    out = mix.train()(x)
    (out * w).sum().backward()
    assert all(not rest for rest in left)
    MEASURED["module/out"] = relative_error(out, FIXTURE["module/out"])
    MEASURED["module/grad_x"] = relative_error(x.grad, FIXTURE["module/grad_x"])
    assert MEASURED["module/out"] <= OUT_TOL and MEASURED["module/grad_x"] <= OUT_TOL
    # the paper's 1/HW variance (the default) gives the same output: the factor HW / (HW - 1) cancels in
    # sigma_mix / sigma and survives only through eps (measured 7e-8 here)
    _replay(monkeypatch, [True], [FIXTURE["module/lambda"]], [FIXTURE["module/perm"]])
    paper = ms.MixStyle(generator.P, generator.ALPHA, generator.EPS).train()(x.detach())
    MEASURED["module/out (paper mode)"] = relative_error(paper, FIXTURE["module/out"])
    assert MEASURED["module/out (paper mode)"] <= OUT_TOL


def test_resnet_step_matches_the_authors_resnet_ms(monkeypatch):
    model = small_resnet(generator.CLASSES)
    algo = LocalMixStyle({"reference_code": True}, num_classes=generator.CLASSES, num_clients=1)
    algo.configure_model(model)
    assert sorted(model.backbone.stage_ops) == sorted(generator.STAGES)
    state = seeded_model(model, NAMES.to_authors, FIXTURE, prefix="model/weight_sum/")
    assert len(model.state_dict()) == len(state)
    model.train()

    fired = FIXTURE["model/fired"].tolist()
    left = _replay(monkeypatch, fired, [FIXTURE["model/lambda0"], FIXTURE["model/lambda1"]],
                   [FIXTURE["model/perm0"], FIXTURE["model/perm1"]])
    step = replayed_step(monkeypatch, algo, model, *generator.model_input(), left=left)

    result = compare_step(FIXTURE, step, "model/", to_authors=NAMES.to_authors, logits=step.outputs["head"][0])
    MEASURED.update(result.measured("model/"))  # every parameter's gradient
    result.assert_within(OUT_TOL, LOSS_TOL, GRAD_TOL)
