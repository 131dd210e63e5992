"""FedADG (issue 25): its losses by hand through a full forward pass, what is averaged and what stays on a
client, determinism and resume.

The method x topology matrix (tests/test_runner.py, test_api.py) and the learning check run it end to end.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms.context import ClientContext, TrainSettings
from fedstyle.algorithms.fedadg import DISCRIMINATOR, GENERATOR, FedADG
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.star import StarSimulator

from tiny import SETTINGS, interrupt_and_resume, make_clients, make_model
from run_records import evaluations

CPU = torch.device("cpu")
#: small generator and discriminator: the tests are about the algorithm, not the widths
SMALL = {"noise_dim": 6, "gen_hidden": 5, "rp_size": 4, "disc_hidden": 3}


def _leaky(t):
    return torch.where(t > 0, t, 0.01 * t)


def _disc(p, h, code):
    """D(h, c) written out from the discriminator's weights ``p`` (a dict of tensors)."""
    z = torch.cat([h @ p["projection.weight"].T, code], 1)
    hidden = _leaky(z @ p["fc1.weight"].T + p["fc1.bias"])
    return 1.0 / (1.0 + torch.exp(-(hidden @ p["fc2.weight"].T + p["fc2.bias"]))).squeeze(1)


def _gen(p, noise, code):
    hidden = _leaky(torch.cat([noise, code], 1) @ p["fc1.weight"].T + p["fc1.bias"])
    return torch.clamp(hidden @ p["fc2.weight"].T + p["fc2.bias"], min=0.0)


def _leaves(module):
    return {k: v.detach().clone().requires_grad_(True) for k, v in module.state_dict().items()}


def test_one_adversarial_step_matches_the_losses_and_updates_by_hand():
    """ce_warmup = 0, one local step, plain SGD: D steps on L_advd (eval-mode features), then F and C on
    0.85 L_err + 0.15 L_advf through the updated D, then G on L_advg through it; every value recomputed here
    from the weights, the backbone's features and the same batch and noise."""
    lr, scale, lam, onehot = 0.5, 0.7, 0.15, 0.7  # scale: a D and G step large enough to see at float rounding
    algo, model = make_model("fedadg", hp={**SMALL, "ce_warmup": 0.0, "adv_lr_scale": scale})
    reference = copy.deepcopy(model)
    data = make_clients(1)[0]
    train = TrainSettings(lr=lr, batch_size=8, local_steps=1, momentum=0.0, weight_decay=0.0)
    ctx = ClientContext(client_id=0, data=data, state={}, train=train, round=0, num_clients=1, device=CPU, seed=3)
    model.train()
    torch.manual_seed(11)
    result = algo.local_train(ctx, model, {})

    x, y, _ = next(data.batches(8, torch.Generator().manual_seed(3), CPU, steps=1))
    torch.manual_seed(11)
    noise = torch.rand(8, SMALL["noise_dim"])
    code = onehot * F.one_hot(y, 4).float()
    g = _leaves(getattr(reference, GENERATOR))
    d = _leaves(getattr(reference, DISCRIMINATOR))
    with torch.no_grad():
        h_eval = reference.eval().features(x)
    r = _gen(g, noise, code)
    adv_d = ((1 - _disc(d, r.detach(), code)) ** 2 + _disc(d, h_eval, code) ** 2).mean()  # references -> 1
    grads = torch.autograd.grad(adv_d, list(d.values()))
    d_new = {k: (v - lr * scale * gr).detach() for (k, v), gr in zip(d.items(), grads)}

    h = reference.train().features(x)
    logits = h @ reference.head.weight.T + reference.head.bias
    ce = (torch.logsumexp(logits, 1) - logits.gather(1, y[:, None]).squeeze(1)).mean()
    adv_f = ((1 - _disc(d_new, h, code)) ** 2).mean()
    loss = (1 - lam) * ce + lam * adv_f
    adv_g = (_disc(d_new, r, code) ** 2).mean()

    m = result.metrics
    assert m["fedadg_adv_d"] == pytest.approx(float(adv_d.detach()), rel=1e-5)
    assert m["fedadg_ce"] == pytest.approx(float(ce.detach()), rel=1e-5)
    assert m["fedadg_adv_f"] == pytest.approx(float(adv_f.detach()), rel=1e-5)
    assert m["fedadg_adv_g"] == pytest.approx(float(adv_g.detach()), rel=1e-5)
    assert result.train_loss == pytest.approx(float(loss.detach()), rel=1e-5)
    # the updates: D by L_advd, G by L_advg through the updated D, the head by the weighted F/C loss
    trained_d = getattr(model, DISCRIMINATOR).state_dict()
    assert all(torch.allclose(trained_d[k], v, atol=1e-6) for k, v in d_new.items())
    g_grads = torch.autograd.grad(adv_g, list(g.values()))
    trained_g = getattr(model, GENERATOR).state_dict()
    assert all(torch.allclose(trained_g[k], v - lr * scale * gr, atol=1e-6) for (k, v), gr in zip(g.items(), g_grads))
    head_grad = torch.autograd.grad(loss, [reference.head.weight])[0]
    assert torch.allclose(model.head.weight, reference.head.weight - lr * head_grad, atol=1e-6)


