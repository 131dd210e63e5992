"""FedDG-GA (baselines notes §5): the generalization adjustment by hand, weights that stay a
probability vector, the step decay, partial participation through the query phase, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedstyle.algorithms.context import ClientUpdate, ServerContext
from fedstyle.algorithms.feddg_ga import WEIGHTS, FedDGGA, adjust_weights
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.rounds import FederationSettings
from fedstyle.federation.star import StarSimulator
from tiny import make_clients, make_model, interrupt_and_resume


def test_adjustment_by_hand():
    weights = torch.full((4,), 0.25, dtype=torch.float64)
    # clients 0 and 2 sampled with gaps .2 and -.1: normalised 1 and -.5; step d / M = .2 / 4 = .05
    out = adjust_weights(weights, [0, 2], [0.2, -0.1], 0.05)
    raw = torch.tensor([0.30, 0.25, 0.225, 0.25], dtype=torch.float64)
    torch.testing.assert_close(out, raw / 1.025)
    # accuracy gaps move the other way (s = -1)
    torch.testing.assert_close(adjust_weights(weights, [0, 2], [0.2, -0.1], 0.05, sign=-1.0),
                               torch.tensor([0.20, 0.25, 0.275, 0.25], dtype=torch.float64) / 0.975)
    # centring: gaps .2, -.1 -> .15, -.15 -> 1, -1
    torch.testing.assert_close(adjust_weights(weights, [0, 2], [0.2, -0.1], 0.05, center=True),
                               torch.tensor([0.30, 0.25, 0.20, 0.25], dtype=torch.float64))
    # a NaN gap (no previous participation) leaves that weight alone; all-zero gaps change nothing
    torch.testing.assert_close(adjust_weights(weights, [0, 1], [math.nan, 0.4], 0.05),
                               torch.tensor([0.25, 0.30, 0.25, 0.25], dtype=torch.float64) / 1.05)
    torch.testing.assert_close(adjust_weights(weights, [0, 1], [0.0, 0.0], 0.05), weights)


def test_weights_stay_a_probability_vector():
    g = torch.Generator().manual_seed(0)
    weights = torch.full((10,), 0.1, dtype=torch.float64)
    for _ in range(200):
        chosen = torch.randperm(10, generator=g)[:3].tolist()
        gaps = (torch.randn(3, generator=g) * 5).tolist()
        weights = adjust_weights(weights, chosen, gaps, float(torch.rand(1, generator=g)) * 2)  # steps up to 2: clips
        assert float(weights.sum()) == pytest.approx(1.0) and float(weights.min()) >= 0 and float(weights.max()) <= 1


def test_step_decays_linearly_over_the_rounds():
    algo = FedDGGA({"step": 0.2}, num_classes=2, num_clients=4)
    server = ServerContext(weights={}, state={}, round=0, num_clients=4, seed=0, rounds=10)
    assert algo.step_at(server) == pytest.approx(0.2 / 4)
    server.round = 5
    assert algo.step_at(server) == pytest.approx(0.1 / 4)
    ref = FedDGGA({"reference_code": True}, num_classes=2, num_clients=100)
    server = ServerContext(weights={}, state={}, round=5, num_clients=100, seed=0, rounds=10)
    assert ref.step_at(server) == pytest.approx(0.5 / 3)  # PARDON's fork: (1 - r/R) / 3


def test_aggregation_uses_the_stored_weights_of_the_participants():
    algo = FedDGGA({}, num_classes=2, num_clients=4)
    server = ServerContext(weights={"w": torch.zeros(1)}, state={}, round=1, num_clients=4, seed=0, rounds=4)
    algo.init_server_state(server)
    server.state[WEIGHTS] = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    updates = [ClientUpdate(1, {"w": torch.tensor([1.0])}, 50, 0.0), ClientUpdate(3, {"w": torch.tensor([2.0])}, 5, 0.0)]
    # .2 / .6 * 1 + .4 / .6 * 2 (sizes ignored)
    torch.testing.assert_close(algo.aggregate(server, updates)["w"], torch.tensor([5.0 / 3]))


def test_partial_participation_queries_gaps_and_keeps_a_probability_vector():
    clients = make_clients(n=6)
    algo, model = make_model("feddg_ga", {"step": 0.5}, n_clients=6)
    settings = FederationSettings(rounds=4, lr=0.05, batch_size=8, local_steps=2, clients_per_round=3)
    sim = StarSimulator(algo, model, clients, settings, seed=0, device=torch.device("cpu"))
    assert algo.uses_phase("query")
    seen, moved = set(), False
    for r in range(4):
        chosen = sim.sample_clients(r)
        before = sim.server.state[WEIGHTS].clone()
        sim.run_round(r)
        weights = sim.server.state[WEIGHTS]
        assert float(weights.sum()) == pytest.approx(1.0) and float(weights.min()) >= 0
        repeat = [c for c in chosen if c in seen]
        # only clients that participated before have a gap, and only their weights move (up to renormalisation)
        unchanged = [c for c in range(6) if c not in repeat]
        ratio = weights[unchanged] / before[unchanged]
        torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio))
        moved |= bool(repeat) and not torch.allclose(weights, before)
        seen |= set(chosen)
        assert all("feddg_ga/local_loss" in sim.client_states[c] for c in chosen)  # kept for the next gap
    assert moved


@pytest.mark.parametrize("hp", [{}, {"gap_fraction": 0.5}])  # the kept subset is checkpointed with the client
def test_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch, hp):
    config = tiny_config.updated(method="feddg_ga", partition="per_domain", clients=6, clients_per_round=3, rounds=4,
                                 hparams=hp)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=3)

    def lines(run):
        return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in (run / "metrics.jsonl").open()]

    assert lines(tmp_path / "cut") == lines(tmp_path / "full")
    assert resumed["targets"] == full["targets"]


def test_accuracy_gap_needs_the_evaluated_local_model():
    with pytest.raises(ConfigError, match="metric=acc needs.*local_loss=eval"):
        FedDGGA({"metric": "acc", "local_loss": "train"}, num_classes=2, num_clients=3)


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_gap_is_measured_on_a_kept_subset_by_hand(fraction):
    """gap_fraction: the global model's loss on a subset of the client's images drawn once and kept, by hand
    through the model's forward pass; 1 measures every image and keeps nothing."""
    import torch.nn.functional as F

    from fedstyle.algorithms.context import ClientContext, TrainSettings
    from fedstyle.algorithms.feddg_ga import _BEFORE, _GAP_POSITIONS

    data = make_clients(n=1, per_client=24)[0]
    algo, model = make_model("feddg_ga", {"gap_fraction": fraction}, n_clients=3)
    model.eval()
    state = {_BEFORE: torch.tensor(0.5, dtype=torch.float64)}

    def gap(seed):
        ctx = ClientContext(client_id=0, data=data, state=state, train=TrainSettings(lr=0.1), round=1, num_clients=3,
                            device=torch.device("cpu"), seed=seed)
        return algo.round_query(ctx, model)["gap"]

    first = gap(seed=5)
    if fraction == 1.0:
        assert _GAP_POSITIONS not in state
        positions = torch.arange(24)
    else:
        positions = state[_GAP_POSITIONS]
        assert len(positions) == 6 and len(set(positions.tolist())) == 6 and positions.tolist() == sorted(positions.tolist())
    with torch.no_grad():
        by_hand = F.cross_entropy(model(data.transform(data.images[positions], train=False)), data.labels[positions])
    assert first == pytest.approx(float(by_hand) - 0.5, abs=1e-5)
    assert gap(seed=6) == first  # another round's seed: the same images
    with pytest.raises(ConfigError, match="gap_fraction must be above 0"):
        FedDGGA({"gap_fraction": 0.0}, num_classes=2, num_clients=3)

