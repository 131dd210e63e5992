"""Parity of DSU's ``reference_code`` mode with the authors' ``DistributionUncertainty`` and ``UResNet``
(lixiaotong97/DSU ``dsu.py``; fixture: ``python -m parity.dsu``, see its docstring)."""

from __future__ import annotations

import torch

from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.dsu import LocalDSU
from fedstyle.models.base import Classifier
from fedstyle.models.registry import build_model
from fedstyle.models.resnet import BasicBlock, ResNet
from fedstyle.style import dsu as dsu_op
from parity import dsu as generator
from parity.common import gradient_errors, read_fixture, relative_error, seeded_weights, weight_sums

FIXTURE = read_fixture("dsu")
#: measured: module output 6e-8, its gradient 1e-7; logits 1.3e-6, loss 2.4e-7, gradients <= 3.6e-6
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}


def _replay(monkeypatch, fired, noise):
    """fedstyle's DSU draws replaced by the authors' recorded ones, in call order."""
    fired, noise = list(fired), list(noise)
    monkeypatch.setattr(dsu_op, "fires", lambda p: fired.pop(0))
    monkeypatch.setattr(torch, "randn_like", lambda like, **kw: noise.pop(0).reshape(like.shape).to(like))
    return fired, noise


def _ctx() -> ClientContext:
    return ClientContext(client_id=0, data=None, state={}, train=None, round=0, num_clients=1,
                         device=torch.device("cpu"), seed=0)


def _authors_name(fedstyle: str) -> str:
    return fedstyle if fedstyle.startswith("head.") else fedstyle[len("backbone."):]


def _model() -> tuple[Classifier, LocalDSU]:
    model = Classifier(ResNet(BasicBlock, (1, 1, 1, 1)), generator.CLASSES)
    algo = LocalDSU({"reference_code": True}, num_classes=generator.CLASSES, num_clients=1)
    algo.configure_model(model)
    return model, algo


def test_fixture_provenance():
    assert FIXTURE.meta["repository"] == generator.REPOSITORY and FIXTURE.meta["commit"] == generator.COMMIT
    assert FIXTURE.settings == generator.SETTINGS


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
    authors = {_authors_name(k): v.shape for k, v in model.state_dict().items()}
    state = seeded_weights(authors, seed=0)
    for key, value in weight_sums(state, prefix="model/weight_sum/").items():
        assert torch.equal(value, FIXTURE[key]), key
    assert len(authors) == len(FIXTURE.group("model/weight_sum/"))
    model.load_state_dict({("" if k.startswith("head.") else "backbone.") + k: v for k, v in state.items()},
                          strict=True)
    model.train()

    fired = FIXTURE["model/fired"].tolist()[1:]  # pertubration0 (conv1 -> bn1) has no fedstyle stage: not fired
    noise = [FIXTURE[f"model/noise{i}"] for i in range(2 * sum(fired))]
    left = _replay(monkeypatch, fired, noise)
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
