"""StyleDDG (issue 13): the batch style psi_i against hand computations, the three style steps, what a
device sees on a graph, the bytes counted per edge and iteration, determinism and the bad-input errors."""

from __future__ import annotations

import copy
import json

import networkx as nx
import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.context import ClientContext, TrainSettings
from fedstyle.algorithms.styleddg import StyleDDG
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import resume_experiment, run_experiment
from fedstyle.federation.p2p import P2PSimulator
from fedstyle.models import build_model
from fedstyle.models.base import Backbone, Classifier
from fedstyle.payload import weights_nbytes
from fedstyle.style import StyleSummary, batch_style, channel_stats
from tiny import SETTINGS, make_clients, make_model

CPU = torch.device("cpu")


def _algo(**hp) -> StyleDDG:
    return StyleDDG(hp, num_classes=4, num_clients=3)


def _ctx(phase="train") -> ClientContext:
    data = make_clients(1)[0]
    return ClientContext(client_id=0, data=data, state={}, train=TrainSettings(lr=0.1, batch_size=8), round=0,
                         num_clients=1, device=CPU, seed=0, phase=phase)


class ToyBackbone(Backbone):
    """Stages with known effects on the statistics: layer1 identity, layer2 doubles, layer3 adds 1."""

    stage_names = ("layer1", "layer2", "layer3", "layer4")
    feature_dim = 1

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def run_stage(self, name, x):
        self.calls.append(name)
        return {"layer1": lambda t: t, "layer2": lambda t: 2 * t, "layer3": lambda t: t + 1,
                "layer4": lambda t: t}[name](x)


# -- psi_i (Eq. 15) --------------------------------------------------------------------------------
def test_psi_equals_a_hand_computation_on_a_tiny_batch():
    # sample 0: [[1, 3], [1, 3]] -> mu 2, var 1;  sample 1: [[4, 4], [8, 8]] -> mu 6, var 4   (one channel)
    x = torch.tensor([[[[1.0, 3.0], [1.0, 3.0]]], [[[4.0, 4.0], [8.0, 8.0]]]])
    model = Classifier(ToyBackbone(), 2)
    algo = _algo()
    algo.configure_model(model)
    model.eval()
    psi = algo.p2p_share(_ctx("share"), model, x)
    assert sorted(psi) == ["layer1", "layer2", "layer3"]
    assert model.backbone.calls == ["layer1", "layer2", "layer3"]  # stops after the last shared stage
    s1, s2 = 1.0, 2.0  # sigma = sqrt(var + 1e-6), checked to 1e-5 below
    # rows: mean mu, mean sigma, var mu (1/B), var sigma (1/B)
    expected = {
        "layer1": [[4.0], [(s1 + s2) / 2], [4.0], [0.25]],
        "layer2": [[8.0], [3.0], [16.0], [1.0]],   # x2: mu 4, 12; sigma 2, 4
        "layer3": [[9.0], [3.0], [16.0], [1.0]],   # +1 shifts the means only
    }
    for stage, rows in expected.items():
        assert psi[stage].shape == (4, 1)
        assert torch.allclose(psi[stage], torch.tensor(rows), atol=1e-5), (stage, psi[stage])


def test_psi_uses_batch_statistics_without_touching_batchnorm_state():
    algo, model = make_model("styleddg")
    x = torch.randn(8, 3, 16, 16) * 2 + 1
    before = copy.deepcopy(model.state_dict())
    model.eval()
    psi = algo.p2p_share(_ctx("share"), model, x)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats and counters unchanged
    assert not model.training and not any(m.training for m in model.modules())  # modes restored

    def stage_styles(train_mode: bool) -> dict[str, torch.Tensor]:
        ref = copy.deepcopy(model).train(train_mode)
        seen = {}
        with torch.no_grad():
            ref.backbone.forward_stages(x, lambda n, h: seen.setdefault(n, batch_style(h).as_tensor()) is None or h)
        return seen

    training = stage_styles(True)  # what a training forward's BatchNorm computes (Eq. 15)
    for stage in ("layer1", "layer2", "layer3"):
        assert torch.allclose(psi[stage], training[stage], atol=1e-5)
    eval_algo = _algo(share_stats="eval")
    eval_psi = eval_algo.p2p_share(_ctx("share"), model, x)
    running = stage_styles(False)
    assert torch.allclose(eval_psi["layer1"], running["layer1"], atol=1e-5)
    assert not torch.allclose(eval_psi["layer1"], psi["layer1"], atol=1e-3)  # a real difference early on


