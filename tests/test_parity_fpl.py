"""Parity of fpl's reference mode with WenkeHuang/RethinkFL (fixture: ``python -m parity.fpl``, see its docstring).

The server's FINCH cluster prototypes (``FPL.aggregate``) from the fixture's client prototypes, and one local
step of client 0 through ``FPL.training_loss`` on fedstyle's ConvNet with the generator's seeded weights: the
CE, CPCL and UPCR terms, every weight's gradient and the batch prototypes the client uploads.
"""

from __future__ import annotations

import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.context import ClientUpdate, ServerContext, TrainSettings
from fedstyle.algorithms.fpl import CLASSES, PROTOS, SERVER_CLASSES, SERVER_PROTOS
from fedstyle.models import build_model
from parity import fpl as generator
from parity.common import relative_error

from parity_steps import (checked_settings, client_context, compare_step, load_authors_state, parity_fixture,
                          placeholder_data, run_step)

fixture = parity_fixture("fpl")


def _setup(fixture):
    algo = METHODS.get("fpl")({"reference_code": True}, num_classes=generator.NUM_CLASSES,
                              num_clients=len(generator.CLIENT_CLASSES))
    torch.manual_seed(0)
    model = build_model("convnet", generator.NUM_CLASSES, generator.SIZE)
    algo.configure_model(model)
    load_authors_state(model, generator.model_state(), fixture, approx=1e-12)
    return algo, model


def _aggregate(algo, model, fixture):
    updates = [ClientUpdate(client_id=c, weights=model.state_dict(), num_samples=10, train_loss=1.0,
                            payload={PROTOS: fixture[f"client/{c}/protos"], CLASSES: fixture[f"client/{c}/classes"]})
               for c in range(len(generator.CLIENT_CLASSES))]
    server = ServerContext(weights=model.state_dict(), state={}, round=0, num_clients=len(updates), seed=0)
    algo.aggregate(server, updates)
    return server


def test_fixture_is_the_generators(fixture):
    settings = checked_settings(fixture, generator)
    assert {k: settings[k] for k in generator.SETTINGS} == {k: (list(map(list, v)) if k == "client_classes" else
                                                                list(v) if isinstance(v, tuple) else v)
                                                            for k, v in generator.SETTINGS.items()}
    for c, (protos, classes) in enumerate(generator.client_prototypes()):
        assert torch.equal(fixture[f"client/{c}/protos"], protos)
        assert torch.equal(fixture[f"client/{c}/classes"], classes)
    assert torch.equal(fixture["labels"], generator.batch()[1])


def test_reference_code_uses_the_codes_temperature_and_batch_prototypes():
    hp = METHODS.get("fpl").resolve({"reference_code": True})
    assert hp["tau"] == generator.TAU and hp["prototypes"] == "batches"


def test_server_cluster_prototypes_match_the_authors_finch(fixture):
    algo, model = _setup(fixture)
    server = _aggregate(algo, model, fixture)
    protos, classes = server.state[SERVER_PROTOS], server.state[SERVER_CLASSES]
    expected = fixture.group("cluster/")
    assert sorted(set(classes.tolist())) == sorted(int(k) for k in expected)
    for k, theirs in expected.items():
        ours = protos[classes == int(k)]
        assert ours.shape == theirs.shape, f"class {k}: {ours.shape[0]} clusters, the authors' FINCH {theirs.shape[0]}"
        assert relative_error(ours, theirs) < 1e-6, k


def test_local_step_loss_gradients_and_prototypes_match(fixture):
    algo, model = _setup(fixture)
    server = _aggregate(algo, model, fixture)
    payload = algo.round_payloads(server, [0], {})[0]
    x, y = generator.batch()
    ctx = client_context(placeholder_data(y, generator.SIZE), TrainSettings(lr=generator.LR, batch_size=len(y)),
                         round=1, num_clients=len(generator.CLIENT_CLASSES))
    model.train()
    step = run_step(algo, model, x, y, payload, ctx=ctx, hooks=())
    logged = ctx.logged_metrics()
    result = compare_step(fixture, step, "loss/", loss="total", grad_prefix="grad/",
                          **{name: torch.tensor([logged[f"fpl_{name}"]]) for name in ("ce", "cpcl", "upcr")})
    assert max(result.errors.values()) < 1e-5, result.errors
    assert result.grad < 1e-4, {k: v for k, v in result.grads.items() if v >= 1e-4}

    upload = algo.upload_payload(ctx, model)
    theirs = fixture.group("local/")
    assert upload[CLASSES].tolist() == sorted(int(k) for k in theirs)
    for row, k in enumerate(upload[CLASSES].tolist()):
        assert relative_error(upload[PROTOS][row], theirs[str(k)]) < 1e-5, k


def test_batch_prototypes_come_from_the_rounds_last_local_epoch():
    """The code collects its prototypes during the last local epoch only (``models/fpl.py:189-196``): with 10
    images in batches of 5 (2 steps an epoch) and 3 local steps, the last 2 steps' features."""
    algo = METHODS.get("fpl")({"reference_code": True}, num_classes=2, num_clients=2)
    y = torch.tensor([0, 1, 0, 1, 0])
    ctx = client_context(placeholder_data(torch.arange(10) % 2, 4), TrainSettings(lr=0.1, batch_size=5, local_steps=3),
                         num_clients=2)
    model = build_model("convnet", 2, 16)
    model.train()
    features = []
    for step in range(3):
        x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(step))
        with torch.no_grad():
            features.append(model.features(x))  # train mode: the batch statistics, as training_loss sees them
        algo.training_loss(ctx, model, x, y, {})
    payload = algo.upload_payload(ctx, model)
    last = torch.cat(features[1:])
    expected = torch.stack([last[torch.cat([y, y]) == k].mean(0) for k in (0, 1)])
    assert payload[CLASSES].tolist() == [0, 1] and relative_error(payload[PROTOS], expected) < 1e-6
