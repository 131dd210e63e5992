"""FedGCA (issue 12) and the augment= option every method accepts: the loss terms on hand values, their
invariants, the composition of Eq. 6, the bad inputs, and runs through both simulators."""

from __future__ import annotations

import copy
import json
import math

import networkx as nx
import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.context import ClientContext, TrainSettings
from fedstyle.algorithms.consistency import cam_consistency, cam_distribution, prediction_consistency
from fedstyle.errors import ConfigError
from fedstyle.federation.p2p import P2PSimulator
from fedstyle.federation.star import StarSimulator
from fedstyle.models.base import Neck

from tiny import SETTINGS, make_clients, make_model, interrupt_and_resume

CPU = torch.device("cpu")


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


# -- L_CP (Eq. 2) ----------------------------------------------------------------------------------
def test_prediction_consistency_on_hand_values():
    p = torch.tensor([[[0.8, 0.2]], [[0.4, 0.6]]])  # V = 2 views, B = 1, K = 2
    pg = torch.tensor([[[0.6, 0.4]], [[0.2, 0.8]]])
    mean = [0.5, 0.5]  # of the four predictions
    js = _kl([0.8, 0.2], mean) + _kl([0.4, 0.6], mean)
    assert prediction_consistency(p, pg, "js").item() == pytest.approx(js, rel=1e-6)
    ce = -sum(pk * math.log(m) + (1 - pk) * math.log(1 - m) for row in ([0.8, 0.2], [0.4, 0.6])
              for pk, m in zip(row, mean))
    assert prediction_consistency(p, pg, "ce").item() == pytest.approx(ce, rel=1e-6)
    entropy = -sum(pk * math.log(pk) + (1 - pk) * math.log(1 - pk) for pk in (0.8, 0.2, 0.4, 0.6))
    assert prediction_consistency(p, pg, "bkl").item() == pytest.approx(ce - entropy, rel=1e-6)
    local_mean = [0.6, 0.4]  # cp_global=false: P alone
    assert prediction_consistency(p, None, "js").item() == pytest.approx(
        _kl([0.8, 0.2], local_mean) + _kl([0.4, 0.6], local_mean), rel=1e-6)
    assert prediction_consistency(p, pg, "js", reduction="mean").item() == pytest.approx(js / 2, rel=1e-6)


@pytest.mark.parametrize("form", ["bkl", "js"])
def test_prediction_consistency_is_zero_when_all_predictions_agree_and_positive_otherwise(form):
    p = torch.softmax(torch.randn(1, 5, 7), -1).expand(4, 5, 7)
    assert prediction_consistency(p, p.clone(), form).item() == pytest.approx(0.0, abs=1e-6)
    q = torch.softmax(torch.randn(4, 5, 7), -1)
    assert prediction_consistency(q, p.clone(), form).item() > 1e-3


# -- L_CAM (Eq. 3) ---------------------------------------------------------------------------------
def test_cam_distributions_sum_to_one_and_identical_maps_cost_nothing():
    cams = torch.randn(6, 2, 2) * 5
    m = cam_distribution(cams)
    assert m.shape == (6, 4) and torch.allclose(m.sum(1), torch.ones(6)) and (m > 0).all()
    same = m.view(3, 2, 4)[:1].expand(3, 2, 4)
    assert cam_consistency(same, same.clone()).item() == pytest.approx(0.0, abs=1e-6)
    assert cam_consistency(m.view(3, 2, 4), None).item() > 0


def test_cam_consistency_on_hand_values():
    local = torch.tensor([[[0.7, 0.1, 0.1, 0.1]]])  # V = 1, B = 1, h*w = 4
    glob = torch.tensor([[[0.1, 0.1, 0.1, 0.7]]])
    mean = [0.4, 0.1, 0.1, 0.4]
    assert cam_consistency(local, glob).item() == pytest.approx(_kl([0.7, 0.1, 0.1, 0.1], mean), rel=1e-6)
    cams = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # softmax -> (1, 3, 1, 1) / 6
    assert torch.allclose(cam_distribution(cams), torch.tensor([[1 / 6, 0.5, 1 / 6, 1 / 6]]))
    assert torch.allclose(cam_distribution(cams * 2, temperature=2.0), cam_distribution(cams))