def test_resnet18_shares_the_papers_1792_numbers():
    model = build_model("resnet18", 4, 32)
    algo = _algo()
    algo.configure_model(model)
    model.eval()
    psi = algo.p2p_share(_ctx("share"), model, torch.randn(2, 3, 32, 32))
    assert {k: tuple(v.shape) for k, v in psi.items()} == {"layer1": (4, 64), "layer2": (4, 128), "layer3": (4, 256)}
    assert sum(v.numel() for v in psi.values()) == 1792  # Remark 4.1


# -- the style steps (Eq. 16-19) ---------------------------------------------------------------------
def _features(seed=1, b=6, c=3):
    g = torch.Generator().manual_seed(seed)
    scale, shift = torch.linspace(0.5, 2.0, b).view(b, 1, 1, 1), torch.arange(b).view(b, 1, 1, 1)
    return torch.randn(b, c, 5, 5, generator=g) * scale + shift


def test_zero_neighbour_spread_shifts_half_the_batch_exactly_to_the_neighbours_statistics():
    torch.manual_seed(0)
    h = _features()
    target = StyleSummary(torch.tensor([5.0, -2.0, 0.5]), torch.tensor([0.5, 2.0, 1.5]), torch.zeros(3), torch.zeros(3))
    out, shifted = _algo(ops="shift").restyle_stage(h, target)
    assert shifted
    mu, sigma = channel_stats(out)
    carries = [torch.allclose(mu[k].flatten(), target.mu_mean, atol=1e-4)
               and torch.allclose(sigma[k].flatten(), target.sigma_mean, atol=1e-3) for k in range(6)]
    unchanged = [torch.allclose(out[k], h[k], atol=1e-5) for k in range(6)]
    assert sum(carries) == 3 and sum(unchanged) == 3 and all(a != b for a, b in zip(carries, unchanged))


@pytest.mark.parametrize("negative_sigma", ["keep", "clamp"])
def test_explore_with_alpha_zero_is_the_identity_and_alpha_three_matches_eq18(negative_sigma):
    torch.manual_seed(0)
    h = _features()
    out, _ = _algo(ops="explore", alpha=0.0, negative_sigma=negative_sigma).restyle_stage(h, None)
    assert torch.allclose(out, h, atol=1e-5)
    out, _ = _algo(ops="explore", alpha=3.0, negative_sigma=negative_sigma).restyle_stage(h, None)
    mu, sigma = channel_stats(h)
    moved = [k for k in range(6) if not torch.allclose(out[k], h[k], atol=1e-5)]
    assert len(moved) == 3  # a random half, no oversampling: the batch keeps its size
    negative = 0
    for k in moved:  # mu_e = mu + 3 (mu - E_b mu), sigma likewise (no shift ran: E_b over the batch itself)
        mu_e = mu[k] + 3 * (mu[k] - mu.mean(0))
        sigma_e = sigma[k] + 3 * (sigma[k] - sigma.mean(0))
        negative += int((sigma_e < 0).sum())
        if negative_sigma == "clamp":
            sigma_e = sigma_e.clamp_min(1e-6)
        expected = (h[k] - mu[k]) / sigma[k] * sigma_e + mu_e  # AdaIN, Eq. 1, with the equation's sigma_e
        assert torch.allclose(out[k], expected, atol=1e-4)
    assert negative > 0  # this batch exercises the case: keep inverts the contrast, clamp flattens


def test_mixstyle_step_gives_convex_combinations_of_the_batch_styles():
    torch.manual_seed(0)
    h = _features()
    out, _ = _algo(ops="mix").restyle_stage(h, None)
    mu, _ = channel_stats(h)
    mu_out, _ = channel_stats(out)
    low, high = mu.min(0).values, mu.max(0).values
    assert bool(((mu_out >= low - 1e-4) & (mu_out <= high + 1e-4)).all()) and not torch.allclose(out, h)


def test_the_three_steps_need_a_neighbour_style_only_for_the_shift():
    torch.manual_seed(0)
    h = _features()
    _, shifted = _algo().restyle_stage(h, None)
    assert not shifted  # no_neighbour=skip
    _, shifted = _algo(no_neighbour="own").restyle_stage(h, None)
    assert shifted


