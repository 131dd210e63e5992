"""FPL (issue 25): the local loss (CE + CPCL + UPCR) by hand through a forward pass, the server's FINCH
cluster prototypes and unbiased prototypes on a hand case, the prototypes' bytes, and resume.

The method x topology matrix and the learning check run it end to end (it is registered).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import weighted_average
from fedstyle.algorithms.context import ClientContext, ClientUpdate, ServerContext
from fedstyle.algorithms.fpl import (CLASSES, FPL, PROTOS, SERVER_CLASSES, SERVER_PROTOS, cluster_prototypes,
                                     unbiased_prototypes)
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment

from run_records import evaluations
from tiny import SETTINGS, interrupt_and_resume, make_clients, make_model

CPU = torch.device("cpu")


def _ctx(data, seed=0) -> ClientContext:
    return ClientContext(client_id=0, data=data, state={}, train=SETTINGS.train_settings(0), round=1,
                         num_clients=1, device=CPU, seed=seed)


def _batch(n=8):
    data = make_clients(1, per_client=n)[0]  # labels 0, 1, 2, 3, 0, 1, ...
    x, y, _ = next(data.batches(n, torch.Generator().manual_seed(0), CPU, steps=1))
    return data, x, y


# -- the local loss, by hand ------------------------------------------------------------------------------------------
def _by_hand(logits, z, y, protos, classes, tau, upcr):
    """Eq. 11 + Eq. 8 + Eq. 10 with Python loops over samples, prototypes and dimensions."""
    B, d = z.shape
    ce = cpcl = reg = 0.0
    for i in range(B):
        row = logits[i].tolist()
        ce += math.log(sum(math.exp(v) for v in row)) - row[int(y[i])]
        mine = [j for j in range(len(classes)) if int(classes[j]) == int(y[i])]
        if not mine:
            continue  # a class with no prototype: no CPCL, no UPCR (still counted in the batch)
        zi = z[i].tolist()
        norm = math.sqrt(sum(v * v for v in zi))

        def s(j):  # Eq. 7
            c = protos[j].tolist()
            return sum(a * b for a, b in zip(zi, c)) / (norm * math.sqrt(sum(v * v for v in c))) / tau

        everything = sum(math.exp(s(j)) for j in range(len(classes)))
        cpcl += -math.log(sum(math.exp(s(j)) for j in mine) / everything)
        u = [sum(float(protos[j][v]) for j in mine) / len(mine) for v in range(d)]  # Eq. 6
        sq = sum((zi[v] - u[v]) ** 2 for v in range(d))
        reg += sq if upcr == "sum" else sq / d
    return ce / B, cpcl / B, reg / B


@pytest.mark.parametrize("upcr,tau", [("mean", 0.02), ("mean", 0.5), ("sum", 0.1)])
def test_training_loss_is_ce_plus_cpcl_plus_upcr_by_hand(upcr, tau):
    """Through a full forward pass of a fixed-weight model: class 0 has two cluster prototypes, classes 1 and
    2 one each, class 3 none (its samples get CE only but count in the batch mean)."""
    algo, model = make_model("fpl", {"tau": tau, "upcr": upcr, "lambda_cpcl": 0.7, "lambda_upcr": 1.3})
    data, x, y = _batch()
    model.train()
    with torch.no_grad():  # the same batch, the same train-mode forward: the features and logits to check against
        z = model.features(x)
        logits = model.head(z)
    d = z.shape[1]
    g = torch.Generator().manual_seed(1)
    protos = z.mean(0) + torch.randn(4, d, generator=g)  # near the features: CPCL neither 0 nor saturated
    classes = torch.tensor([0, 1, 0, 2])
    ctx = _ctx(data)
    loss = algo.training_loss(ctx, model, x, y, {PROTOS: protos, CLASSES: classes})
    ce, cpcl, reg = _by_hand(logits, z, y, protos, classes, tau, upcr)
    assert float(loss.detach()) == pytest.approx(ce + 0.7 * cpcl + 1.3 * reg, rel=1e-4)
    metrics = ctx.logged_metrics()
    assert metrics["fpl_ce"] == pytest.approx(ce, rel=1e-4)
    assert metrics["fpl_cpcl"] == pytest.approx(cpcl, rel=1e-4) and cpcl > 0
    assert metrics["fpl_upcr"] == pytest.approx(reg, rel=1e-4) and reg > 0
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_round_zero_is_cross_entropy_and_a_lone_class_has_no_contrast():
    algo, model = make_model("fpl")
    data, x, y = _batch()
    model.train()
    loss = algo.training_loss(_ctx(data), model, x, y, {})  # no prototypes yet
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    ctx = _ctx(data)
    d = model.head.in_features
    algo.training_loss(ctx, model, x, y, {PROTOS: torch.ones(1, d), CLASSES: torch.tensor([1])})
    assert ctx.logged_metrics()["fpl_cpcl"] == 0.0  # no negative class: -log 1
    assert ctx.logged_metrics()["fpl_upcr"] > 0.0


def test_local_prototypes_are_class_means_of_the_trained_models_features():
    """Eq. 2 / Algorithm 1 (prototypes=local): after training, the mean eval-mode feature of each class
    over all local images; classes the client lacks are not uploaded."""
    algo, model = make_model("fpl")
    data = make_clients(1, per_client=12, classes=3)[0]  # classes 0-2 of 4
    result = algo.local_train(_ctx(data), model, {})
    model.eval()
    with torch.no_grad():
        z = model.features(data.transform(data.images, train=False))
    assert result.payload[CLASSES].tolist() == [0, 1, 2]
    expected = torch.stack([z[data.labels == k].mean(0) for k in range(3)])
    torch.testing.assert_close(result.payload[PROTOS], expected, rtol=1e-5, atol=1e-6)


def test_batch_prototypes_are_the_mean_of_the_rounds_training_features():
    algo, model = make_model("fpl", {"prototypes": "batches"})
    data, x, y = _batch(12)
    ctx = _ctx(data)
    model.train()
    with torch.no_grad():
        z = model.features(x)
    algo.training_loss(ctx, model, x, y, {})
    payload = algo.upload_payload(ctx, model)
    torch.testing.assert_close(payload[PROTOS], torch.stack([z[y == k].mean(0) for k in range(4)]),
                               rtol=1e-5, atol=1e-6)


# -- the server: cluster prototypes (FINCH) and unbiased prototypes ----------------------------------------------------
def _update(cid, protos, classes, weights):
    return ClientUpdate(client_id=cid, weights=weights, num_samples=10 + cid, train_loss=1.0,
                        payload={PROTOS: torch.stack(protos), CLASSES: torch.tensor(classes)})


def test_server_clusters_each_class_and_averages_the_clusters():
    """Class 0: three client prototypes along e1 and two along e2 -> two FINCH clusters (their means, Eq. 5),
    U = the mean of the two cluster means (Eq. 6), not of the five prototypes (Eq. 3's G). Class 1: one
    prototype, kept as its own cluster. Class 2: two prototypes -> one cluster, their mean."""
    algo, model = make_model("fpl", n_clients=5)
    e1, e2, e3 = torch.eye(3)
    a = [e1 + torch.tensor([0.0, 0.05, 0.01]), e1 + torch.tensor([0.0, 0.02, 0.04]), e1 * 2 + torch.tensor([0.0, 0.0, 0.1])]
    b = [e2 + torch.tensor([0.03, 0.0, 0.0]), e2 * 3 + torch.tensor([0.0, 0.0, 0.2])]
    c2 = [e3 + 0.1, e3 + torch.tensor([0.2, 0.0, 0.0])]
    weights = [{k: v + i for k, v in model.state_dict().items()} for i in range(5)]
    updates = [_update(0, [a[0], c2[0]], [0, 2], weights[0]), _update(1, [a[1]], [0], weights[1]),
               _update(2, [b[0], e1 + e2], [0, 1], weights[2]), _update(3, [a[2], c2[1]], [0, 2], weights[3]),
               _update(4, [b[1]], [0], weights[4])]
    server = ServerContext(weights=model.state_dict(), state={}, round=0, num_clients=5, seed=0)
    assert algo.round_payloads(server, [0, 1], {}) == {}  # round 0: nothing to send
    out = algo.aggregate(server, updates)
    fedavg = weighted_average(updates)
    assert all(torch.equal(out[k], fedavg[k]) for k in fedavg)  # the weights: FedAvg

    protos, classes = server.state[SERVER_PROTOS], server.state[SERVER_CLASSES]
    assert classes.tolist() == [0, 0, 1, 2]
    mean_a, mean_b = torch.stack(a).mean(0), torch.stack(b).mean(0)
    got = sorted(protos[:2].tolist())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(sorted([mean_a.tolist(), mean_b.tolist()])))
    torch.testing.assert_close(protos[2], e1 + e2)
    torch.testing.assert_close(protos[3], torch.stack(c2).mean(0))

    unbiased, present = unbiased_prototypes(protos, classes)
    assert present.tolist() == [0, 1, 2]
    torch.testing.assert_close(unbiased[0], (mean_a + mean_b) / 2)
    assert not torch.allclose(unbiased[0], torch.stack(a + b).mean(0))  # not the biased global prototype
    sent = algo.round_payloads(server, [1, 3], {})
    assert set(sent) == {1, 3} and torch.equal(sent[3][PROTOS], protos) and torch.equal(sent[3][CLASSES], classes)


def test_partition_option_reaches_finch():
    by_class = {0: [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.1]), torch.tensor([0.0, 1.0]),
                    torch.tensor([0.1, 1.0])]}
    assert cluster_prototypes(by_class, "coarsest")[0].shape[0] == 2
    assert cluster_prototypes(by_class, 1)[0].shape[0] == 1
    torch.testing.assert_close(cluster_prototypes(by_class, 1)[0][0], torch.stack(by_class[0]).mean(0))


def test_options_are_checked_and_reference_code_sets_the_public_codes_choices():
    assert FPL.resolve({"reference_code": True})["tau"] == 0.02
    assert FPL.resolve({"reference_code": True})["prototypes"] == "batches"
    assert FPL.resolve({"reference_code": True, "tau": 0.05})["tau"] == 0.05
    with pytest.raises(ConfigError, match="tau"):
        FPL.resolve({"tau": 0})
    with pytest.raises(ConfigError, match="partition"):
        FPL.resolve({"partition": "middle"})


# -- runs: bytes and resume ---------------------------------------------------------------------------------------------
def test_prototypes_travel_and_are_counted(tiny_config, tmp_path):
    """Each round every client uploads one 64-float prototype (ConvNet at 16x16) and an int64 class per class
    it holds; from round 2 on each client receives the cluster prototypes."""
    config = tiny_config.updated(method="fpl", partition="per_domain", clients=3, clients_per_round=3, rounds=3)
    run_experiment(config, tmp_path / "run", quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train_loss" in r]
    per_proto = 64 * 4 + 8
    assert len(rows) == 3
    for r in rows:
        assert r["bytes_payload_up"] > 0 and r["bytes_payload_up"] % per_proto == 0
        assert r["bytes_up"] == r["bytes_model_up"] + r["bytes_payload_up"]
    assert rows[0]["bytes_payload_down"] == 0 and "fpl_cpcl" not in rows[0]["train_metrics"]
    assert all(r["bytes_payload_down"] > 0 and r["bytes_payload_down"] % (3 * per_proto) == 0 for r in rows[1:])
    assert all("fpl_cpcl" in r["train_metrics"] and "fpl_upcr" in r["train_metrics"] for r in rows[1:])


def test_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    """The cluster prototypes live in server.state: a run cut when round 3 starts and resumed equals one that was not."""
    config = tiny_config.updated(method="fpl", partition="per_domain", clients=6, clients_per_round=3, rounds=4)
    run_experiment(config, tmp_path / "full", quiet=True)
    interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    full = evaluations(tmp_path / "full")
    assert len(full) == 4 and evaluations(tmp_path / "cut") == full
