"""Parity of MixStyle's ``reference_code`` mode with the authors' MixStyle and their ResNet
(KaiyangZhou/mixstyle-release; fixture: ``python -m parity.mixstyle``, see its docstring)."""

from __future__ import annotations

import torch

from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.mixstyle import LocalMixStyle
from fedstyle.models.base import Classifier
from fedstyle.models.resnet import BasicBlock, ResNet
from fedstyle.style import mixstyle as ms
from parity import mixstyle as generator
from parity.common import gradient_errors, read_fixture, relative_error, seeded_weights, weight_sums

FIXTURE = read_fixture("mixstyle")
#: measured: module output 6e-8, its gradient 5e-8; logits 1.1e-6, loss 2.3e-7, gradients <= 1.9e-6
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}


def _replay(monkeypatch, fired, lambdas, perms):
    """fedstyle's MixStyle draws replaced by the authors' recorded ones, in call order."""
    fired, lambdas, perms = list(fired), list(lambdas), list(perms)
    monkeypatch.setattr(ms, "fires", lambda p: fired.pop(0))
    monkeypatch.setattr(ms.MixStyle, "sample_mix_weights", lambda self, batch, like: lambdas.pop(0).to(like))
    monkeypatch.setattr(torch, "randperm", lambda n, **kw: perms.pop(0))
    return fired, lambdas, perms


def _ctx() -> ClientContext:
    return ClientContext(client_id=0, data=None, state={}, train=None, round=0, num_clients=1,
                         device=torch.device("cpu"), seed=0)


def _authors_name(fedstyle: str) -> str:
    return "classifier." + fedstyle[len("head."):] if fedstyle.startswith("head.") else fedstyle[len("backbone."):]


def _fedstyle_name(authors: str) -> str:
    return "head." + authors[len("classifier."):] if authors.startswith("classifier.") else "backbone." + authors


def test_fixture_provenance():
    assert FIXTURE.meta["repository"] == generator.REPOSITORY and FIXTURE.meta["commit"] == generator.COMMIT
    assert FIXTURE.settings == generator.SETTINGS


def test_module_matches_the_authors_mixstyle(monkeypatch):
    x, w = generator.module_input()
    x.requires_grad_(True)
    op = LocalMixStyle({"reference_code": True}, num_classes=2, num_clients=1)
    model = Classifier(ResNet(BasicBlock, (1, 1, 1, 1)), 2)
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
    model = Classifier(ResNet(BasicBlock, (1, 1, 1, 1)), generator.CLASSES)
    algo = LocalMixStyle({"reference_code": True}, num_classes=generator.CLASSES, num_clients=1)
    algo.configure_model(model)
    assert sorted(model.backbone.stage_ops) == sorted(generator.STAGES)
    fedstyle_keys = list(model.state_dict())
    authors = {_authors_name(k): v.shape for k, v in model.state_dict().items()}
    state = seeded_weights(authors, seed=0)
    for key, value in weight_sums(state, prefix="model/weight_sum/").items():
        assert torch.equal(value, FIXTURE[key]), key
    model.load_state_dict({_fedstyle_name(k): v for k, v in state.items()}, strict=True)
    assert len(fedstyle_keys) == len(state)
    model.train()

    fired = FIXTURE["model/fired"].tolist()
    left = _replay(monkeypatch, fired, [FIXTURE["model/lambda0"], FIXTURE["model/lambda1"]],
                   [FIXTURE["model/perm0"], FIXTURE["model/perm1"]])
    logits = []
    model.head.register_forward_hook(lambda module, args, out: logits.append(out.detach()))
    images, labels = generator.model_input()
    loss = algo.training_loss(_ctx(), model, images, labels, {})
    loss.backward()
    assert all(not rest for rest in left)  # every recorded draw used, in order
    monkeypatch.undo()  # torch's samplers as they are again

    MEASURED["model/logits"] = relative_error(logits[0], FIXTURE["model/logits"])
    MEASURED["model/loss"] = relative_error(loss.detach().reshape(1), FIXTURE["model/loss"])
    assert MEASURED["model/logits"] <= OUT_TOL and MEASURED["model/loss"] <= LOSS_TOL
    by_authors = {_authors_name(k): p.grad for k, p in model.named_parameters()}
    errors = gradient_errors(FIXTURE.tensors, by_authors, prefix="model/grad/")  # every parameter
    MEASURED["model/grad"] = max(errors.values())
    assert MEASURED["model/grad"] <= GRAD_TOL, max(errors.items(), key=lambda kv: kv[1])