# -- Eq. 19 through a full forward pass (issue 21 §4) -----------------------------------------------------
class RecordingBackbone(ToyBackbone):
    """ToyBackbone with two channels that keeps each stage's input: layer2's input is what the style
    hook returned after layer1, i.e. the restyled features."""

    feature_dim = 2

    def __init__(self):
        super().__init__()
        self.inputs: dict[str, torch.Tensor] = {}

    def run_stage(self, name, x):
        self.inputs[name] = x.detach().clone()
        return super().run_stage(name, x)


def _maps_with_styles(mu, sigma):
    """(B, C, 2, 2) maps whose (b, c) map is [[m - s, m + s], [m + s, m - s]]: mean m, std s exactly."""
    mu, sigma = torch.tensor(mu).view(4, 2, 1, 1), torch.tensor(sigma).view(4, 2, 1, 1)
    pattern = torch.tensor([[-1.0, 1.0], [1.0, -1.0]])
    return mu + sigma * pattern


# batch of B = 4, C = 2 at layer1; rows are samples, columns channels
ORIGINAL_MU = [[1.0, 4.0], [2.0, 0.0], [3.0, 2.0], [4.0, -2.0]]
ORIGINAL_SIGMA = [[1.0, 1.0], [2.0, 3.0], [1.0, 2.0], [2.0, 3.0]]
NEIGHBOUR_MU, NEIGHBOUR_SIGMA = [6.0, 0.0], [1.0, 2.0]  # psi_j's mu_bar, sigma_bar (no noise: shift_noise=false)
SHIFT_IDX, EXPLORE_IDX, MIX_PERM = [2, 0, 3, 1], [1, 3, 0, 2], [3, 2, 1, 0]  # randperm draws, in this order
LAMBDA = [0.5, 0.25, 0.75, 0.5]
# By hand:
#   StyleShift (Eq. 16-17), samples 2, 0 (SHIFT_IDX[:2]) take (6, 0) / (1, 2):
#     mu_s = [[6, 0], [2, 0], [6, 0], [4, -2]]             E_b mu_s = [4.5, -0.5]
#     sigma_s = [[1, 2], [2, 3], [1, 2], [2, 3]]           E_b sigma_s = [1.5, 2.5]
#   StyleExplore (Eq. 18, alpha = 3, centre E_b of the shift output), samples 1, 3 (EXPLORE_IDX[:2]):
#     mu_e[1] = [2 + 3(2 - 4.5), 0 + 3(0 + 0.5)] = [-5.5, 1.5]     mu_e[3] = [4 - 1.5, -2 - 4.5] = [2.5, -6.5]
#     sigma_e[1] = [2 + 1.5, 3 + 1.5] = [3.5, 4.5]                  sigma_e[3] = [3.5, 4.5]
#     mu_e = [[6, 0], [-5.5, 1.5], [6, 0], [2.5, -6.5]]     sigma_e = [[1, 2], [3.5, 4.5], [1, 2], [3.5, 4.5]]
#   permuted by pi = (3, 2, 1, 0):
#     mu_e[pi] = [[2.5, -6.5], [6, 0], [-5.5, 1.5], [6, 0]]   sigma_e[pi] = [[3.5, 4.5], [1, 2], [3.5, 4.5], [1, 2]]
#   Eq. 19 with Eq. 4-5 (mix_from=shifted): lambda mu_s + (1 - lambda) mu_e[pi]
#     b0: .5 [6, 0] + .5 [2.5, -6.5] = [4.25, -3.25]        .5 [1, 2] + .5 [3.5, 4.5] = [2.25, 3.25]
#     b1: .25 [2, 0] + .75 [6, 0] = [5, 0]                  .25 [2, 3] + .75 [1, 2] = [1.25, 2.25]
#     b2: .75 [6, 0] + .25 [-5.5, 1.5] = [3.125, 0.375]     .75 [1, 2] + .25 [3.5, 4.5] = [1.625, 2.625]
#     b3: .5 [4, -2] + .5 [6, 0] = [5, -1]                  .5 [2, 3] + .5 [1, 2] = [1.5, 2.5]
#   Fig. 1(c) (mix_from=explored): lambda mu_e + (1 - lambda) mu_e[pi] — differs on the explored b1, b3
#     b1: .25 [-5.5, 1.5] + .75 [6, 0] = [3.125, 0.375]     .25 [3.5, 4.5] + .75 [1, 2] = [1.625, 2.625]
#     b3: .5 [2.5, -6.5] + .5 [6, 0] = [4.25, -3.25]        .5 [3.5, 4.5] + .5 [1, 2] = [2.25, 3.25]
EXPECTED = {
    "shifted": ([[4.25, -3.25], [5.0, 0.0], [3.125, 0.375], [5.0, -1.0]],
                [[2.25, 3.25], [1.25, 2.25], [1.625, 2.625], [1.5, 2.5]]),
    "explored": ([[4.25, -3.25], [3.125, 0.375], [3.125, 0.375], [4.25, -3.25]],
                 [[2.25, 3.25], [1.625, 2.625], [1.625, 2.625], [2.25, 3.25]]),
}