def test_warm_up_steps_train_f_and_c_on_cross_entropy_alone():
    algo, model = make_model("fedadg", hp={**SMALL, "ce_warmup": 1.0})
    adversarial = {k: v.clone() for k, v in model.state_dict().items() if k.startswith((GENERATOR, DISCRIMINATOR))}
    train = TrainSettings(lr=0.1, batch_size=8, local_steps=3)
    ctx = ClientContext(client_id=0, data=make_clients(1)[0], state={}, train=train, round=0, num_clients=1,
                        device=CPU, seed=0)
    model.train()
    result = algo.local_train(ctx, model, {})
    assert set(result.metrics) == {"fedadg_ce"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in adversarial.items())  # G and D untouched


class AggregationProbe(FedADG):
    """Records the updates the server averages and the discriminator each client starts training from."""

    name = "fedadg_probe"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.updates, self.entry = [], {}

    def local_train(self, ctx, model, payload):
        self.entry[(ctx.round, ctx.client_id)] = {k: v.clone() for k, v in
                                                  getattr(model, DISCRIMINATOR).state_dict().items()}
        return super().local_train(ctx, model, payload)

    def aggregate(self, server, updates):
        self.updates = updates
        return super().aggregate(server, updates)


def test_server_averages_extractor_classifier_and_generator_and_each_client_keeps_its_discriminator():
    clients = [make_clients(1, per_client=24, seed=0)[0], make_clients(1, per_client=16, seed=1)[0]]
    algo, model = make_model(algo_cls=AggregationProbe, hp=SMALL, n_clients=2)
    assert algo.local_keys(model) == {f"{DISCRIMINATOR}.{k}" for k in getattr(model, DISCRIMINATOR).state_dict()}
    sim = StarSimulator(algo, model, clients, SETTINGS, seed=0, device=CPU)
    initial = {k: v.clone() for k, v in sim.server.weights.items()}
    down = sim.download()
    assert not any(k.startswith(DISCRIMINATOR) for k in down) and f"{GENERATOR}.fc1.weight" in down

    sim.run_round(0)
    u0, u1 = algo.updates
    assert (u0.num_samples, u1.num_samples) == (24, 16)
    for key, value in sim.server.weights.items():
        if key.startswith(DISCRIMINATOR):
            assert torch.equal(value, initial[key])  # never averaged: the server's copy is the unused initial one
        elif value.is_floating_point():
            expected = (24 * u0.weights[key] + 16 * u1.weights[key]) / 40
            assert torch.allclose(value, expected, atol=1e-6), key
    for part in ("backbone.layer1.0.weight", "head.weight", f"{GENERATOR}.fc2.weight"):
        assert not torch.equal(sim.server.weights[part], initial[part])  # trained and averaged
    key = f"{DISCRIMINATOR}.fc1.weight"
    own = [sim.client_states[c][f"local/{key}"].clone() for c in (0, 1)]
    assert torch.equal(own[0], u0.weights[key]) and torch.equal(own[1], u1.weights[key])
    assert not torch.equal(own[0], own[1])  # after the round the discriminators differ
    assert not torch.equal(own[0], initial[key])

    sim.run_round(1)  # each client resumes from its own discriminator, not the server's
    for c in (0, 1):
        assert torch.equal(algo.entry[(1, c)]["fc1.weight"], own[c])


def test_same_seed_same_result():
    runs = []
    for _ in range(2):
        algo, model = make_model("fedadg", hp=SMALL)
        sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
        for r in range(2):
            result = sim.run_round(r)
        runs.append((sim.server.weights, sim.client_states[1], result.metrics))
    (w0, s0, m0), (w1, s1, m1) = runs
    assert all(torch.equal(v, w1[k]) for k, v in w0.items())
    assert all(torch.equal(s0[k], s1[k]) for k in s0 if k.startswith("local/"))
    assert m0 == m1 and {"fedadg_ce", "fedadg_adv_d", "fedadg_adv_f", "fedadg_adv_g"} <= set(m0)


def test_composes_with_style_ops_and_local_batchnorm():
    algo, model = make_model("fedadg", hp={**SMALL, "style": "mixstyle", "local_bn": True})
    assert "backbone.layer1.1.running_mean" in algo.local_keys(model)
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    for r in range(2):
        sim.run_round(r)
    state = sim.client_states[0]
    assert "local/backbone.layer1.1.running_mean" in state and f"local/{DISCRIMINATOR}.fc2.weight" in state


def test_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    config = tiny_config.updated(method="fedadg", hparams=SMALL, rounds=3, partition="per_domain", clients=6,
                                 clients_per_round=3)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")
    assert any("fedadg_adv_f" in m.get("train_metrics", {}) for m in evaluations(tmp_path / "full"))
