"""Parity of FedProx with five rounds of the authors' solver and averaging (litian96/FedProx; fixture:
``python -m parity.fedprox``, see its docstring): each sampled client's solution and the averaged model.

The test replays the code's sampled clients and batch orders, so it compares the method: the proximal step
w <- w - lr (grad + mu (w - w*)) and the average by sample count. fedstyle's own sampler and batches are not the
code's, and the code's optimiser is plain SGD: momentum 0 and weight decay 0 here (fedstyle's run defaults are
0.9 and 5e-4). FedProx has no ``reference_code`` mode: its method's choices are fedstyle's."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms.context import ClientUpdate, ServerContext, TrainSettings
from fedstyle.algorithms.fedprox import FedProx
from parity import fedprox as generator
from parity.common import read_fixture, relative_error

from parity_steps import assert_weight_sums, checked_settings, client_context, placeholder_data

FIXTURE = read_fixture("fedprox")
S = generator.SETTINGS
#: float32 SGD in TensorFlow and in torch, 5 rounds of 4-6 steps a client: measured on this CPU 2.5e-7
TOLERANCE = 1e-5


def as_torch(tf_weights: dict) -> dict[str, torch.Tensor]:
    """The code's dense/kernel (features x classes) and dense/bias as nn.Linear's weight and bias."""
    return {"weight": tf_weights["dense/kernel"].t().contiguous(), "bias": tf_weights["dense/bias"].clone()}


def federate(mu: float) -> list[dict]:
    """The fixture's rounds through fedstyle's FedProx (its loss, local_train, aggregate) with the code's sampled
    clients and batch orders; per round, each client's solution and the new global weights."""
    algo = FedProx({"mu": mu}, num_classes=S["classes"], num_clients=len(S["sizes"]))
    model = torch.nn.Linear(S["features"], S["classes"])
    algo.configure_model(model)
    weights = as_torch(generator.initial_weights())
    rounds = []
    for r in range(S["rounds"]):
        updates, solutions = [], {}
        for c in FIXTURE[f"selected/r{r}"].tolist():
            model.load_state_dict(weights)
            x, y = FIXTURE[f"client{c}/x"], FIXTURE[f"client{c}/y"]
            batches = []
            for epoch in range(S["epochs"]):  # batch_data: the epoch's order, cut in batches
                order = FIXTURE[f"order/r{r}/client{c}/e{epoch}"]
                batches += [(x[order[i:i + S["batch_size"]]], y[order[i:i + S["batch_size"]]])
                            for i in range(0, len(order), S["batch_size"])]
            ctx = client_context(placeholder_data(y, 4), TrainSettings(
                lr=S["lr"], batch_size=S["batch_size"], local_steps=len(batches), momentum=0.0, weight_decay=0.0),
                round=r, num_clients=len(S["sizes"]))
            ctx.client_id, ctx.global_weights = c, {k: v.clone() for k, v in weights.items()}
            algo.training_batches = lambda ctx, batches=batches: iter(batches)
            algo.local_train(ctx, model, {})
            solutions[c] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            updates.append(ClientUpdate(c, solutions[c], len(y), 0.0))
        server = ServerContext(weights=weights, state={}, round=r, num_clients=len(S["sizes"]), seed=0)
        weights = algo.aggregate(server, updates)
        rounds.append({"solutions": solutions, "global": weights})
    return rounds


def test_fixture_provenance_and_inputs():
    assert checked_settings(FIXTURE, generator) == S
    assert_weight_sums(generator.initial_weights(), FIXTURE)
    for c in range(len(S["sizes"])):
        x, y = generator.client_data(c)
        assert torch.equal(torch.from_numpy(x), FIXTURE[f"client{c}/x"])
        assert torch.equal(torch.from_numpy(y), FIXTURE[f"client{c}/y"])
    # batch_data reshuffles every epoch: the orders differ, and each is a permutation of the client's samples
    c = FIXTURE["selected/r0"].tolist()[0]
    first, second = FIXTURE[f"order/r0/client{c}/e0"], FIXTURE[f"order/r0/client{c}/e1"]
    assert not torch.equal(first, second) and sorted(first.tolist()) == list(range(S["sizes"][c]))
    sampled = {c for r in range(S["rounds"]) for c in FIXTURE[f"selected/r{r}"].tolist()}
    assert sampled == set(range(len(S["sizes"])))  # every client trains in some round


def test_two_rounds_match_the_codes_solver_and_average():
    for r, result in enumerate(federate(S["mu"])):
        for c, solution in result["solutions"].items():
            expected = as_torch(FIXTURE.group(f"solution/r{r}/client{c}/"))
            for key, value in expected.items():
                assert relative_error(solution[key], value) <= TOLERANCE, (r, c, key)
        expected = as_torch(FIXTURE.group(f"global/r{r}/"))
        for key, value in expected.items():
            assert relative_error(result["global"][key].float(), value.float()) <= TOLERANCE, (r, key)


@pytest.mark.parametrize("mu", [0.0, 0.25])
def test_the_fixture_tells_mu_apart(mu):
    """Without the proximal term, or with half of it, the last model is far outside the bar."""
    last = federate(mu)[-1]["global"]
    expected = as_torch(FIXTURE.group(f"global/r{S['rounds'] - 1}/"))
    assert max(relative_error(last[k].float(), v.float()) for k, v in expected.items()) > 100 * TOLERANCE