def _restyled_by_a_training_forward(monkeypatch, **hp) -> torch.Tensor:
    """One ``training_loss`` call (hook, backbone, neck, head, loss) with the draws fixed; returns the
    features the hook handed on after layer1."""
    algo = _algo(stages="layer1", p=1.0, shift_noise=False, **hp)
    model = Classifier(RecordingBackbone(), 4)
    algo.configure_model(model)
    model.train()
    draws = [torch.tensor(d) for d in (SHIFT_IDX, EXPLORE_IDX, MIX_PERM)]
    monkeypatch.setattr(torch, "randperm", lambda n, device=None: draws.pop(0))
    monkeypatch.setattr(algo, "mix_weights", lambda batch, like: torch.tensor(LAMBDA).view(batch, 1, 1, 1))
    psi = torch.tensor([NEIGHBOUR_MU, NEIGHBOUR_SIGMA, [0.0, 0.0], [0.0, 0.0]])
    x = _maps_with_styles(ORIGINAL_MU, ORIGINAL_SIGMA)
    loss = algo.training_loss(_ctx(), model, x, torch.tensor([0, 1, 2, 3]), {1: {"layer1": psi}})
    assert torch.isfinite(loss) and draws == []  # shift, explore and mix each drew their permutation
    return model.backbone.inputs["layer2"]


@pytest.mark.parametrize("mix_from", [None, "shifted", "explored"])
def test_eq19_mixes_the_shift_output_with_permuted_explored_styles_by_hand_values(monkeypatch, mix_from):
    hp = {} if mix_from is None else {"mix_from": mix_from}
    restyled = _restyled_by_a_training_forward(monkeypatch, **hp)
    mu, sigma = channel_stats(restyled)
    expected_mu, expected_sigma = EXPECTED[mix_from or "shifted"]  # the default follows Eq. 19
    assert torch.allclose(mu.view(4, 2), torch.tensor(expected_mu), atol=1e-5), mu.view(4, 2)
    assert torch.allclose(sigma.view(4, 2), torch.tensor(expected_sigma), atol=1e-4), sigma.view(4, 2)


def test_mix_from_default_is_eq19_and_the_figure_reading_stays_an_option():
    hp = StyleDDG.resolve({})
    assert hp["mix_from"] == "shifted"
    spec = {h.name: h for h in StyleDDG.HPARAMS}["mix_from"]
    assert set(spec.choices) == {"shifted", "explored"} and "Eq. 19" in spec.help and "Fig. 1c" in spec.help
    # the paper's values elsewhere stay the defaults (issue 21 §5: sensitivity runs are options)
    assert hp["alpha"] == 3.0 and hp["stages"] == "layer1,layer2,layer3" and hp["p"] == 0.5


# -- on a graph ----------------------------------------------------------------------------------------
def _ring_sim(steps=3, n=5, **hp):
    algo, model = make_model("styleddg", hp=hp, n_clients=n)
    settings = SETTINGS.__class__(rounds=1, lr=0.01, batch_size=8, local_steps=steps)
    return algo, P2PSimulator(algo, model, make_clients(n), settings, nx.cycle_graph(n), seed=0, device=CPU)


