"""Parity of gPerXAN's ``reference_code`` mode with two rounds of the authors' ``Client.fit`` and ``FedAvg`` strategy
(fixture: ``python -m parity.gperxan``; see its docstring for what the authors' code ran on): every step's loss,
each client's returned state (its personalised BatchNorm branch included), the server's evaluation model, and
which keys come down."""

from __future__ import annotations

import math

import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.context import ClientContext, ClientUpdate, ServerContext, TrainSettings
from parity import gperxan as generator
from parity.common import read_fixture, relative_error

from parity_steps import assert_weight_sums, checked_settings

FIXTURE = read_fixture("gperxan")
#: float32 rounding: measured 8.0e-7 on the weights, the largest on the BatchNorm branch's scores (|s| ~ 0.01, so
#: 1.1e-8 absolute; the other tensors <= 2.8e-7), and 2.7e-7 on the 10 step losses (CE + 0.5 CE of the frozen classifier)
TOLERANCE = 2e-6


def test_fixture_provenance_and_inputs():
    assert checked_settings(FIXTURE, generator) == generator.SETTINGS
    assert_weight_sums(generator.fedstyle_model().state_dict(), FIXTURE)
    for i, (images, labels) in enumerate(generator.data()):
        assert torch.equal(images, FIXTURE[f"images{i}"]) and torch.equal(labels, FIXTURE[f"labels{i}"])


@pytest.mark.parametrize("reference", [True, False])
def test_two_rounds_match_the_authors_code(reference):
    """reference_code=true matches; by default the BatchNorm branch's score comes down averaged, which the code's
    key filter keeps on the client (one more key per layer comes down: 4 here)."""
    settings = generator.SETTINGS
    algo = METHODS.get("gperxan")({"reference_code": reference}, num_classes=settings["classes"],
                                  num_clients=generator.CLIENTS)
    model = generator.fedstyle_model(algo)
    local = algo.local_keys(model)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    download = [k for k in initial if k not in local]
    down_count = int(FIXTURE["round0/down_count"])
    if not reference:
        assert len(download) == down_count + len(algo.norm_names)
        return
    assert len(download) == down_count and all("batchnorm" not in k for k in download)  # the code's key filter
    server = ServerContext(weights=initial, state={}, round=0, num_clients=generator.CLIENTS, seed=0)
    own = [{k: initial[k].clone() for k in local} for _ in range(generator.CLIENTS)]
    losses, worst = [], 0.0
    for r in range(settings["rounds"]):
        global_weights = {k: server.weights[k].clone() for k in download}
        updates = []
        for i, n in enumerate(settings["sizes"]):
            lr = float(FIXTURE[f"round{r}/client{i}/lr"])
            assert lr == pytest.approx(settings["lr"] * (1 + math.cos(math.pi * (r + 1) / settings["t_max"])) / 2)
            model.load_state_dict({**global_weights, **own[i]})
            model.train()
            train = TrainSettings(lr=lr, batch_size=generator.BATCH, momentum=settings["momentum"],
                                  weight_decay=settings["weight_decay"])
            ctx = ClientContext(i, None, {}, train, r, generator.CLIENTS, torch.device("cpu"), 0)
            ctx.global_weights = global_weights
            optimizer = train.make_optimizer(model.parameters())
            x_all = generator.transform(FIXTURE[f"images{i}"])
            labels = FIXTURE[f"labels{i}"]
            for b in range(0, n, generator.BATCH):
                losses.append(algo.training_step(ctx, model, optimizer, x_all[b:b + generator.BATCH],
                                                 labels[b:b + generator.BATCH], {}))
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            for key, value in FIXTURE.group(f"round{r}/client{i}/").items():
                if key != "lr":
                    worst = max(worst, relative_error(state[key], value))
            own[i] = {k: state[k] for k in local}
            updates.append(ClientUpdate(i, state, n, 0.0))
        server.weights = algo.aggregate(server, updates)  # size-weighted, as Flower's FedAvg
        for key, value in FIXTURE.group(f"round{r}/server/").items():
            if not key.endswith("num_batches_tracked"):  # Flower averages the counter as a float; fedstyle rounds it
                worst = max(worst, relative_error(server.weights[key], value))
    assert worst <= TOLERANCE
    expected = torch.cat([FIXTURE["round0/losses"], FIXTURE["round1/losses"]])
    assert relative_error(torch.stack(losses), expected) <= TOLERANCE
