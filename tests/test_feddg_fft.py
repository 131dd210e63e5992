"""FedDG-FFT: the amplitude-exchange baseline through the fft backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.feddg_fft import VIEW, FedDGFFT, plan_amplitude_exchange
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.data.client import ClientData
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.models import build_model
from fedstyle.seeding import seed_everything
from fedstyle.style.transfer import Style
from fedstyle.style.transfer.augment import StyleBank
from parity_steps import client_context

SIZE, PER_CLIENT = 16, 16
TRANSFORM = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def make_clients(n=3):
    g = torch.Generator().manual_seed(0)
    return [ClientData(torch.randint(60 * c, 60 * c + 100, (PER_CLIENT, 3, SIZE, SIZE), generator=g).to(torch.uint8),
                       torch.arange(PER_CLIENT) % 4, torch.full((PER_CLIENT,), c), TRANSFORM) for c in range(n)]


def simulator(hp=None, n=3):
    seed_everything(0)
    model = build_model("convnet", 4, SIZE)
    algo = METHODS.get("feddg_fft")(hp or {}, num_classes=4, num_clients=n)
    algo.configure_model(model)
    settings = FederationSettings(rounds=1, lr=0.05, batch_size=8, local_steps=1)
    return StarSimulator(algo, model, make_clients(n), settings, seed=0, device=torch.device("cpu"))


def test_plan_keeps_each_image_then_adds_copies_from_other_clients():
    owner = torch.tensor([0, 0, 1, 1, 1, 2])
    bank = StyleBank(Style("fft", "x", {"amplitude": torch.zeros(6, 3, 2, 2)}), owner)
    plan = plan_amplitude_exchange(50, bank, own=1, copies=2, seed=3)
    rows, ratio = plan.style_row.view(50, 3), plan.ratio.view(50, 3)
    assert torch.equal(plan.source, torch.arange(50).repeat_interleave(3))
    assert bool((rows[:, 0] == -1).all()) and bool((rows[:, 1:] >= 0).all())  # original first
    assert set(owner[rows[:, 1:]].flatten().tolist()) == {0, 2}  # never the own client
    assert bool(((ratio[:, 1:] >= 0) & (ratio[:, 1:] <= 1)).all()) and float(ratio[:, 1:].std()) > 0.1  # U(0, 1)
    with pytest.raises(ConfigError, match="another client"):
        plan_amplitude_exchange(5, StyleBank(bank.style.select([0, 1]), torch.tensor([1, 1])), own=1, copies=1, seed=0)


def test_setup_doubles_the_data_keeps_originals_and_counts_the_bank_bytes():
    originals = make_clients()
    sim = simulator({"bank_size": 3, "band": 0.2, "stylize": "eager"})  # eager: the setup counts every copy
    info = sim.setup()
    for c, data in enumerate(sim.clients):
        assert len(data) == 2 * PER_CLIENT and data.images.dtype == torch.uint8
        assert torch.equal(data.images[0::2], originals[c].images)  # originals kept, in order
        assert not torch.equal(data.images[1::2], originals[c].images)  # copies changed
        assert torch.equal(data.labels, originals[c].labels.repeat_interleave(2))
    amplitudes = 3 * SIZE * SIZE * 4  # one float32 amplitude spectrum
    strings = len("fft") + len("fft2-amplitude")
    assert sim.traffic.payload_up == 3 * (strings + 3 * amplitudes)
    assert sim.traffic.payload_down == 3 * (strings + 9 * amplitudes + 9 * 8)
    assert info["style_images"] == 9 and info["stylized_images"] == 3 * PER_CLIENT
    assert sim.algo.display_name(sim.algo.hp) == "FedDG-FFT"


def test_default_bank_is_an_eighth_of_the_images_and_one_client_is_refused():
    sim = simulator()
    upload = sim.algo.setup_upload(sim.context(0, -1, "setup"), sim.model)
    assert len(Style.from_payload(upload)) == 2  # ceil(16 / 8)
    with pytest.raises(ConfigError, match="another client"):
        simulator(n=1).setup()


def test_what_is_left_out_is_stated():
    assert "episodic=true" in FedDGFFT.summary
    doc = " ".join(__import__("fedstyle.algorithms.feddg_fft", fromlist=["x"]).__doc__.split())
    assert "NOT implemented: the boundary-oriented contrastive term" in doc


# -- episodic learning (episodic=true, FedDG Sec. 3.3) -------------------------------------------------
def test_episodic_setup_pairs_each_image_with_the_copy_the_plain_mode_adds():
    plain = simulator({"stylize": "eager"})
    plain.setup()
    sim = simulator({"stylize": "eager", "episodic": True})
    originals = make_clients()
    sim.setup()
    for c, data in enumerate(sim.clients):
        assert len(data) == PER_CLIENT and torch.equal(data.images, originals[c].images)  # no extra data
        assert torch.equal(data.views[VIEW][:], plain.clients[c].images[1::2])  # the same copies, as views
    assert plain.algo.batching_support(plain.algo.hp) is None  # the plain mode keeps client batching
    assert "training_loss" in sim.algo.batching_support(sim.algo.hp)


def episodic_setup(hp):
    """A float64 network, a batch x, its copies x' and labels, and the method with ``hp``. The network is smooth
    (softplus, average pooling) with BatchNorm: a central difference of the ConvNet's ReLU and max-pool kinks
    does not converge, so it could not check a gradient."""
    seed_everything(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Softplus(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(32, 4)).double()
    algo = FedDGFFT({"episodic": True, "meta_step": 0.5, **hp}, num_classes=4, num_clients=3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, SIZE, SIZE, generator=g, dtype=torch.float64)
    x_copy = torch.randn(8, 3, SIZE, SIZE, generator=g, dtype=torch.float64)
    return algo, model, x, x_copy, torch.arange(8) % 4


def objective(model, x, x_copy, y, beta, clip=None):
    """FedDG's objective by hand: L(x; w) + L(x'; w - beta * clip(grad L(x; w))), its value only."""
    weights = dict(model.named_parameters())
    inner = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(inner, list(weights.values()))
    adapted = {n: w - beta * (g if clip is None else g.clamp(-clip, clip)) for (n, w), g in zip(weights.items(), grads)}
    return (inner + F.cross_entropy(torch.func.functional_call(model, adapted, (x_copy,)), y)).item()


@pytest.mark.parametrize("meta_clip", [100.0, 0.0])
def test_episodic_loss_is_its_objective_and_second_order_differentiates_through_the_inner_step(meta_clip):
    """The loss equals the objective computed by hand, and its gradient (meta_order=second) is the objective's:
    a central difference along a random direction of every weight agrees to 1e-6."""
    algo, model, x, x_copy, y = episodic_setup({"meta_clip": meta_clip})
    ctx = client_context()
    loss = algo.episodic_loss(ctx, model, x, x_copy, y)
    assert loss.item() == pytest.approx(objective(model, x, x_copy, y, 0.5, meta_clip or None), rel=1e-12)
    weights = list(model.parameters())
    grads = torch.autograd.grad(loss, weights)
    g = torch.Generator().manual_seed(2)
    direction = [torch.randn(w.shape, generator=g, dtype=w.dtype) for w in weights]
    eps = 1e-5
    with torch.no_grad():
        values = []
        for sign in (1, -1):
            for w, d in zip(weights, direction):
                w.add_(sign * eps * d)
            with torch.enable_grad():
                values.append(objective(model, x, x_copy, y, 0.5, meta_clip or None))
            for w, d in zip(weights, direction):
                w.sub_(sign * eps * d)
    numeric = (values[0] - values[1]) / (2 * eps)
    analytic = float(sum((gr * d).sum() for gr, d in zip(grads, direction)))
    assert analytic == pytest.approx(numeric, rel=1e-6)
    metrics = ctx.logged_metrics()
    assert set(metrics) >= {"inner", "outer"} and metrics["inner"] + metrics["outer"] == pytest.approx(loss.item())


def test_first_order_treats_the_inner_gradient_as_a_constant_as_the_code_does():
    """meta_order=first (reference_code=true): the gradient is grad L(x; w) + grad L(x'; .) at w', the outer
    gradient taken at the adapted weights and applied to w unchanged; it differs from the second-order one."""
    algo, model, x, x_copy, y = episodic_setup({"reference_code": True})
    assert algo.hp["meta_order"] == "first"
    weights = list(model.parameters())
    first = torch.autograd.grad(algo.episodic_loss(client_context(), model, x, x_copy, y), weights)
    inner_grads = torch.autograd.grad(F.cross_entropy(model(x), y), weights)
    names = [n for n, _ in model.named_parameters()]
    adapted = {n: (w - 0.5 * gr.clamp(-100, 100)).detach().requires_grad_() for n, w, gr in
               zip(names, weights, inner_grads)}
    outer_grads = torch.autograd.grad(F.cross_entropy(torch.func.functional_call(model, adapted, (x_copy,)), y),
                                      list(adapted.values()))
    for got, a, b in zip(first, inner_grads, outer_grads):
        torch.testing.assert_close(got, a + b, rtol=1e-10, atol=1e-12)
    second_algo, *_ = episodic_setup({})
    second = torch.autograd.grad(second_algo.episodic_loss(client_context(), model, x, x_copy, y), weights)
    assert max(float((s - f).abs().max()) for s, f in zip(second, first)) > 1e-4


def test_an_episodic_round_trains_logs_its_terms_and_refuses_what_it_cannot_pair():
    sim = simulator({"episodic": True})
    start = {k: v.clone() for k, v in sim.server.weights.items()}
    sim.setup()
    result = sim.run_round(0)
    assert not torch.equal(start["head.weight"], sim.server.weights["head.weight"])
    assert result.metrics["inner"] > 0 and result.metrics["outer"] > 0  # both terms reach metrics.jsonl
    with pytest.raises(ConfigError, match="drop copies"):
        FedDGFFT.resolve({"episodic": True, "copies": 2})
    with pytest.raises(ConfigError, match="drop augment"):
        FedDGFFT.resolve({"episodic": True, "augment": "randconv"})
