"""gPerXAN (issue 38): the assembled normalization and the guided loss by hand through a full forward pass (float64,
every normalization written out), PerXAN's split of the state (the BatchNorm branch never comes down and, with
``eval_norm=instance``, never goes up; the InstanceNorm branch is averaged), the evaluation model of each mode,
refusals, logs, resume, the privacy audit's reading, and Flower's ServerApp and ClientApp against the simulator.

The method x topology matrix runs it end to end (it is registered).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.gperxan import BATCHNORM_OFF
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.star import StarSimulator
from fedstyle.payload import weights_nbytes
from fedstyle.models.assembled_norm import AssembledNorm, assembled_norms

from run_records import evaluations
from tiny import SETTINGS, interrupt_and_resume, make_clients, make_model
from flower_grid import run_under_flower  # noqa: E402  (Flower's apps, messages over the wire, in process)

CPU = torch.device("cpu")
EPS = 1e-5


def _xan_by_hand(layer: AssembledNorm, x: torch.Tensor, training: bool) -> torch.Tensor:
    bn, inn = layer.batchnorm, layer.instancenorm
    if training:
        mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    else:
        mean, var = bn.running_mean, bn.running_var
    shape = (1, -1, 1, 1)
    by_batch = (x - mean.view(shape)) / (var.view(shape) + EPS).sqrt() * bn.weight.view(shape) + bn.bias.view(shape)
    own_mean, own_var = x.mean((2, 3), keepdim=True), x.var((2, 3), unbiased=False, keepdim=True)
    by_image = (x - own_mean) / (own_var + EPS).sqrt() * inn.weight.view(shape) + inn.bias.view(shape)
    e_bn, e_in = layer.score_batchnorm.exp(), layer.score_instancenorm.exp()
    return (e_bn * by_batch + e_in * by_image) / (e_bn + e_in)


def _convnet_by_hand(model, x: torch.Tensor, training: bool) -> torch.Tensor:
    """The Digits ConvNet with XAN: four blocks conv3x3 (no bias) - XAN - ReLU - maxpool 2, flatten, linear."""
    with torch.no_grad():
        for name in ("layer1", "layer2", "layer3", "layer4"):
            block = getattr(model.backbone, name)
            x = F.conv2d(x, block[0].weight, padding=1)
            x = F.max_pool2d(_xan_by_hand(block[1], x, training).clamp_min(0), 2)
        return x.flatten(1) @ model.head.weight.T + model.head.bias


def _randomised(hp=None):
    """A float64 model whose scores, affine parameters and running statistics all differ from their defaults."""
    algo, model = make_model("gperxan", hp)
    model.double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in assembled_norms(model).values():
            for t in (layer.score_batchnorm, layer.score_instancenorm, layer.batchnorm.bias, layer.instancenorm.bias,
                      layer.batchnorm.running_mean):
                t.copy_(0.3 * torch.randn(t.shape, generator=g, dtype=torch.float64))
            for t in (layer.batchnorm.weight, layer.instancenorm.weight, layer.batchnorm.running_var):
                t.copy_(1 + 0.3 * torch.rand(t.shape, generator=g, dtype=torch.float64))
    return algo, model


def _images(n=8):
    data = make_clients(1, per_client=n)[0]
    return data.transform(data.images, train=False).double(), data.labels


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_every_batchnorm_is_assembled_and_the_forward_pass_is_the_softmax_mix_by_hand(training):
    algo, model = _randomised()
    assert algo.norm_names == [f"backbone.layer{i}.1" for i in range(1, 5)]
    assert not any(type(m) is torch.nn.BatchNorm2d for m in model.modules() if not isinstance(m, AssembledNorm)
                   and m not in [a.batchnorm for a in assembled_norms(model).values()])
    x, _ = _images()
    model.train(training)
    expected = _convnet_by_hand(model, x, training)
    assert torch.allclose(model(x), expected, atol=1e-10, rtol=0)


def test_one_value_per_channel_normalises_to_the_instancenorm_bias():
    """A 1 x 1 map (a ResNet's layer4 at 32 px): x minus its own mean is 0, so the branch gives its bias."""
    layer = AssembledNorm(torch.nn.BatchNorm2d(3)).double().train()
    with torch.no_grad():
        layer.instancenorm.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
        layer.score_batchnorm.fill_(0.2)
    x = torch.randn(4, 3, 1, 1, dtype=torch.float64)
    a = torch.tensor([0.2, 1.0], dtype=torch.float64).softmax(0)
    bn = (x - x.mean(0)) / (x.var(0, unbiased=False) + EPS).sqrt()
    assert torch.allclose(layer(x), a[0] * bn + a[1] * layer.instancenorm.bias.view(1, 3, 1, 1).detach(), atol=1e-12)


@pytest.mark.parametrize("guide", [0.0, 0.5, 2.0])
def test_loss_is_ce_plus_lambda_ce_of_the_frozen_global_classifier_by_hand(guide):
    algo, model = _randomised({"guide": guide})
    x, y = _images()
    model.train()
    g = torch.Generator().manual_seed(2)
    global_head = {"head.weight": model.head.weight.detach() + 0.2 * torch.randn(model.head.weight.shape, generator=g,
                                                                                  dtype=torch.float64),
                   "head.bias": torch.randn(4, generator=g, dtype=torch.float64)}
    ctx = ClientContext(client_id=0, data=None, state={}, train=SETTINGS.train_settings(0), round=0, num_clients=1,
                        device=CPU, seed=0)
    ctx.global_weights = global_head
    with torch.no_grad():
        h = model.features(x)  # the flattened maps: batch statistics, like the loss's own pass (nothing is tracked twice)
    model.zero_grad()
    loss = algo.training_loss(ctx, model, x, y, {})
    loss.backward()

    def ce(logits):
        return (logits.logsumexp(1) - logits[torch.arange(len(y)), y]).mean()

    local = h @ model.head.weight.detach().T + model.head.bias.detach()
    frozen = h @ global_head["head.weight"].T + global_head["head.bias"]
    assert loss.item() == pytest.approx(float(ce(local) + guide * ce(frozen)), rel=1e-12)
    assert ctx.logged_metrics()["gperxan_ce"] == pytest.approx(float(ce(local)), rel=1e-6)  # logs keep float32
    # the regulariser's gradient reaches the features only: the local head's is plain CE's
    d_local = (local.softmax(1) - F.one_hot(y, 4).double()) / len(y)
    assert torch.allclose(model.head.weight.grad, d_local.T @ h, atol=1e-12)
    if guide:
        assert ctx.logged_metrics()["gperxan_guide"] == pytest.approx(float(ce(frozen)), rel=1e-6)


def _branch_keys(algo, model, branch):
    return {k for k in model.state_dict() if any(k.startswith(f"{n}.{branch}.") for n in algo.norm_names)}


def _run_two_rounds(hp):
    algo, model = make_model("gperxan", hp)
    clients = make_clients(3, per_client=16)
    sim = StarSimulator(algo, model, clients, SETTINGS, seed=0, device=CPU)
    initial = {k: v.clone() for k, v in sim.server.weights.items()}
    seen, aggregate = [], algo.aggregate

    def recording(server, updates):
        seen.append(([{k: v.clone() for k, v in u.weights.items()} for u in updates], [u.num_samples for u in updates]))
        return aggregate(server, updates)

    algo.aggregate = recording
    started = []  # the BatchNorm branch each client trains from in round 2
    local_train = algo.local_train

    def recording_train(ctx, model, payload):
        if ctx.round == 1:
            started.append({k: v.clone() for k, v in model.state_dict().items() if ".batchnorm." in k})
        return local_train(ctx, model, payload)

    algo.local_train = recording_train
    sim.run_round(0)
    after_first = {k: v.clone() for k, v in sim.server.weights.items()}
    sim.run_round(1)
    return algo, model, sim, initial, after_first, seen, started


def _average(updates, sizes, key):
    return sum(n * u[key] for u, n in zip(updates, sizes)) / sum(sizes)


@pytest.mark.parametrize("reference", [False, True], ids=["paper", "reference_code"])
def test_perxan_keeps_the_batchnorm_branch_on_its_client_and_averages_instancenorm(reference):
    algo, model, sim, _, after_first, seen, started = _run_two_rounds({"reference_code": reference})
    bn, inn = _branch_keys(algo, model, "batchnorm"), _branch_keys(algo, model, "instancenorm")
    scores = algo.score_keys()
    assert bn and inn and not bn & set(sim.download_keys) and inn <= set(sim.download_keys)
    assert (scores <= set(sim.download_keys)) is not reference  # the code personalises the BatchNorm score too
    shared = [k for k in sim.download_keys]
    assert sim.traffic.model_down == 2 * 3 * weights_nbytes(sim.server.weights, shared)
    updates, sizes = seen[0]
    for key in inn | scores | {k for k in bn if k.endswith(("weight", "bias", "running_mean"))}:
        assert torch.allclose(after_first[key], _average(updates, sizes, key), atol=1e-6), key  # evaluation model: all
    for cid, start in enumerate(started):  # round 2 starts from the client's own branch, never the average
        for key, value in start.items():
            assert torch.equal(value, updates[cid][key]), key
    running = next(k for k in bn if k.endswith("running_mean"))
    assert not torch.allclose(updates[0][running], updates[1][running])


def test_eval_norm_instance_never_sends_the_batchnorm_branch_and_evaluates_through_instancenorm():
    algo, model, sim, initial, after_first, seen, _ = _run_two_rounds({"eval_norm": "instance"})
    private = _branch_keys(algo, model, "batchnorm") | algo.score_keys()
    assert private == set(algo.kept_on_server) and not private & set(sim.download_keys)
    for updates, sizes in seen:
        assert all(not private & set(u) for u in updates)  # nothing of the branch leaves the client
    sent_up = sum(weights_nbytes(u) for updates, _ in seen for u in updates)
    assert sim.traffic.model_up == sent_up == 2 * 3 * weights_nbytes(sim.server.weights, sim.download_keys)
    for key in private:  # the server's own evaluation copy: the initial branch, switched off
        expected = torch.full_like(initial[key], BATCHNORM_OFF) if key.endswith("score_batchnorm") else initial[key]
        assert torch.equal(sim.server.weights[key], expected), key
    updates, sizes = seen[0]
    for key in _branch_keys(algo, model, "instancenorm"):
        assert torch.allclose(after_first[key], _average(updates, sizes, key), atol=1e-6), key
    own = sim.client_states[0]["local/" + next(iter(algo.score_keys()))]
    assert float(own) != BATCHNORM_OFF  # the client's score is its own, trained
    model.load_state_dict(sim.server.weights)
    model.double().eval()
    x, _ = _images()
    assert all(torch.equal(m.branch_weights(), torch.tensor([0.0, 1.0], dtype=torch.float64))
               for m in assembled_norms(model).values())
    assert torch.allclose(model(x), _convnet_by_hand(model, x, training=False), atol=1e-10, rtol=0)


def test_refusals_name_the_fix(tiny_config, tmp_path):
    from fedstyle.algorithms import METHODS
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    algo = METHODS.get("gperxan")({}, num_classes=3, num_clients=2)
    with pytest.raises(ConfigError, match="has none; use one with BatchNorm"):
        algo.configure_model(Classifier(ConvNet(16, 4, batch_norm=False), 3))
    with pytest.raises(ConfigError, match="needs local_bn=true"):
        make_model("gperxan", {"eval_norm": "instance", "local_bn": False})
    with pytest.raises(ConfigError, match="runs on star, not --topology ring"):
        run_experiment(tiny_config.updated(method="gperxan", topology="ring"), tmp_path / "p2p", quiet=True)


def _config(tiny_config, **changes):
    return tiny_config.updated(**{"method": "gperxan", "partition": "per_domain", "clients": 6, "clients_per_round": 3,
                                  **changes})


def test_gperxan_logs_resumes_and_the_audit_reads_weights_only(tiny_config, tmp_path, monkeypatch):
    from fedstyle.audit.run import SURFACES, audit_privacy

    config = _config(tiny_config, rounds=2, hparams={"eval_norm": "instance"}, val_fraction=0.25)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train_metrics" in r]
    assert rows and all({"gperxan_ce", "gperxan_guide", "gperxan_in_weight"} <= set(r["train_metrics"]) for r in rows)
    assert all(r["bytes_payload_up"] == r["bytes_payload_down"] == 0 for r in rows)  # weights only
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=1)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")
    assert "gperxan" not in SURFACES  # no style payload for the audit to attack
    from test_audit_run import FAST
    from dataclasses import replace

    _, text = audit_privacy([tmp_path / "full"], settings=replace(FAST, baseline=False), out=tmp_path / "audit")
    assert "gperxan sends weights only" in text


@pytest.mark.parametrize("eval_norm", ["average", "instance"], ids=["gperxan-average", "gperxan-instance"])
def test_under_flower_equals_the_simulator(tiny_config, tmp_path, eval_norm):
    """The personalised branch kept on Flower's sites, and (instance) kept off the update, as in process: bitwise."""
    pytest.importorskip("flwr")
    from safetensors.torch import load_file

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = _config(tiny_config, hparams={"eval_norm": eval_norm}, rounds=2, lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(before)
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    shared = {k: v for k, v in a.items() if k.startswith(("global/", "server/"))}
    assert shared and all(torch.equal(v, b[k]) for k, v in shared.items())