# -- the local objective (Eq. 6) -------------------------------------------------------------------
def _context(model, clients, cid=0):
    ctx = ClientContext(client_id=cid, data=clients[cid], state={}, train=TrainSettings(lr=0.05, batch_size=8),
                        round=0, num_clients=len(clients), device=CPU, seed=11)
    ctx.global_weights = {k: v.clone() for k, v in model.state_dict().items()}
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    ctx.global_model_source = lambda: frozen
    return ctx


def _batch(clients, n=8):
    x, y, _ = next(clients[0].batches(n, torch.Generator().manual_seed(0), CPU, 1))
    return x, y


def test_a_local_model_equal_to_the_global_one_has_no_consistency_loss():
    """Eval mode (the global model's BatchNorm statistics), one view: P = P^G and M = M^G, so L_GC = 0 and
    the loss is the cross-entropy alone."""
    algo, model = make_model("fedgca", {"augment": "none", "use_oc": False}, size=32)
    clients = make_clients(size=32)
    ctx = _context(model, clients)
    x, y = _batch(clients)
    model.eval()
    loss = algo.training_loss(ctx, model, x, y, {})
    logged = ctx.logged_metrics()
    assert logged["loss_cp"] == pytest.approx(0.0, abs=1e-6) and logged["loss_cam"] == pytest.approx(0.0, abs=1e-6)
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-6)
    assert "loss_oc" not in logged


