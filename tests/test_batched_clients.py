"""The batched client executor (``--client-batching``, fedstyle/federation/batched.py) against the sequential path.

Tolerance. In float64 both paths compute alike: measured max difference of every weight, buffer and client
state after 2 rounds 0 (FedAvg, FedProx, Adam, RandConv, CCST) and 3.6e-15 (FedBN's local running
statistics: the batched BatchNorm sums in another order); train_loss equal. The tests allow 1e-9. In float32
the batched convolutions round differently and training amplifies it as it amplifies any rounding: the
batched run lands about as far from the sequential one as the sequential run lands from itself with every
initial weight one float32 step up (benchmarks/batching_rounding.py). Largest differences measured after
2 rounds, data seeds 0-4 of these clients, batched / nudged: FedAvg 1.7e-6 / 3e-2, FedProx 7.3e-6 / 1.8e-2,
FedBN 3.1e-6 / 6.2e-2, CCST with fft 9.8e-6 / 1.8e-5, CCST with fake_tag's constant images (every max-pool
a tie that a rounding flips) 4.1e-2 / 2.5e-3; on digits4 (FedAvg and CCST, 3 clients, 10 local steps,
seeds 0-2) 1.1e-2 / 8.3e-3 in the weights and 0.37 / 0.35 in BatchNorm's running statistics. Adam moves the
few weights whose gradient is at rounding level by up to lr (7.7e-3; its normalised step turns that noise
into steps), train_loss within 4e-5. So no fixed bound holds; the float32 test (FedAvg and CCST with fft,
SGD, seed 0) allows 1e-3. The clients have 24, 19 and 10 samples in batches of 8: 3, 3 and 2 steps, short
last batches (ragged lockstep)."""

from __future__ import annotations

import json

import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.style_exchange import StyleExchange
from fedstyle.cli.main import main
from fedstyle.data.client import ClientData
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.star import FederationSettings, StarSimulator

from test_ccst import FakeTag, fresh_cache  # noqa: F401  (the fake_tag style backend; an empty cache per test)
from tiny import interrupt_and_resume, make_clients, make_model  # tests/tiny.py

SIZES = (24, 19, 10)
SETTINGS = FederationSettings(rounds=2, lr=0.05, batch_size=8, local_epochs=1)
EXACT, FLOAT32 = 1e-9, 1e-3


class Float64(BatchTransform):
    """The batches in float64, where both paths compute bit for bit alike (an exact check of the executor)."""

    def __call__(self, x, train, generator=None):
        return super().__call__(x, train, generator).double()


def clients(dtype):
    transform = Float64 if dtype == torch.float64 else BatchTransform
    t = transform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")
    return [ClientData(c.images[:n], c.labels[:n], c.domains[:n], t) for c, n in zip(make_clients(3), SIZES)]


def simulate(method, mode, hp=None, settings=SETTINGS, dtype=torch.float64, rounds=2):
    algo, model = make_model(method, hp)
    model.to(dtype)
    sim = StarSimulator(algo, model, clients(dtype), settings, seed=0, device=torch.device("cpu"), client_batching=mode)
    sim.setup()
    return sim, [sim.run_round(r) for r in range(rounds)]


def max_difference(a: StarSimulator, b: StarSimulator) -> float:
    """Largest absolute difference of the global weights and buffers and of every client's state."""
    pairs = [(a.server.weights, b.server.weights)] + [(a.client_states[c], b.client_states[c]) for c in range(3)]
    worst = 0.0
    for x, y in pairs:
        assert x.keys() == y.keys()
        for key in x:
            assert x[key].dtype == y[key].dtype
            worst = max(worst, float((x[key].double() - y[key].double()).abs().max()))
    return worst


def assert_same(seq, bat, tolerance, loss_tolerance=1e-9):
    (a, ra), (b, rb) = seq, bat
    assert max_difference(a, b) <= tolerance
    for x, y in zip(ra, rb):
        assert x.clients == y.clients
        assert y.train_loss == pytest.approx(x.train_loss, abs=loss_tolerance)
        assert x.metrics.keys() == y.metrics.keys()
        for key in x.metrics:
            if not key.endswith("_seconds"):
                assert y.metrics[key] == pytest.approx(x.metrics[key], abs=loss_tolerance)


@pytest.mark.parametrize("method, hp, optimizer", [
    ("fedavg", None, "sgd"),
    ("fedprox", {"mu": 0.1}, "sgd"),
    ("fedbn", None, "sgd"),
    ("fedavg", None, "adam"),
    ("fedavg", {"augment": "randconv"}, "sgd"),  # draws from torch's global generator: one stream per client
])
def test_batched_equals_sequential(method, hp, optimizer):
    settings = FederationSettings(rounds=2, lr=0.05 if optimizer == "sgd" else 0.01, batch_size=8, local_epochs=1,
                                  optimizer=optimizer)
    seq, bat = simulate(method, "off", hp, settings), simulate(method, "on", hp, settings)
    assert seq[0].batching().trainer is None and bat[0].batching().trainer is not None
    assert_same(seq, bat, EXACT)
    sizes = [sum(len(seq[0].clients[c]) for c in r.clients) for r in seq[1]]
    assert sizes == [sum(SIZES)] * 2
    if method == "fedbn":  # local BatchNorm: running statistics and counters kept per client
        state = bat[0].client_states[2]
        assert int(state["local/backbone.layer1.1.num_batches_tracked"]) == 2 * 2  # 2 steps in each of 2 rounds