def test_on_a_ring_a_device_sees_only_its_neighbours_styles(monkeypatch):
    algo, sim = _ring_sim(p=1.0)
    shares, received, draws = [], [], []
    share, loss, draw = algo.p2p_share, algo.training_loss, algo.draw_neighbour

    def record_share(ctx, model, x):
        psi = share(ctx, model, x)
        shares.append((ctx.client_id, psi))
        return psi

    def record_loss(ctx, model, x, y, payload):
        received.append((ctx.client_id, payload))
        return loss(ctx, model, x, y, payload)

    def record_draw(neighbours):
        j = draw(neighbours)
        draws.append((received[-1][0], neighbours, j))
        return j

    monkeypatch.setattr(algo, "p2p_share", record_share)
    monkeypatch.setattr(algo, "training_loss", record_loss)
    monkeypatch.setattr(algo, "draw_neighbour", record_draw)
    sim.run_round(0)
    assert len(received) == 15 and len(draws) == 15 * 3  # p = 1: a draw at each of the three stages
    for index, (device, payload) in enumerate(received):
        step = index // 5
        assert sorted(payload) == sorted({(device - 1) % 5, (device + 1) % 5})
        for j, psi in payload.items():  # exactly neighbour j's psi of this iteration
            owner, sent = shares[step * 5 + j]
            assert owner == j and all(torch.equal(psi[k], sent[k]) for k in sent)
    for device, neighbours, j in draws:
        assert neighbours == sorted({(device - 1) % 5, (device + 1) % 5}) and j in neighbours
    assert {j for _, _, j in draws} == set(range(5))


def test_neighbour_is_drawn_per_stage_or_once_per_iteration(monkeypatch):
    for mode, per_call in (("stage", 3), ("iteration", 1)):
        algo, sim = _ring_sim(steps=1, p=1.0, neighbour_draw=mode)
        calls = []
        draw = algo.draw_neighbour
        monkeypatch.setattr(algo, "draw_neighbour", lambda ns, draw=draw, calls=calls: calls.append(ns) or draw(ns))
        sim.run_round(0)
        assert len(calls) == 5 * per_call


def test_style_bytes_per_iteration_are_four_numbers_per_channel_per_neighbour():
    algo, sim = _ring_sim(steps=3)
    result = sim.run_round(0)
    per_neighbour = 4 * (64 + 64 + 64) * 4  # [mu_bar, sigma_bar, var mu, var sigma] x channels x float32
    assert sim.traffic.payload_up == sim.traffic.payload_down == per_neighbour * 2 * 3 * 5  # 2 neighbours, 3 steps
    edge = sim.traffic.per_edge_iteration()
    model_bytes = weights_nbytes({k: v[0] for k, v in sim.stacked.items()})
    assert edge == {"iterations": 3, "model_bytes": model_bytes, "payload_bytes": per_neighbour,
                    "payload_values": per_neighbour / 4, "payload_fraction_of_model": per_neighbour / model_bytes}
    assert sim.traffic.model_up == model_bytes * 2 * 3 * 5  # weights counted apart
    assert {"loss_ce", "style_fired", "style_shifted", "style_share_seconds"} <= set(result.metrics)


def test_a_device_without_neighbours_explores_and_mixes_without_a_shift():
    for fallback, expect_shift in (("skip", False), ("own", True)):
        algo, model = make_model("styleddg", hp={"p": 1.0, "no_neighbour": fallback}, n_clients=1)
        settings = SETTINGS.__class__(rounds=1, lr=0.01, batch_size=8, local_steps=2)
        sim = P2PSimulator(algo, model, make_clients(1), settings, nx.complete_graph(1), seed=0, device=CPU)
        metrics = sim.run_round(0).metrics
        assert metrics["style_fired"] == 1.0 and (metrics["style_shifted"] == 1.0) == expect_shift
        assert sim.traffic.payload_up == 0


# -- runs ------------------------------------------------------------------------------------------------
def _config(tiny_config, **kw):
    return tiny_config.updated(method="styleddg", topology="ring", partition="per_domain", clients=3, **kw)