def test_the_total_loss_is_ce_plus_alpha_oc_plus_beta_gc_and_every_term_is_logged():
    algo, model = make_model("fedgca", {"alpha": 0.5, "beta": 2.0}, size=32)
    clients = make_clients(size=32)
    ctx = _context(model, clients)
    algo.init_client_state(ctx, model)
    ctx.state["feddyn/grad"] = torch.randn_like(ctx.state["feddyn/grad"]) * 0.01  # a nonzero lambda_i
    ctx.scratch["fedgca/anchor"] = algo.regularizer.anchor(ctx, model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # w != w^t
    x, y = _batch(clients)
    torch.manual_seed(0)
    xa, ya = algo.augment_batch(ctx, x, y)
    assert xa.shape[0] == 4 * x.shape[0] and torch.equal(xa[: x.shape[0]], x) and torch.equal(ya, y.repeat(4))
    model.train()
    loss = algo.training_loss(ctx, model, xa, ya, {})
    m = ctx.logged_metrics()
    assert set(m) >= {"loss_ce", "loss_cp", "loss_cam", "loss_gc", "loss_oc", "augment_seconds",
                      "global_forward_seconds"}
    assert m["loss_gc"] == pytest.approx(m["loss_cp"] + m["loss_cam"], rel=1e-5)
    assert m["loss_cp"] > 0 and m["loss_cam"] > 0
    assert loss.item() == pytest.approx(m["loss_ce"] + 0.5 * m["loss_oc"] + 2.0 * m["loss_gc"], rel=1e-5)
    w = torch.cat([p.reshape(-1) for p in model.parameters()])
    anchor, lam = ctx.scratch["fedgca/anchor"], ctx.state["feddyn/grad"]
    oc = -(1 / 0.5) * torch.dot(lam, w) + 0.5 * torch.sum((w - anchor) ** 2)  # Eq. 5
    assert m["loss_oc"] == pytest.approx(oc.item(), rel=1e-4)


def test_ablations_drop_their_terms_and_get_their_own_labels():
    cls = METHODS.get("fedgca")
    labels = {cls.display_name(cls.resolve(hp)) for hp in (
        {}, {"use_cp": False}, {"use_cam": False}, {"use_oc": False}, {"augment": "none"}, {"cp_global": False},
        {"augment": "randconv"})}
    assert labels == {"FedGCA", "FedGCA w/o L_CP", "FedGCA w/o L_CAM", "FedGCA w/o L_OC", "FedGCA w/o augmentation",
                      "FedGCA w/o P^G", "FedGCA + RC"}
    algo, model = make_model("fedgca", {"use_cp": False, "use_cam": False, "use_oc": False}, size=32)
    clients = make_clients(size=32)
    ctx = _context(model, clients)
    x, y = _batch(clients)
    xa, ya = algo.augment_batch(ctx, x, y)
    loss = algo.training_loss(ctx, model, xa, ya, {})
    assert set(ctx.logged_metrics()) == {"loss_ce", "augment_seconds"}  # no global forward either
    assert algo.regularizer is None and loss.item() == pytest.approx(F.cross_entropy(model(xa), ya).item(), rel=1e-5)


# -- bad inputs ------------------------------------------------------------------------------------
class MaxNeck(Neck):
    def out_dim(self, backbone):
        return 64

    def forward(self, maps):
        return maps.amax((2, 3))


def test_bad_inputs_are_one_line_errors():
    cls = METHODS.get("fedgca")
    with pytest.raises(ConfigError, match="augment_views >= 1") as err:
        cls({"augment_views": 0}, num_classes=4, num_clients=3)
    assert "\n" not in str(err.value)
    cls({"augment_views": 0, "augment": "none"}, num_classes=4, num_clients=3)  # no augmentation: J is unused
    for method in ("fedgca", "fedavg", "feddyn"):
        with pytest.raises(ConfigError, match="augment.*'cutout' is not one of none, augmix, complement"):
            METHODS.get(method)({"augment": "cutout"}, num_classes=4, num_clients=3)
    with pytest.raises(ConfigError, match="no option 'nope'"):
        METHODS.get("fedavg")({"augment": "randconv", "augment_args": "nope=1"}, num_classes=4, num_clients=3)
    algo = cls({}, num_classes=4, num_clients=3)
    _, model = make_model(size=32)
    model.set_neck(MaxNeck())
    with pytest.raises(ConfigError, match="L_CAM cannot use this model.*use_cam=false") as err:
        algo.configure_model(model)
    assert "\n" not in str(err.value)
    cls({"use_cam": False}, num_classes=4, num_clients=3).configure_model(model)


# -- augment= for every method ---------------------------------------------------------------------
def test_augment_labels_rows_and_keeps_the_batch_when_off():
    assert METHODS.get("fedavg").display_name(METHODS.get("fedavg").resolve({"augment": "randconv"})) == "FedAvg + RC"
    feddyn = METHODS.get("feddyn")
    assert feddyn.display_name(feddyn.resolve({"augment": "randconv", "augment_views": 2})) == "FedDyn + RC (2 views)"
    algo, model = make_model("fedavg", {"augment": "randconv", "augment_p": 0.0}, size=32)
    clients = make_clients(size=32)
    ctx = _context(model, clients)
    x, y = _batch(clients)
    xa, ya = algo.augment_batch(ctx, x, y)
    assert torch.equal(xa, x) and torch.equal(ya, y)  # p = 0: every sample stays clean
    algo, _ = make_model("fedavg", {"augment": "texture", "augment_p": 0.5}, size=32)
    torch.manual_seed(1)
    xa, _ = algo.augment_batch(ctx, x, y)
    same = (xa == x).flatten(1).all(1)
    assert 0 < int(same.sum()) < x.shape[0]  # some samples kept, some augmented
    torch.manual_seed(1)
    assert torch.equal(algo.augment_batch(ctx, x, y)[0], xa)  # seeded by the runtime's torch.manual_seed


def _params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_augment_changes_training_in_both_simulators_and_is_reproducible():
    def star(hp):
        algo, model = make_model("feddyn", hp, size=32)
        sim = StarSimulator(algo, model, make_clients(size=32), SETTINGS, seed=0, device=CPU)
        sim.setup()
        result = sim.run_round(0)
        return _params(model), result

    plain, _ = star({})
    rc, result = star({"augment": "randconv"})
    again, _ = star({"augment": "randconv"})
    assert torch.equal(rc, again) and not torch.equal(rc, plain)
    assert result.metrics["augment_seconds"] > 0

    def ring(hp):
        algo, model = make_model("dsgd", hp, size=32)
        sim = P2PSimulator(algo, model, make_clients(size=32), SETTINGS, nx.cycle_graph(3), seed=0, device=CPU)
        sim.run_round(0)
        return sim.stacked

    a, b = ring({"augment": "augmix"}), ring({})
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_fedgca_resumes_to_the_uninterrupted_run(tiny_config, tmp_path, monkeypatch):
    from fedstyle.experiments.runner import run_experiment

    config = tiny_config.updated(method="fedgca", rounds=3, resolution=32, hparams={"augment_views": 2})
    full = run_experiment(config, tmp_path / "full", quiet=True)
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    terms = lines[-1]["train_metrics"]
    assert {"loss_ce", "loss_cp", "loss_cam", "loss_oc"} <= set(terms) and terms["loss_cam"] > 0  # 2 x 2 CAMs at 32 px