def test_batched_steps_the_head_at_head_lr_scale_as_the_sequential_path():
    scaled = FederationSettings(rounds=2, lr=0.05, batch_size=8, local_epochs=1, head_lr_scale=10.0)
    seq, bat = simulate("fedavg", "off", None, scaled), simulate("fedavg", "on", None, scaled)
    assert_same(seq, bat, EXACT)
    assert max_difference(seq[0], simulate("fedavg", "off")[0]) > 1e-3  # the scale changed the run


@pytest.mark.parametrize("method, hp", [("fedavg", None), ("ccst", {"style_backend": "fft", "k": 2})])
def test_float32_within_the_stated_tolerance(method, hp, tmp_path, monkeypatch):
    runs = []
    for mode in ("off", "on"):
        monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / mode))  # each run makes (and counts) its own images
        runs.append(simulate(method, mode, hp, dtype=torch.float32))
    seq, bat = runs
    assert bat[0].batching().trainer is not None
    assert_same(seq, bat, FLOAT32, loss_tolerance=1e-5)


@pytest.mark.parametrize("method", ["mixstyle", "dsu"])
def test_style_ops_fall_back_with_the_reason_and_identical_results(method, capsys):
    seq = simulate(method, "off", dtype=torch.float32, rounds=1)
    bat = simulate(method, "on", dtype=torch.float32, rounds=1)
    said = capsys.readouterr().err.strip().splitlines()  # one line on stderr, no warning's source line
    assert len(said) == 1 and f"{method} trains its clients one by one: its {method} style op draws" in said[0]
    assert bat[0].batching().trainer is None and "forward pass" in bat[0].batching().reason
    assert_same(seq, bat, 0.0, loss_tolerance=0.0)


@pytest.mark.parametrize("declared", [False, True])
def test_ccst_batches_once_its_local_train_is_declared_a_wrapper(declared, tmp_path, monkeypatch, capsys):
    """CCST's local_train (StyleExchange's) wraps the base loop to count lazily stylized images: declared in
    BATCHING_WRAPPERS (as StyleExchange does) it batches, and the counts match; undeclared it falls back,
    results unchanged."""
    if not declared:
        monkeypatch.setattr(StyleExchange, "BATCHING_WRAPPERS", ())
    hp = {"style_backend": "fake_tag", "k": 2}
    runs = {}
    for mode in ("off", "on"):
        monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / mode))  # each run stylizes its own images
        runs[mode] = simulate("ccst", mode, hp)
        fallback = "trains its clients one by one" in capsys.readouterr().err
        assert fallback == (mode == "on" and not declared)
    batched = runs["on"][0].batching().trainer is not None
    assert batched == (METHODS.get("ccst").batching_support(runs["on"][0].algo.hp) is None) == declared
    assert_same(runs["off"], runs["on"], EXACT)
    assert runs["on"][1][0].metrics["stylized_images"] > 0


def test_auto_is_sequential_on_cpu_and_a_bad_mode_is_refused(tiny_config):
    sim, _ = simulate("fedavg", "auto", rounds=0)
    assert sim.batching().trainer is None and "CUDA only" in sim.batching().reason
    with pytest.raises(ConfigError, match="--client-batching 'sometimes' is not one of auto, on, off"):
        tiny_config.updated(client_batching="sometimes").validate()
    with pytest.raises(ConfigError, match="client_batching 'yes' is not one of"):
        simulate("fedavg", "yes", rounds=0)
    assert RunConfig().client_batching == "auto"


def test_a_run_with_client_batching_on_matches_off_and_resumes_exactly(tiny_config, tmp_path, monkeypatch):
    """The option reaches the simulator through the config (float32 end to end); a batched run
    interrupted and resumed repeats the uninterrupted one."""
    for mode in ("off", "on"):
        run_experiment(tiny_config.updated(client_batching=mode), tmp_path / mode, quiet=True)
        assert json.loads((tmp_path / mode / "config.json").read_text())["client_batching"] == mode
    interrupt_and_resume(tiny_config.updated(client_batching="on"), tmp_path / "resumed", monkeypatch, at_round=1)

    def losses(run):
        return [json.loads(line).get("train_loss") for line in (tmp_path / run / "metrics.jsonl").open()]

    assert losses("on") == pytest.approx(losses("off"), abs=1e-5) and len(losses("on")) == 2
    assert losses("resumed") == losses("on")


def test_methods_listing_says_which_methods_batch(capsys):
    blocks = {}
    for name in ("fedavg", "fedprox", "mixstyle", "fedsam"):  # `fedstyle methods NAME`: the method in detail
        main(["methods", name])
        blocks[name] = capsys.readouterr().out
    assert "client batching: yes" in blocks["fedavg"] and "client batching: yes" in blocks["fedprox"]
    assert "client batching: no (its mixstyle style op" in blocks["mixstyle"]
    assert "client batching: no (its own training_step)" in blocks["fedsam"]
