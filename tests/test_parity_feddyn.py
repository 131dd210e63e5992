"""Parity of FedDyn's ``reference_code`` mode with three rounds of the authors' ``train_FedDyn`` (alpemreacar/FedDyn;
fixture: ``python -m parity.feddyn``, see its docstring): the clients' alpha_i from their sizes (through fedstyle's
setup exchange), every step's gradient norm before clipping, the server model after every round and the clients'
accumulated drifts."""

from __future__ import annotations

import math

import pytest
import torch

from fedstyle.algorithms.context import ClientUpdate, ServerContext, TrainSettings
from fedstyle.algorithms.feddyn import FedDyn
from parity import feddyn as generator
from parity.common import read_fixture, relative_error

from parity_steps import assert_weight_sums, checked_settings, client_context, placeholder_data

FIXTURE = read_fixture("feddyn")
S = generator.SETTINGS
#: float32 training through BLAS, 3 rounds of 2-4 steps; measured on this CPU: 3.2e-7 (server models), 7.9e-7
#: (drifts), 9.0e-7 (gradient norms)
TOLERANCE = {"weights": 1e-5, "drift": 1e-4, "norm": 1e-4}


def federate(hparams: dict) -> dict:
    """The fixture's three rounds through fedstyle's FedDyn hooks (setup exchange, local_train, aggregate), with the
    code's sampled clients and each client's samples in order as its batches; what the fixture stores."""
    algo = FedDyn({"alpha": S["alpha"], **hparams}, num_classes=S["classes"], num_clients=len(S["sizes"]))
    model = generator.build_model()
    model.load_state_dict(generator.initial_weights())
    algo.configure_model(model)
    data = [(FIXTURE[f"client{c}/x"], FIXTURE[f"client{c}/y"]) for c in range(len(S["sizes"]))]
    states: list[dict] = [{} for _ in data]

    def context(c: int, r: int):
        ctx = client_context(placeholder_data(data[c][1], 4), TrainSettings(
            lr=S["lr"], batch_size=S["batch_size"], local_steps=math.ceil(len(data[c][1]) / S["batch_size"]),
            momentum=0.0, weight_decay=S["weight_decay"]), round=r, num_clients=len(data))
        ctx.client_id, ctx.state = c, states[c]
        return ctx

    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}  # not the model's own, trained tensors
    server = ServerContext(weights=initial, state={}, round=0, num_clients=len(data), seed=0)
    for c in range(len(data)):  # as the runtime does when a client first enters (federation.client.enter_client)
        algo.init_client_state(context(c, 0), model)
    if algo.uses_phase("setup"):
        uploads = {c: algo.setup_upload(context(c, 0), model) for c in range(len(data))}
        broadcast = algo.setup_broadcast(uploads, server)
        for c in range(len(data)):
            algo.setup_download(context(c, 0), model, broadcast)
    scaled = algo.hp["alpha_scaling"] == "data_size"
    out = {"alpha": [algo.regularizer.client_alpha(context(c, 0), scaled) for c in range(len(data))], "cloud": [],
           "norms": {}}
    real_clip = torch.nn.utils.clip_grad_norm_
    for r in range(S["rounds"]):
        updates = []
        for c in FIXTURE[f"selected/r{r}"].tolist():
            model.load_state_dict(server.weights)
            ctx = context(c, r)
            ctx.global_weights = dict(server.weights)
            x, y = data[c]
            batches = [(x[i:i + S["batch_size"]], y[i:i + S["batch_size"]]) for i in range(0, len(y), S["batch_size"])]
            algo.training_batches = lambda ctx, batches=batches: iter(batches)
            norms = []

            def clip(parameters, max_norm, *args, **kwargs):
                total = real_clip(parameters, max_norm, *args, **kwargs)
                norms.append(float(total))
                return total

            torch.nn.utils.clip_grad_norm_ = clip
            try:
                algo.local_train(ctx, model, {})
            finally:
                torch.nn.utils.clip_grad_norm_ = real_clip
            out["norms"][(c, r)] = norms
            updates.append(ClientUpdate(c, {k: v.detach().clone() for k, v in model.state_dict().items()},
                                        len(y), 0.0))
        server.round = r
        server.weights = algo.aggregate(server, updates)
        out["cloud"].append(dict(server.weights))
    out["drift"] = [-states[c]["feddyn/grad"] / out["alpha"][c] for c in range(len(data))]
    return out


@pytest.fixture(scope="module")
def reference():
    return federate({"reference_code": True})


def test_fixture_provenance_and_inputs():
    assert checked_settings(FIXTURE, generator) == S
    assert_weight_sums(generator.initial_weights(), FIXTURE)
    for c in range(len(S["sizes"])):
        x, y = generator.client_data(c)
        assert torch.equal(x, FIXTURE[f"client{c}/x"]) and torch.equal(y, FIXTURE[f"client{c}/y"])
    # the fixture exercises what the mode adds: unequal alphas, a round without every client, clipped steps
    assert len({float(FIXTURE[f"alpha/client{c}"]) for c in range(3)}) == 3
    assert any(len(FIXTURE[f"selected/r{r}"]) < 3 for r in range(S["rounds"]))
    norms = torch.cat([v for k, v in FIXTURE.tensors.items() if k.startswith("grad_norm/")])
    assert (norms > S["max_norm"]).any() and (norms < S["max_norm"]).any()


def test_alpha_per_client_comes_from_the_setup_exchange(reference):
    for c, alpha in enumerate(reference["alpha"]):
        assert alpha == pytest.approx(float(FIXTURE[f"alpha/client{c}"]), rel=1e-7)  # the scale is kept in float32


def test_every_step_and_round_matches_train_fedDyn(reference):
    for (c, r), norms in reference["norms"].items():
        expected = FIXTURE[f"grad_norm/client{c}/r{r}"]
        assert relative_error(torch.tensor(norms, dtype=torch.float64), expected) <= TOLERANCE["norm"], (c, r)
    for r, weights in enumerate(reference["cloud"]):
        expected = FIXTURE.group(f"cloud/r{r}/")
        assert set(expected) == set(weights)
        for key, value in expected.items():
            assert relative_error(weights[key], value) <= TOLERANCE["weights"], (r, key)
    drift = FIXTURE["drift"]
    for c, mine in enumerate(reference["drift"]):
        assert relative_error(mine.float(), drift[c]) <= TOLERANCE["drift"], c


@pytest.mark.parametrize("hparams", [{}, {"alpha_scaling": "data_size"}, {"clip_grad_norm": 10.0}],
                         ids=["paper", "no-clipping", "one-alpha"])
def test_the_fixture_tells_each_code_choice_from_the_paper(hparams):
    """Without either of the code's two choices, the last server model is far outside the bar."""
    last = federate(hparams)["cloud"][-1]
    expected = FIXTURE.group(f"cloud/r{S['rounds'] - 1}/")
    assert max(relative_error(last[k], v) for k, v in expected.items()) > 100 * TOLERANCE["weights"]
