"""FedGCA's baselines (issue 12 §3): FedSR, FedSAM and MOON against hand-computed values and invariants.

The method x topology matrix of tests/test_runner.py runs each of them end to end (they are registered).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.fedsam import FedSAM, sam_perturbation
from fedstyle.algorithms.moon import MOON, model_contrastive_loss
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.rounds import FederationSettings
from fedstyle.federation.star import StarSimulator
from fedstyle.models.necks import gaussian_kl

from tiny import SETTINGS, make_clients, make_model, interrupt_and_resume
from run_records import evaluations
from flower_grid import run_under_flower  # noqa: E402  (Flower's apps, messages over the wire, in process)

CPU = torch.device("cpu")


def _ctx(data, seed=0) -> ClientContext:
    return ClientContext(client_id=0, data=data, state={}, train=SETTINGS.train_settings(0), round=0,
                         num_clients=1, device=CPU, seed=seed)


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- FedSAM -----------------------------------------------------------------------------------------
def test_sam_perturbation_has_norm_rho_along_the_joint_gradient():
    g = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0], [4.0]])]  # joint norm 5
    eps = sam_perturbation(g, rho=0.1)
    assert torch.allclose(eps[0], torch.tensor([0.06, 0.0])) and torch.allclose(eps[1], torch.tensor([[0.0], [0.08]]))
    assert float(torch.cat([e.reshape(-1) for e in eps]).norm()) == pytest.approx(0.1, rel=1e-6)
    assert all(float(e.abs().sum()) == 0 for e in sam_perturbation([torch.zeros(3)], rho=0.1))  # no NaN at g = 0


class SamProbe(FedSAM):
    """Records the parameters each pass sees."""

    name = "sam_probe"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[torch.Tensor] = []

    def training_loss(self, ctx, model, x, y, payload):
        self.seen.append(_flat(model).clone())
        return super().training_loss(ctx, model, x, y, payload)


def test_fedsam_step_perturbs_by_rho_along_g_steps_with_g_sam_from_w():
    rho = 0.5
    algo, model = make_model(algo_cls=SamProbe, hp={"rho": rho, "sam_bn": "both"})
    model.train()
    x, y, _ = next(make_clients(1)[0].batches(8, torch.Generator().manual_seed(0), CPU, steps=1))
    w = _flat(model).clone()
    params = list(model.parameters())
    reference = copy.deepcopy(model)  # the same step by hand
    loss = F.cross_entropy(reference(x), y)
    g = torch.autograd.grad(loss, list(reference.parameters()))
    eps = sam_perturbation(list(g), rho)
    with torch.no_grad():
        for p, e in zip(reference.parameters(), eps):
            p.add_(e)
    g_sam = torch.autograd.grad(F.cross_entropy(reference(x), y), list(reference.parameters()))

    optimizer = torch.optim.SGD(params, lr=1.0, momentum=0.0, weight_decay=0.0)
    reported = algo.training_step(_ctx(make_clients(1)[0]), model, optimizer, x, y, {})
    first, second = algo.seen
    assert torch.equal(first, w)
    assert float((second - first).norm()) == pytest.approx(rho, rel=1e-5)  # ||eps|| = rho
    assert torch.allclose(second - first, torch.cat([e.reshape(-1) for e in eps]), atol=1e-7)
    expected = w - torch.cat([g_.reshape(-1) for g_ in g_sam])  # w restored, then w - lr * g_sam
    assert torch.allclose(_flat(model), expected, atol=1e-6)
    assert float(reported) == pytest.approx(float(loss.detach()), rel=1e-6)  # the first pass's loss is reported


def test_fedsam_restores_w_bitwise_before_the_step():
    algo, model = make_model(algo_cls=SamProbe, hp={"rho": 0.3})
    model.train()
    x, y, _ = next(make_clients(1)[0].batches(8, torch.Generator().manual_seed(0), CPU, steps=1))
    w = _flat(model).clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.0, weight_decay=0.0)
    algo.training_step(_ctx(make_clients(1)[0]), model, optimizer, x, y, {})
    assert not torch.equal(algo.seen[1], w)  # the second pass ran at w + eps
    assert torch.equal(_flat(model), w)  # lr 0: the step started from w exactly


@pytest.mark.parametrize("sam_bn,once", [("first", True), ("both", False)])
def test_fedsam_batchnorm_running_stats(sam_bn, once):
    algo, model = make_model("fedsam", hp={"rho": 0.5, "sam_bn": sam_bn})
    model.train()
    x, y, _ = next(make_clients(1)[0].batches(8, torch.Generator().manual_seed(0), CPU, steps=1))
    plain = copy.deepcopy(model)
    plain(x)  # one train-mode pass at w
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.0, weight_decay=0.0)
    algo.training_step(_ctx(make_clients(1)[0]), model, optimizer, x, y, {})
    key = "backbone.layer1.1.running_mean"
    same = torch.equal(model.state_dict()[key], plain.state_dict()[key])
    assert same == once
    assert int(model.state_dict()["backbone.layer1.1.num_batches_tracked"]) == (1 if once else 2)


def test_fedsam_with_rho_zero_is_fedavg_bitwise_also_with_mixstyle():
    hp = {"style": "mixstyle", "style_p": 1.0}
    results = {}
    for method, extra in (("fedavg", {}), ("fedsam", {"rho": 0.0})):
        algo, model = make_model(method, hp={**hp, **extra})
        sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
        sim.run_round(0)
        results[method] = sim.server.weights
    assert all(torch.equal(v, results["fedsam"][k]) for k, v in results["fedavg"].items())


def test_fedsam_logs_both_passes():
    algo, model = make_model("fedsam")
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    result = sim.run_round(0)
    assert result.metrics["sam_perturbed_loss"] > 0 and result.metrics["sam_second_pass_seconds"] > 0


# -- MOON -------------------------------------------------------------------------------------------
def test_model_contrastive_loss_on_hand_vectors():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # cosine 1 and 1/sqrt(2)
    z_prev = torch.tensor([[0.0, 3.0], [-1.0, -1.0]])  # cosine 0 and -1
    tau = 0.5
    # -log(e^{a/tau} / (e^{a/tau} + e^{b/tau})) = log(1 + e^{(b - a)/tau})
    expected = (math.log1p(math.exp((0 - 1) / tau)) + math.log1p(math.exp((-1 - 1 / math.sqrt(2)) / tau))) / 2
    assert float(model_contrastive_loss(z, z_glob, z_prev, tau)) == pytest.approx(expected, rel=1e-6)
    assert float(model_contrastive_loss(5 * z, z_glob, z_prev, tau)) == pytest.approx(expected, rel=1e-6)  # cosine
    # K negatives: (B, K, D); identical positive and negatives give log(1 + K)
    two = torch.stack([z, z], 1)
    assert float(model_contrastive_loss(z, z, two, 0.1)) == pytest.approx(math.log(3), rel=1e-6)


def test_moon_projection_head_classifies_z():
    algo, model = make_model("moon", hp={"out_dim": 32})
    model.eval()
    x = torch.randn(2, 3, 16, 16)
    h = model.backbone.pool(model.backbone.forward_maps(x))
    assert h.shape[1] == 64  # the ConvNet's flattened 64 x 1 x 1 map at 16 x 16
    z = model.neck.proj[2](F.relu(model.neck.proj[0](h)))
    assert torch.allclose(model.features(x), z) and model.head.in_features == 32
    assert torch.allclose(model(x), model.head(z))


def test_moon_skips_l_con_until_a_client_trained_then_uses_its_previous_model():
    """One client: round 1's previous model is its round-0 model, which is also the global model, so
    sim(z, z_glob) = sim(z, z_prev) at every step and l_con = log 2 exactly."""
    algo, model = make_model("moon", n_clients=1)
    sim = StarSimulator(algo, model, make_clients(1), SETTINGS, seed=0, device=CPU)
    first = sim.run_round(0)
    assert first.metrics["moon_first_participation"] == 1.0 and "moon_con" not in first.metrics
    state = sim.client_states[0]
    assert {k[len("moon/prev/"):] for k in state if k.startswith("moon/prev/")} == set(model.state_dict())
    assert all(torch.equal(state["moon/prev/" + k], v) for k, v in sim.server.weights.items())
    second = sim.run_round(1)
    assert second.metrics["moon_first_participation"] == 0.0
    assert second.metrics["moon_con"] == pytest.approx(math.log(2), abs=1e-5)
    assert second.metrics["moon_frozen_forward_seconds"] > 0


def test_moon_previous_model_is_per_client_with_one_frozen_copy():
    algo, model = make_model("moon")
    settings = FederationSettings(rounds=3, lr=0.05, batch_size=8, local_steps=2, clients_per_round=2)
    sim = StarSimulator(algo, model, make_clients(3), settings, seed=0, device=CPU)
    participated = set()
    for r in range(3):
        result = sim.run_round(r)
        fresh = [c for c in result.clients if c not in participated]
        assert result.metrics["moon_first_participation"] == pytest.approx(len(fresh) / len(result.clients))
        participated |= set(result.clients)
    key = "moon/prev/head.weight"
    held = [c for c in range(3) if key in sim.client_states[c]]
    assert sorted(held) == sorted(participated)
    assert len(held) < 2 or not torch.equal(sim.client_states[held[0]][key], sim.client_states[held[1]][key])
    assert len(algo._frozen) == 1  # one frozen module for every client's previous model


def test_moon_with_mu_zero_keeps_no_previous_model():
    algo, model = make_model("moon", hp={"mu": 0.0})
    sim = StarSimulator(algo, model, make_clients(2), SETTINGS, seed=0, device=CPU)
    for r in range(2):
        result = sim.run_round(r)
    assert set(result.metrics) == {"moon_ce"}
    assert not any(k.startswith("moon/") for k in sim.client_states[0])


class BnProbe(MOON):
    """Checks that the frozen global model holds this client's own BatchNorm under local_bn."""

    name = "bn_probe"

    def local_train(self, ctx, model, payload):
        own = {k: v.clone() for k, v in model.state_dict().items() if "running_mean" in k}
        frozen = ctx.global_model().state_dict()
        assert own and all(torch.equal(frozen[k], v) for k, v in own.items())
        return super().local_train(ctx, model, payload)


