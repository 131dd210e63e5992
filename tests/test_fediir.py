"""FedIIR (issue 38): the classifier the authors' code builds, the penalised loss and the query's mean gradient by
hand through a full forward pass (float64, the classifier's gradient written out, not autograd), the server's
moving average by hand, and runs: logs, bytes, resume, and Flower's ServerApp and ClientApp against the simulator.

The method x topology matrix and the learning check run it end to end (it is registered).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.fediir import BATCHES, GRAD, HiddenNeck
from fedstyle.data.client import ClientData
from fedstyle.experiments.runner import run_experiment

from run_records import evaluations
from tiny import SETTINGS, TRANSFORM, interrupt_and_resume, make_clients, make_model
from flower_grid import run_under_flower  # noqa: E402  (Flower's apps, messages over the wire, in process)

CPU = torch.device("cpu")
KEYS = ["neck.hidden.weight", "neck.hidden.bias", "head.weight", "head.bias"]


class _Double:
    """The tiny transform, in float64 (the model is cast to float64 for the hand computations)."""

    def __call__(self, x, train=True):
        return TRANSFORM(x, train=train).double()


def _setup(hp=None, n=20):
    algo, model = make_model("fediir", {"hidden": 8, **(hp or {})})  # the two-layer classifier
    model.double()
    base = make_clients(1, per_client=n)[0]
    data = ClientData(base.images, base.labels, base.domains, _Double())
    return algo, model, data


def _ctx(data, phase="train", seed=0) -> ClientContext:
    return ClientContext(client_id=0, data=data, state={}, train=SETTINGS.train_settings(0), round=0, num_clients=1,
                         device=CPU, seed=seed, phase=phase)


def _classifier_gradient_by_hand(model, x, y) -> dict[str, torch.Tensor]:
    """grad of mean CE w.r.t. the two-layer classifier, written out: logits = relu(h W1' + b1) W2' + b2."""
    with torch.no_grad():
        h = model.backbone(x)  # the pooled features (the neck's input)
        W1, b1 = model.neck.hidden.weight, model.neck.hidden.bias
        W2, b2 = model.head.weight, model.head.bias
        pre = h @ W1.T + b1
        z = pre.clamp_min(0)
        logits = z @ W2.T + b2
        dlogits = (logits.softmax(1) - F.one_hot(y, logits.shape[1]).double()) / len(y)
        dpre = (dlogits @ W2) * (pre > 0).double()
        return {"neck.hidden.weight": dpre.T @ h, "neck.hidden.bias": dpre.sum(0),
                "head.weight": dlogits.T @ z, "head.bias": dlogits.sum(0), "logits": logits}


def test_the_classifier_follows_the_codes_rule_and_the_penalty_covers_all_of_it():
    """The authors' code: two layers with d // 2 hidden units on a ResNet featurizer, linear on its small CNN."""
    algo, model = make_model("fediir", backbone="resnet18", size=32)
    assert isinstance(model.neck, HiddenNeck) and model.neck.hidden.out_features == 256
    assert algo.classifier_keys == KEYS
    linear, convnet = make_model("fediir")  # the from-scratch ConvNet: the linear head alone
    assert linear.classifier_keys == ["head.weight", "head.bias"] and not isinstance(convnet.neck, HiddenNeck)
    assert make_model("fediir", {"hidden": 7})[1].head.in_features == 7


@pytest.mark.parametrize("gamma", [1e-3, 0.5])
def test_training_loss_is_ce_plus_gamma_gradient_distance_by_hand(gamma):
    algo, model, data = _setup({"penalty": gamma})
    model.train()
    x, y = data.transform(data.images[:8], train=False), data.labels[:8]
    g = torch.Generator().manual_seed(3)
    bar = {k: 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64) for k, p in model.named_parameters()
           if k in KEYS}
    ctx = _ctx(data)
    loss = algo.training_loss(ctx, model, x, y, {GRAD + k: v for k, v in bar.items()})
    hand = _classifier_gradient_by_hand(model, x, y)
    ce = F.cross_entropy(hand["logits"], y)
    penalty = sum(float((hand[k] - bar[k]).square().sum()) for k in KEYS)
    assert float(loss.detach()) == pytest.approx(float(ce) + gamma * penalty, rel=1e-12)
    logged = ctx.logged_metrics()
    assert logged["fediir_ce"] == pytest.approx(float(ce), rel=1e-6)  # logged in float32
    assert logged["fediir_penalty"] == pytest.approx(penalty, rel=1e-6)
    assert "fediir_penalty_seconds" in logged
    # the penalty's second-order pass reaches the featurizer: its gradient there is not the cross-entropy's
    backbone = [p for k, p in model.named_parameters() if k.startswith("backbone.")]
    with_penalty = torch.autograd.grad(loss, backbone)
    ce_only = torch.autograd.grad(F.cross_entropy(model(x), y), backbone)
    assert not torch.allclose(with_penalty[0], ce_only[0])