def _metrics(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k != "seconds" and k != "train_metrics"}
            | {"tm": {k: v for k, v in json.loads(line).get("train_metrics", {}).items() if "seconds" not in k}}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_same_seed_same_metrics_and_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    config = _config(tiny_config, rounds=2)
    a = run_experiment(config, tmp_path / "a", quiet=True)
    b = run_experiment(config, tmp_path / "b", quiet=True)
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
    assert a["targets"] == b["targets"] and a["device_target_acc_last"] == b["device_target_acc_last"]
    run_experiment(config.updated(seed=1), tmp_path / "c", quiet=True)
    assert _metrics(tmp_path / "a") != _metrics(tmp_path / "c")
    edge = a["traffic"]["per_edge_iteration"]
    assert edge["payload_values"] == 4 * 3 * 64 and edge["iterations"] == 2 * 2  # 2 rounds x 2 local steps
    assert a["traffic"]["bytes_payload_up"] == 4 * edge["payload_values"] * 2 * 3 * 4  # 2 nbrs, 3 devices, 4 its
    record = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"loss_ce", "style_fired", "style_shifted"} <= set(record["train_metrics"])
    assert set(record["device_target_acc"]["grey"]) == {"mean", "std"} and record["consensus_distance"] >= 0

    original = P2PSimulator.run_round

    def interrupted(self, round_index):
        if round_index == 1:
            raise KeyboardInterrupt
        return original(self, round_index)

    monkeypatch.setattr(P2PSimulator, "run_round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", quiet=True)
    monkeypatch.setattr(P2PSimulator, "run_round", original)
    resumed = resume_experiment(tmp_path / "cut", quiet=True)
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "a")
    assert resumed["traffic"] == a["traffic"]


def test_cli_summary_shows_devices_and_bytes_per_edge_and_iteration(tiny_root, tmp_path, capsys):
    code = main(["run", "--dataset", "folder", "--data-root", str(tiny_root), "--target", "grey", "--method",
                 "styleddg", "--topology", "complete", "--partition", "per_domain", "--clients", "3",
                 "--rounds", "1", "--local-steps", "1", "--batch-size", "8", "--min-client-size", "2",
                 "--resolution", "16", "--device", "cpu", "--out", str(tmp_path / "run"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "devices (last round, mean ± std): grey" in out and "consensus distance" in out
    assert "share 3,072 bytes (768 numbers" in out


# -- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,match", [
    ({"topology": "star", "partition": "domain", "clients": None}, r"--topology complete"),
    ({"hparams": {"p": 1.5}}, r"'p' of styleddg: 1\.5 is above the maximum 1\.0; p takes values in \[0\.0, 1\.0\]"),
    ({"hparams": {"p": -0.1}}, r"below the minimum 0\.0; p takes values in \[0\.0, 1\.0\]"),
    ({"hparams": {"stages": "layer1,layer9"}}, r"ConvNet backbone has no stage 'layer9'.*--hp stages=layer1,layer2,layer3"),
    ({"hparams": {"stages": ""}}, r"stages is empty"),
    ({"hparams": {"ops": "shift,warp"}}, r"not a subset of shift,explore,mix"),
    ({"hparams": {"mix_alpha": 0}}, r"mix_alpha=0\.0 must be > 0"),
])
def test_bad_input_is_one_line_naming_the_fix_before_anything_is_written(tiny_config, tmp_path, changes, match):
    with pytest.raises(ConfigError, match=match) as info:
        run_experiment(_config(tiny_config).updated(**changes), tmp_path / "run", quiet=True)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_flower_refuses_styleddg_naming_the_in_process_simulator(tiny_config, tiny_root, tmp_path, capsys):
    for topology in ("complete", "star"):  # a p2p graph, or the star Flower needs: both refused
        with pytest.raises(ConfigError, match="in-process simulator.*--backend sim --method styleddg") as info:
            run_experiment(_config(tiny_config, backend="flower-sim").updated(topology=topology), tmp_path / "f")
        assert "\n" not in str(info.value) and not (tmp_path / "f").exists()
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    code = main(["deploy", "--sites", "3", "--insecure", "--quiet", "--dataset", "folder", "--data-root",
                 str(tiny_root), "--target", "grey", "--method", "styleddg", "--topology", "complete",
                 "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 2 and "fedstyle deploy runs star-topology methods only" in err and "in-process simulator" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


def test_registered_for_the_peer_to_peer_topologies_only():
    cls = METHODS.get("styleddg")
    assert cls is StyleDDG and cls.topologies == ("complete", "ring", "rgg", "erdos_renyi")
    assert cls.display_name(cls.resolve({})) == "StyleDDG" and cls({}, num_classes=2, num_clients=2).uses_phase("share")