def test_global_model_carries_the_clients_local_batchnorm():
    algo, model = make_model(algo_cls=BnProbe, hp={"local_bn": True})
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    for r in range(2):
        sim.run_round(r)
    a, b = (sim.client_states[c]["local/backbone.layer1.1.running_mean"] for c in (0, 1))
    assert not torch.equal(a, b)  # the clients' BatchNorm differ, and each saw its own in the global copy


# -- FedSR ------------------------------------------------------------------------------------------
def test_gaussian_kl_on_hand_values():
    kl = gaussian_kl(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0.0), torch.tensor(2.0))
    assert float(kl) == pytest.approx(math.log(2) + 2 / 8 - 0.5, rel=1e-6)
    same = gaussian_kl(torch.tensor([0.3, -1.0]), torch.tensor([0.7, 2.0]), torch.tensor([0.3, -1.0]),
                       torch.tensor([0.7, 2.0]))
    assert torch.allclose(same, torch.zeros(2), atol=1e-7)


@pytest.mark.parametrize("l2r,expected_l2r", [("squared", 13.0), ("norm", 3.0)])
@pytest.mark.parametrize("cmi_scale", [False, True])
def test_fedsr_regularizers_on_a_hand_example(l2r, expected_l2r, cmi_scale):
    algo, model = make_model("fedsr", hp={"z_dim": 2, "l2r": l2r, "cmi_scale": cmi_scale}, classes=2)
    neck = model.neck
    with torch.no_grad():
        neck.ref_mu.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        neck.ref_rho.fill_(math.log(math.e - 1))  # softplus = 1: sigma_y = 1 (+ the 1e-6 floor)
        if cmi_scale:
            neck.ref_scale.fill_(2.0)
    mu = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    sigma = torch.tensor([[1.0, 1.0], [0.5, 1.0]])
    y = torch.tensor([0, 1])
    z = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    got_l2r, got_cmi = algo.regularizers(model, mu, sigma, z, y)
    assert float(got_l2r) == pytest.approx(expected_l2r, rel=1e-6)  # (25 + 1)/2 or (5 + 1)/2
    if not cmi_scale:
        # sample 0: dim 0 KL(N(1,1)||N(0,1)) = 1/2, dim 1: 0; sample 1: dim 0 log 2 + 0.25/2 - 1/2, dim 1: 0
        expected = (0.5 + (math.log(2) + 0.125 - 0.5)) / 2
    else:  # C = 2 scales mu and sigma inside the KL: sample 0: (2,2|0,1) (0,2|0,1); sample 1: (2,1|1,1) (2,2|1,1)
        def kl(m, s, mr):
            return math.log(1 / s) + (s * s + (m - mr) ** 2) / 2 - 0.5
        expected = (kl(2, 2, 0) + kl(0, 2, 0) + kl(2, 1, 1) + kl(2, 2, 1)) / 2
    assert float(got_cmi.detach()) == pytest.approx(expected, rel=1e-5)


