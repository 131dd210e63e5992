"""Parity of FedSR with the authors' code (atuannguyen/FedSR) in its public-code settings: ``l2r=norm``,
``cmi_scale=true``, ``predict=mc`` with 20 samples (fixture: ``python -m parity.fedsr``; see its docstring).

The public code has no floor on sigma; fedstyle's smallest, ``sigma_floor=1e-12``, vanishes in float32
next to softplus values of order 1, so the comparison is exact up to the order of the arithmetic."""

from __future__ import annotations

import types

import torch

from fedstyle.algorithms.fedsr import FedSR
from fedstyle.models.base import Classifier
from fedstyle.models.necks import GaussianNeck
from parity import fedsr as generator
from parity.common import read_fixture, relative_error

from parity_steps import checked_settings, compare_step, run_step, seeded_model

FIXTURE = read_fixture("fedsr")
S = generator.SETTINGS
HP = {"z_dim": S["z_dim"], "alpha_l2r": S["L2R_coeff"], "alpha_cmi": S["CMI_coeff"], "l2r": "norm",
      "cmi_scale": True, "predict": "mc", "mc_samples": S["num_samples"], "sigma_floor": 1e-12}
#: measured: prediction 4e-8, mu / sigma / z and the loss terms 0 (bitwise), gradients <= 6e-7 (relative)
TOLERANCE = {"output": 1e-5, "loss": 1e-5, "grad": 1e-5}


def model_with_the_authors_weights():
    algo = FedSR(HP, num_classes=S["classes"], num_clients=1)
    model = Classifier(generator.backbone(), S["classes"])
    algo.configure_model(model)
    names = {generator.fedstyle_name(k): k for k in FIXTURE.group("weight_sum/")}  # every tensor of the model
    seeded_model(model, names, FIXTURE, seed=S["weights_seed"], overrides={"C": torch.tensor(generator.C_VALUE)})
    return algo, model


def test_fixture_provenance_and_settings():
    assert checked_settings(FIXTURE, generator) == S


def test_prediction_and_training_step_match_the_authors_code(monkeypatch):
    algo, model = model_with_the_authors_weights()
    x, y = generator.batch()
    assert torch.equal(y, FIXTURE["y"])

    # Monte-Carlo prediction: fedstyle's mc_seed draw is the one the authors' code was given
    model.eval()
    gen = torch.Generator().manual_seed(model.neck.mc_seed)
    assert torch.equal(torch.randn(FIXTURE["eps/predict"].shape, generator=gen), FIXTURE["eps/predict"])
    with torch.no_grad():
        log_probs = model(x)
    assert relative_error(log_probs, FIXTURE["predict/log_probs"]) <= TOLERANCE["output"]

    # one training step with the authors' eps
    model.train()
    eps = FIXTURE["eps/train"].reshape(x.shape[0], S["z_dim"])
    seen = {}

    def sample(mu, sigma):
        seen["mu"], seen["sigma"] = mu, sigma
        seen["z"] = mu + sigma * eps
        return seen["z"]

    monkeypatch.setattr(GaussianNeck, "sample", staticmethod(sample))
    logged = {}
    ctx = types.SimpleNamespace(log=lambda name, value: logged.__setitem__(name, value))
    step = run_step(algo, model, x, y, ctx=ctx, hooks=())
    for name in ("mu", "sigma", "z"):
        assert relative_error(seen[name], FIXTURE[f"train/{name}"]) <= TOLERANCE["output"], name
    result = compare_step(FIXTURE, step, "loss/", loss="total", grad_prefix="grad/",
                          ce=logged["fedsr_ce"], l2r=logged["fedsr_l2r"], cmi=logged["fedsr_cmi"])
    assert max(result.errors.values()) <= TOLERANCE["loss"], result.errors  # the terms and the total
    assert result.grad <= TOLERANCE["grad"], result.worst_grad