def test_without_a_mean_gradient_the_loss_is_the_cross_entropy():
    algo, model, data = _setup()
    model.train()
    x, y = data.transform(data.images[:8], train=False), data.labels[:8]
    torch.testing.assert_close(algo.training_loss(_ctx(data), model, x, y, {}), F.cross_entropy(model(x), y))


def test_the_query_is_the_mean_classifier_gradient_of_the_local_data_by_hand():
    algo, model, data = _setup(n=20)
    model.eval()  # the query phase's mode
    ctx = _ctx(data, phase="query")
    answer = algo.round_query(ctx, model)
    hand = _classifier_gradient_by_hand(model, data.transform(data.images, train=False), data.labels)
    for k in KEYS:
        torch.testing.assert_close(answer[GRAD + k], hand[k], rtol=1e-10, atol=1e-12)
    assert answer[BATCHES] == math.ceil(20 / SETTINGS.batch_size)
    assert "fediir/query_seconds" in ctx.state
    # grad_samples: a seeded subset, the one the client's generator draws
    algo.hp["grad_samples"] = 5
    sub = algo.round_query(_ctx(data, phase="query", seed=11), model)
    index = torch.randperm(20, generator=torch.Generator().manual_seed(11))[:5]
    hand = _classifier_gradient_by_hand(model, data.transform(data.images[index], train=False), data.labels[index])
    torch.testing.assert_close(sub[GRAD + "head.weight"], hand["head.weight"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reference", [False, True])
def test_the_server_keeps_a_moving_average_of_the_clients_mean_by_hand(reference):
    """beta = .9; round 1: g_bar = .1 mean_1 (from 0); round 2: .9 g_bar + .1 mean_2. The mean is plain over the
    clients, or (reference_code) pooled over their batches: clients with 1 and 3 batches weigh 1/4 and 3/4."""
    algo, _ = make_model("fediir", {"ema": 0.9, "reference_code": reference, "hidden": 0})
    weights = {"head.weight": torch.zeros(4, 2), "head.bias": torch.zeros(4)}
    server = ServerContext(weights=weights, state={}, round=0, num_clients=3, seed=0)
    algo.classifier_keys = ["head.weight", "head.bias"]
    algo.init_server_state(server)

    def query(value, batches):
        return {GRAD + "head.weight": torch.full((4, 2), value), GRAD + "head.bias": torch.full((4,), -value),
                BATCHES: batches}

    w = (0.25, 0.75) if reference else (0.5, 0.5)
    out = algo.round_payloads(server, [0, 2], {0: query(1.0, 1), 2: query(3.0, 3)})
    first = 0.1 * (w[0] * 1.0 + w[1] * 3.0)
    assert set(out) == {0, 2}
    torch.testing.assert_close(out[0][GRAD + "head.weight"], torch.full((4, 2), first))
    torch.testing.assert_close(out[2][GRAD + "head.bias"], torch.full((4,), -first))
    assert server.metrics["fediir_ema_norm"] == pytest.approx(first * math.sqrt(12))
    out = algo.round_payloads(server, [1], {1: query(2.0, 2)})
    torch.testing.assert_close(out[1][GRAD + "head.weight"], torch.full((4, 2), 0.9 * first + 0.1 * 2.0))
    assert server.metrics["fediir_grad_norm"] == pytest.approx(2.0 * math.sqrt(12))
    assert algo.round_payloads(server, [0], {}) == {}  # nobody answered: nothing sent, the average kept


def _config(tiny_config, **changes):
    return tiny_config.updated(**{"method": "fediir", "partition": "per_domain", "clients": 6, "clients_per_round": 3,
                                  **changes})


def test_fediir_logs_counts_its_exchange_and_resumes(tiny_config, tmp_path, monkeypatch):
    config = _config(tiny_config, rounds=3)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train_metrics" in r]
    names = {"fediir_ce", "fediir_penalty", "fediir_penalty_seconds", "fediir_query_seconds", "fediir_grad_norm",
             "fediir_ema_norm"}
    assert rows and all(names <= set(r["train_metrics"]) for r in rows)
    algo, model = make_model("fediir", backbone="convnet", classes=3, size=16)
    numbers = sum(p.numel() for k, p in model.named_parameters() if k in algo.classifier_keys)
    per_round = [b - a for a, b in zip([0] + [r["bytes_payload_down"] for r in rows], [r["bytes_payload_down"]
                                                                                       for r in rows])]
    assert per_round == [3 * 4 * numbers] * len(rows)  # g_bar, float32, to each of the 3 sampled clients
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")


@pytest.mark.parametrize("method,hp", [("fediir", {}), ("stablefdg", {"server_opt": "omg"})], ids=["fediir", "omg"])
def test_under_flower_equals_the_simulator(tiny_config, tmp_path, method, hp):
    """FedIIR's query and payload and the server step of ``server_opt=omg`` (here on StableFDG's own query phase)
    through Flower's apps (tests/flower_grid.py): the same metrics, bytes and weights as in process, bitwise."""
    pytest.importorskip("flwr")
    from safetensors.torch import load_file

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = _config(tiny_config, method=method, hparams=hp, rounds=2, lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(before)
    sim_lines = evaluations(tmp_path / "sim")
    assert evaluations(tmp_path / "flower") == sim_lines
    assert all(("fediir_penalty" if method == "fediir" else "omg_min_cos") in m.get("train_metrics", {})
               for m in sim_lines)
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    shared = {k: v for k, v in a.items() if k.startswith(("global/", "server/"))}
    assert shared and all(torch.equal(v, b[k]) for k, v in shared.items())


def test_a_resumed_run_keeps_the_moving_average_where_fediir_keeps_it(tiny_config):
    """The runner moves every checkpoint tensor to the run's device; FedIIR's server-side moving average lives
    on the CPU (beside the CPU copies of the clients' gradients), so a run resumed on CUDA failed on mixing
    devices (seen on an H200, 2026-11-28): the restore must put server state back where init_server_state made
    it. On a machine without a GPU the roles are played by "meta" (where the method keeps its state) and the
    CPU (the run's device, where the checkpoint's tensors arrive)."""
    import torch

    from fedstyle.experiments.build import build_experiment

    sim = build_experiment(tiny_config.updated(method="fediir"), progress=False).simulator
    assert sim.server.state and all(v.device.type == "cpu" for v in sim.server.state.values())
    checkpoint = {k: torch.ones_like(v) for k, v in sim.state_tensors().items()}  # arriving on the run's device
    sim.server.state = {k: v.to("meta") for k, v in sim.server.state.items()}  # where the method keeps it
    sim.load_state_tensors(checkpoint)
    assert all(v.device.type == "meta" for v in sim.server.state.values())
    assert all(v.device.type == "cpu" for v in sim.server.weights.values())  # the model's weights follow the run