def test_gaussian_neck_samples_in_training_and_predicts_the_mean():
    algo, model = make_model("fedsr", hp={"z_dim": 8})
    x = torch.randn(4, 3, 16, 16)
    model.eval()
    maps = model.backbone.forward_maps(x)
    mu, sigma = model.neck.distribution(maps)
    assert bool((sigma > 0).all())
    assert torch.equal(model.features(x), mu) and torch.allclose(model(x), model.head(mu))
    model.neck.train()
    torch.manual_seed(3)
    z = model.neck(maps)
    torch.manual_seed(3)
    assert torch.allclose(z, mu + sigma * torch.randn_like(mu))  # reparameterised: one draw per input


def test_gaussian_neck_monte_carlo_prediction_is_deterministic_log_probabilities():
    algo, model = make_model("fedsr", hp={"z_dim": 8, "predict": "mc", "mc_samples": 5})
    model.eval()
    x = torch.randn(4, 3, 16, 16)
    out = model(x)
    assert torch.equal(out, model(x))  # its own seeded draws: evaluation is repeatable
    assert torch.allclose(out.exp().sum(1), torch.ones(4), atol=1e-5)  # log of averaged softmax
    maps = model.backbone.forward_maps(x)
    mu, sigma = model.neck.distribution(maps)
    eps = torch.randn((5, *mu.shape), generator=torch.Generator().manual_seed(0))
    expected = F.softmax(model.head(mu + sigma * eps), -1).mean(0).log()
    assert torch.allclose(out, expected, atol=1e-5)


