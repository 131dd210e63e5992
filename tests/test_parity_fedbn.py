"""Parity of FedBN's ``reference_code`` mode with two rounds of the authors' ``train`` and ``communication``
(med-air/FedBN; fixture: ``python -m parity.fedbn``, see its docstring): every client's state after each round,
BatchNorm layers kept, the rest averaged, and the server's averaged entries."""

from __future__ import annotations

import math

import pytest
import torch

from fedstyle.algorithms.context import ClientUpdate, ServerContext, TrainSettings
from fedstyle.algorithms.fedbn import FedBN
from parity import fedbn as generator
from parity.common import read_fixture, relative_error

from parity_steps import assert_weight_sums, checked_settings, client_context, placeholder_data

FIXTURE = read_fixture("fedbn")
S = generator.SETTINGS
#: float32 training, 2 rounds of 2-4 steps; measured on this CPU: 1.2e-7 (states and server)
TOLERANCE = 1e-5


def federate(hparams: dict) -> list[dict]:
    """The fixture's two rounds through fedstyle's FedBN (its local keys, local_train, aggregate); per round, the
    server's new weights and each client's state as it would enter the next round."""
    algo = FedBN(hparams, num_classes=S["classes"], num_clients=len(S["sizes"]))
    model = generator.build_model()
    algo.configure_model(model)
    local = algo.local_keys(model)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    own = [{k: initial[k].clone() for k in local} for _ in S["sizes"]]  # each client's BatchNorm layers
    weights = initial
    rounds = []
    for r in range(S["rounds"]):
        updates = []
        for c, n in enumerate(S["sizes"]):
            model.load_state_dict({**weights, **own[c]})
            x, y = FIXTURE[f"client{c}/x"], FIXTURE[f"client{c}/y"]
            ctx = client_context(placeholder_data(y, 4), TrainSettings(
                lr=S["lr"], batch_size=S["batch_size"], local_steps=math.ceil(n / S["batch_size"]), momentum=0.0,
                weight_decay=0.0), round=r, num_clients=len(S["sizes"]))
            ctx.client_id = c
            batches = [(x[i:i + S["batch_size"]], y[i:i + S["batch_size"]]) for i in range(0, n, S["batch_size"])]
            algo.training_batches = lambda ctx, batches=batches: iter(batches)
            algo.local_train(ctx, model, {})
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            own[c] = {k: state[k] for k in local}
            updates.append(ClientUpdate(c, state, n, 0.0))
        server = ServerContext(weights=weights, state={}, round=r, num_clients=len(S["sizes"]), seed=0)
        weights = algo.aggregate(server, updates)
        rounds.append({"server": {k: v for k, v in weights.items() if k not in local},
                       "clients": [{**weights, **own[c]} for c in range(len(S["sizes"]))]})
    return rounds


def test_fixture_provenance_and_inputs():
    assert checked_settings(FIXTURE, generator) == S
    assert_weight_sums(generator.build_model().state_dict(), FIXTURE)
    for c in range(len(S["sizes"])):
        x, y = generator.client_data(c)
        assert torch.equal(x, FIXTURE[f"client{c}/x"]) and torch.equal(y, FIXTURE[f"client{c}/y"])


def test_fedstyles_local_layers_are_the_codes_bn_entries():
    model = generator.build_model()
    local = FedBN({}, num_classes=S["classes"], num_clients=3).local_keys(model)
    assert local == {k for k in model.state_dict() if "bn" in k}  # communication()'s rule, fed_digits.py:169


@pytest.mark.parametrize("hparams", [{}, {"reference_code": True}], ids=["default", "reference_code"])
def test_two_rounds_match_train_and_communication(hparams):
    """The default is the code's (and Algorithm 1's) 1/K average, so both settings match the fixture."""
    for r, result in enumerate(federate(hparams)):
        expected = FIXTURE.group(f"server/r{r}/")
        assert set(expected) == set(result["server"])
        for key, value in expected.items():
            assert relative_error(result["server"][key], value) <= TOLERANCE, (r, key)
        for c, state in enumerate(result["clients"]):
            for key, value in FIXTURE.group(f"client{c}/r{r}/").items():
                if value.is_floating_point():
                    assert relative_error(state[key], value) <= TOLERANCE, (r, c, key)
                else:  # BatchNorm's step counters: each client's own
                    assert torch.equal(state[key], value), (r, c, key)


def test_the_fixture_tells_the_codes_average_from_weighting_by_size():
    last = federate({"aggregation": "size"})[-1]["server"]
    expected = FIXTURE.group(f"server/r{S['rounds'] - 1}/")
    assert max(relative_error(last[k], v) for k, v in expected.items()) > 100 * TOLERANCE