def test_fedsr_reference_stays_local_and_is_not_aggregated():
    algo, model = make_model("fedsr", hp={"z_dim": 16})
    assert algo.local_keys(model) == {"neck.ref_mu", "neck.ref_rho"}
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    initial = {k: v.clone() for k, v in sim.server.weights.items()}
    assert "neck.ref_mu" not in sim.download() and "neck.fc.weight" in sim.download()
    result = None
    for r in range(2):
        result = sim.run_round(r)
    refs = [sim.client_states[c]["local/neck.ref_mu"] for c in range(3)]
    assert not torch.equal(refs[0], initial["neck.ref_mu"])  # trained on the client
    assert not torch.equal(refs[0], refs[1])  # each client its own
    assert torch.equal(sim.server.weights["neck.ref_mu"], initial["neck.ref_mu"])  # never averaged
    assert not torch.equal(sim.server.weights["neck.fc.weight"], initial["neck.fc.weight"])
    assert {"fedsr_ce", "fedsr_l2r", "fedsr_cmi"} <= set(result.metrics)


# -- all three: local options, bad input, resume, Flower ---------------------------------------------
@pytest.mark.parametrize("method", ["fedsr", "fedsam", "moon"])
def test_composes_with_style_ops_and_local_batchnorm(method):
    algo, model = make_model(method, hp={"style": "mixstyle", "local_bn": True})
    assert "layer1" in model.backbone.stage_ops
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    for r in range(2):
        result = sim.run_round(r)
        assert math.isfinite(result.train_loss)
    assert "local/backbone.layer1.1.running_mean" in sim.client_states[0]


@pytest.mark.parametrize("method,hp,match", [
    ("fedsam", {"rho": -0.1}, "'rho' of fedsam: -0.1 is below the minimum 0"),
    ("moon", {"tau": 0}, "'tau' of moon must be > 0"),
    ("moon", {"tau": -1.0}, "'tau' of moon must be > 0"),
    ("fedsr", {"z_dim": 0}, "'z_dim' of fedsr: 0 is below the minimum 1"),
    ("fedsr", {"predict": "median"}, "not one of mean, mc"),
])
def test_bad_hyperparameters_fail_in_one_line_before_anything_is_written(tiny_config, tmp_path, method, hp, match):
    with pytest.raises(ConfigError, match=match) as info:
        METHODS.get(method)(hp, num_classes=3, num_clients=2)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=match):
        run_experiment(tiny_config.updated(method=method, hparams=hp), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()



def test_moon_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    config = tiny_config.updated(method="moon", rounds=3, partition="per_domain", clients=6, clients_per_round=3)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")
    assert any("moon_con" in m.get("train_metrics", {}) for m in evaluations(tmp_path / "full"))


def test_moon_under_flower_equals_the_simulator(tiny_config, tmp_path):
    """MOON's per-client state (the previous model) lives on the Flower sites: same metrics, bitwise."""
    pytest.importorskip("flwr")
    from safetensors.torch import load_file

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = tiny_config.updated(method="moon", partition="per_domain", clients=6, clients_per_round=4,
                                     rounds=3, lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(before)
    sim_lines = evaluations(tmp_path / "sim")
    assert evaluations(tmp_path / "flower") == sim_lines  # losses, accuracies, bytes
    assert any("moon_con" in m.get("train_metrics", {}) for m in sim_lines)
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    globals_a = {k: v for k, v in a.items() if k.startswith("global/")}
    assert globals_a and all(torch.equal(v, b[k]) for k, v in globals_a.items())
