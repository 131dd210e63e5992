"""The algorithm API and the simulators on tiny in-memory data (no dataset files)."""

import math
import types

import networkx as nx
import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.feddyn import flatten
from fedstyle.algorithms.base import (
    NonFiniteLossError,
    batchnorm_keys,
    weighted_average,
)
from fedstyle.algorithms.hparams import HParam, parse_assignments, resolve_hparams
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.federation.client import load_weights, snapshot
from fedstyle.algorithms.context import ClientUpdate, ServerContext, lr_at
from fedstyle.data.client import ClientData
from fedstyle.federation.p2p import P2PSimulator
from fedstyle.payload import check_payload, payload_nbytes, weights_nbytes
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.models import build_model
from fedstyle.seeding import seed_everything

from probes import ExchangeProbe  # tests/probes.py, shared with the Flower tests
from tiny import SETTINGS, TRANSFORM, make_clients, make_model  # tests/tiny.py

def update(weights, n):
    return ClientUpdate(client_id=0, weights=weights, num_samples=n, train_loss=0.0)


# -- hyperparameters ----------------------------------------------------------------------
def test_hparam_parsing_and_errors():
    h = HParam("mu", 0.01, "prox", low=0.0)
    assert h.parse("0.5") == 0.5
    with pytest.raises(ConfigError, match="not a valid float"):
        h.parse("abc")
    with pytest.raises(ConfigError, match="below the minimum"):
        h.parse("-1")
    b = HParam("flag", False, "a flag")
    assert b.parse("true") is True and b.parse("0") is False
    with pytest.raises(ConfigError):
        b.parse("maybe")
    c = HParam("style", "none", "op", choices=("none", "mixstyle"))
    with pytest.raises(ConfigError, match="not one of"):
        c.parse("dsu2")
    i = HParam("k", 3, "count")
    assert i.parse("4") == 4
    with pytest.raises(ConfigError):
        i.parse(2.5)
    with pytest.raises(ConfigError, match="unknown hyperparameter 'mux'.*valid: mu"):
        resolve_hparams([h], {"mux": 1}, "fedprox")
    assert parse_assignments(["mu=0.1", "style = dsu"]) == {"mu": "0.1", "style": "dsu"}
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_assignments(["mu"])
    with pytest.raises(ConfigError, match=r"--hp mu is given twice \(0.1 and 0.2\); give it once"):
        parse_assignments(["mu=0.1", "mu=0.2"])  # the last one silently won
    assert parse_assignments(["mu=0.1", "mu=0.1"]) == {"mu": "0.1"}  # the same twice is harmless


def test_subclass_defaults_and_display_name():
    assert METHODS.get("mixstyle").resolve({})["style"] == "mixstyle"
    assert METHODS.get("fedbn").resolve({})["local_bn"] is True
    fedbn = METHODS.get("fedbn")
    assert fedbn.display_name(fedbn.resolve({"style": "mixstyle"})) == "FedBN + MixStyle"
    fedavg = METHODS.get("fedavg")
    assert fedavg.display_name(fedavg.resolve({"local_bn": "true", "style": "dsu"})) == "FedAvg + FedBN + DSU"


# -- payloads -----------------------------------------------------------------------------
def test_payload_checks_and_bytes():
    p = check_payload({"mu": torch.zeros(4, 8), "k": 3, "name": "abc"}, "test")
    assert payload_nbytes(p) == 4 * 8 * 4 + 8 + 3
    with pytest.raises(FedstyleError, match="only tensors"):
        check_payload({"obj": object()}, "test")
    with pytest.raises(FedstyleError, match="keys must be strings"):
        check_payload({1: torch.zeros(1)}, "test")
    assert weights_nbytes({"a": torch.zeros(10), "b": torch.zeros(2, dtype=torch.float64)}) == 56


# -- aggregation --------------------------------------------------------------------------
def test_weighted_average_by_size_and_uniform():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(10)}
    b = {"w": torch.tensor([5.0, 6.0]), "n": torch.tensor(20)}
    out = weighted_average([update(a, 1), update(b, 3)])
    assert torch.allclose(out["w"], torch.tensor([4.0, 5.0]))  # 0.25*a + 0.75*b
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 18  # round(2.5 + 15)
    out = weighted_average([update(a, 1), update(b, 3)], uniform=True)
    assert torch.allclose(out["w"], torch.tensor([3.0, 4.0]))


def test_feddyn_server_update_hand_computed():
    algo = METHODS.get("feddyn")({"alpha": 0.5}, num_classes=2, num_clients=4)
    algo.param_keys = ["w"]
    server = ServerContext(weights={"w": torch.tensor([1.0])}, state={}, round=0, num_clients=4, seed=0)
    ups = [update({"w": torch.tensor([3.0])}, 1), update({"w": torch.tensor([5.0])}, 9)]
    out = algo.aggregate(server, ups)
    # h = 0 - (0.5/4) * ((3-1) + (5-1)) = -0.75 ; w = mean(3, 5) - h/alpha = 4 + 1.5
    assert torch.allclose(server.state["feddyn/h/w"], torch.tensor([-0.75]))
    assert torch.allclose(out["w"], torch.tensor([5.5]))


def test_feddyn_client_penalty_and_state_update():
    algo, model = make_model("feddyn", {"alpha": 0.1})
    clients = make_clients(1)
    sim = StarSimulator(algo, model, clients, SETTINGS, seed=0, device=torch.device("cpu"))
    before = flatten([sim.server.weights[k] for k in algo.param_keys])
    sim.run_round(0)
    state = sim.client_states[0]
    # grad_i = 0 - alpha * (w_i - w_server): recompute from the uploaded weights
    w_local = flatten([state_w for state_w in _last_local(sim, algo)])
    assert torch.allclose(state["feddyn/grad"], -0.1 * (w_local - before), atol=1e-6)


def _feddyn_by_hand(hparams, scale=None):
    """FedDyn on a 2 x 2 linear model (no bias), W = [[1, 0], [0, 2]], one input x = (1, 1) of class 1, grad_i =
    (0.5, 0, 0, -0.5), the round's download a = (0, 0, 0, 1) (flattened row by row)."""
    algo = METHODS.get("feddyn")({"alpha": 0.1, **hparams}, num_classes=2, num_clients=1)
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    algo.configure_model(model)
    state = {"feddyn/grad": torch.tensor([0.5, 0.0, 0.0, -0.5])}
    if scale is not None:
        state["feddyn/alpha_scale"] = torch.tensor(scale, dtype=torch.float64)
    ctx = types.SimpleNamespace(state=state, global_weights={"weight": torch.tensor([[0.0, 0.0], [0.0, 1.0]])},
                                scratch={})
    ctx.scratch.update({"feddyn/anchor": algo.regularizer.anchor(ctx, model),  # what local_train sets before the steps
                        "feddyn/alpha": algo.regularizer.client_alpha(ctx, algo.hp["alpha_scaling"] == "data_size")})
    return algo, model, ctx, torch.tensor([[1.0, 1.0]]), torch.tensor([1])


def test_feddyn_with_alpha_per_client_refuses_a_client_without_its_scale():
    algo = METHODS.get("feddyn")({"alpha_scaling": "data_size"}, num_classes=2, num_clients=1)
    with pytest.raises(FedstyleError, match="client 3 has no scale from the setup exchange"):
        algo.regularizer.client_alpha(types.SimpleNamespace(state={}, client_id=3), scaled=True)


def test_feddyn_loss_through_the_forward_pass_by_hand():
    # logits x W^T = (1, 2); CE of class 1 = log(e^1 + e^2) - 2 = log(1 + e^-1); -<grad_i, w> = -(0.5 - 1) = 0.5;
    # (alpha/2) ||w - a||^2 = 0.05 * ||(1, 0, 0, 1)||^2 = 0.1
    ce = math.log(1 + math.exp(-1))
    algo, model, ctx, x, y = _feddyn_by_hand({})
    assert float(algo.training_loss(ctx, model, x, y, {}).detach()) == pytest.approx(ce + 0.5 + 0.1, abs=1e-6)
    algo, model, ctx, x, y = _feddyn_by_hand({"alpha_scaling": "data_size"}, scale=2.0)  # alpha_i = 0.2
    assert float(algo.training_loss(ctx, model, x, y, {}).detach()) == pytest.approx(ce + 0.5 + 0.2, abs=1e-6)


def test_feddyn_clipped_step_by_hand():
    """clip_grad_norm: CE's gradient and the linear terms are clipped; alpha_i w joins after (the code's weight
    decay). SGD with lr 1, no momentum, no weight decay."""
    algo, model, ctx, x, y = _feddyn_by_hand({"clip_grad_norm": 0.2})
    p = 1 / (1 + math.exp(1))  # softmax of logits (1, 2): (p, 1 - p)
    ce_grad = [p, p, -p, -p]  # (softmax - onehot(1)) outer x, row by row
    linear_grad = [-0.5, 0.0, 0.0, 0.5 - 0.1 * 1.0]  # -grad_i - alpha a
    g = [c + l for c, l in zip(ce_grad, linear_grad)]
    factor = 0.2 / (math.sqrt(sum(v * v for v in g)) + 1e-6)  # torch's clip_grad_norm_ (total norm + 1e-6)
    w = [1.0, 0.0, 0.0, 2.0]
    expected = [wi - (gi * factor + 0.1 * wi) for wi, gi in zip(w, g)]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = algo.training_step(ctx, model, optimizer, x, y, {})
    assert model.weight.detach().flatten().tolist() == pytest.approx(expected, abs=1e-6)
    ce = math.log(1 + math.exp(-1))
    assert float(loss) == pytest.approx(ce + 0.5 + 0.1, abs=1e-6)  # the paper's loss, whatever the step


def _last_local(sim, algo):
    # the model object still holds the client's trained weights after its round
    return [dict(sim.model.named_parameters())[k].detach() for k in algo.param_keys]


def test_fedprox_zero_at_anchor_and_positive_away():
    algo, model = make_model("fedprox", {"mu": 1.0})
    x = torch.randn(4, 3, 16, 16)
    y = torch.tensor([0, 1, 2, 3])

    class Ctx:
        global_weights = snapshot(model)

    model.eval()
    base = F.cross_entropy(model(x), y)
    assert torch.allclose(algo.training_loss(Ctx, model, x, y, {}), base)
    with torch.no_grad():
        model.head.bias.add_(1.0)  # ||delta||^2 = 4 -> prox = 0.5 * 1.0 * 4
    shifted = F.cross_entropy(model(x), y)
    assert torch.allclose(algo.training_loss(Ctx, model, x, y, {}), shifted + 2.0)


# -- star simulator -----------------------------------------------------------------------
def test_star_round_counts_bytes_and_samples_clients():
    algo, model = make_model()
    sim = StarSimulator(algo, model, make_clients(3), FederationSettings(rounds=2, lr=0.05, batch_size=8,
                        clients_per_round=2), seed=0, device=torch.device("cpu"))
    result = sim.run_round(0)
    assert len(result.clients) == 2 and math.isfinite(result.train_loss)
    model_bytes = weights_nbytes(sim.server.weights)
    assert sim.traffic.model_down == 2 * model_bytes and sim.traffic.model_up == 2 * model_bytes
    assert sim.sample_clients(0) == result.clients  # derived from (seed, round): repeatable
    assert sim.traffic.payload_up == 0


def test_star_same_seed_same_weights_and_model_changes():
    def train():
        algo, model = make_model("mixstyle")
        sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=5, device=torch.device("cpu"))
        start = {k: v.clone() for k, v in sim.server.weights.items()}
        sim.run_round(0)
        sim.run_round(1)
        return start, sim.server.weights

    start, w1 = train()
    _, w2 = train()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert not torch.equal(start["head.weight"], w1["head.weight"])


def test_fedbn_keeps_batchnorm_local_and_does_not_send_it_down():
    algo, model = make_model("fedbn")
    bn = batchnorm_keys(model)
    assert bn and "backbone.layer1.1.weight" in bn or any(k.endswith("running_mean") for k in bn)
    sim = StarSimulator(algo, model, make_clients(2), SETTINGS, seed=0, device=torch.device("cpu"))
    sim.run_round(0)
    shared = [k for k in sim.server.weights if k not in bn]
    assert sim.traffic.model_down == 2 * weights_nbytes(sim.server.weights, shared)
    key = next(k for k in bn if k.endswith("running_mean"))
    a, b = sim.client_states[0]["local/" + key], sim.client_states[1]["local/" + key]
    assert not torch.allclose(a, b)  # each client kept its own statistics


@pytest.mark.parametrize("hp,by_size", [({}, False), ({"aggregation": "size"}, True)])
def test_fedbn_averages_its_shared_layers_with_1_over_k_unless_asked_by_size(hp, by_size):
    """FedBN's Algorithm 1, line 8: every layer that is not BatchNorm becomes (1/K) sum_k w_k, whatever the
    clients' sizes (8 and 24 images here); ``aggregation=size`` weights by sample count instead. One full round:
    the server's shared entries are that mean of what the clients uploaded, computed here by hand."""
    algo, model = make_model("fedbn", hp, n_clients=2)
    small, large = make_clients(2)
    small = ClientData(small.images[:8], small.labels[:8], small.domains[:8], TRANSFORM)
    sim = StarSimulator(algo, model, [small, large], SETTINGS, seed=0, device=torch.device("cpu"))
    uploads = []
    real = algo.aggregate
    algo.aggregate = lambda server, updates: uploads.extend(updates) or real(server, updates)
    sim.run_round(0)
    assert [u.num_samples for u in uploads] == [8, 24]
    w = [1 / 4, 3 / 4] if by_size else [1 / 2, 1 / 2]
    bn = batchnorm_keys(model)
    key = "head.weight"
    assert key not in bn
    a, b = (u.weights[key].double() for u in uploads)
    assert not torch.allclose(a, b)  # the two clients moved apart, so the weighting shows
    torch.testing.assert_close(sim.server.weights[key].double(), w[0] * a + w[1] * b, rtol=0, atol=1e-6)


def test_empty_client_is_refused():
    algo, model = make_model()
    clients = make_clients(2)
    clients.append(ClientData(clients[0].images[:0], clients[0].labels[:0], clients[0].domains[:0], TRANSFORM))
    with pytest.raises(ConfigError, match="client 2 has no training samples"):
        StarSimulator(algo, model, clients, SETTINGS, seed=0, device=torch.device("cpu"))


def test_nan_loss_gives_a_clear_error():
    algo, model = make_model()
    sim = StarSimulator(algo, model, make_clients(1), FederationSettings(rounds=1, lr=1e30, batch_size=8),
                        seed=0, device=torch.device("cpu"))
    with pytest.raises(NonFiniteLossError, match="lower --lr"):
        sim.run_round(0)


def test_lr_schedules():
    assert lr_at(0.1, "constant", 5, 10) == 0.1
    assert lr_at(0.1, "cosine", 0, 10) == pytest.approx(0.1)
    assert lr_at(0.1, "cosine", 5, 10) == pytest.approx(0.05)
    assert lr_at(0.1, "step", 8, 10) == pytest.approx(0.001)
    with pytest.raises(ConfigError):
        lr_at(0.1, "linear", 0, 10)


def test_client_data_drops_single_sample_tail_batch():
    data = make_clients(1, per_client=17)[0]
    assert data.num_batches(8) == 2  # 8 + 8, the 1-sample tail is dropped
    batches = list(data.batches(8, torch.Generator().manual_seed(0), torch.device("cpu"), steps=3))
    assert [len(b[1]) for b in batches] == [8, 8, 8]


# -- peer-to-peer -------------------------------------------------------------------------
def test_p2p_mixing_with_zero_lr_averages_neighbours():
    algo, model = make_model("dsgd")
    graph = nx.path_graph(3)
    sim = P2PSimulator(algo, model, make_clients(3), FederationSettings(rounds=1, lr=1e-12, batch_size=8,
                       local_steps=1, momentum=0.0, weight_decay=0.0), graph, seed=0, device=torch.device("cpu"))
    key = "head.bias"
    with torch.no_grad():
        sim.stacked[key] = torch.stack([torch.full((4,), v) for v in (0.0, 3.0, 6.0)])
    sim.run_round(0)
    # MH on a path 0-1-2: P = [[2/3,1/3,0],[1/3,1/3,1/3],[0,1/3,2/3]]
    expected = torch.tensor([1.0, 3.0, 5.0])
    assert torch.allclose(sim.stacked[key][:, 0], expected, atol=1e-5)
    assert sim.eval_weights()[key][0].item() == pytest.approx(3.0, abs=1e-5)  # the average is preserved


def test_p2p_steps_the_linear_head_at_head_lr_scale():
    """One DSGD step without momentum: theta = mix(theta) - lr * g; the head's step is head_lr_scale times
    the plain one (same mix, same gradient), every other weight the same as without the scale."""
    runs = {}
    for name, lr, scale in (("mixed", 0.0, 1.0), ("plain", 0.05, 1.0), ("scaled", 0.05, 10.0)):
        algo, model = make_model("dsgd")
        settings = FederationSettings(rounds=1, lr=lr, batch_size=8, local_steps=1, momentum=0.0, weight_decay=0.0,
                                      head_lr_scale=scale)
        sim = P2PSimulator(algo, model, make_clients(3), settings, nx.path_graph(3), seed=0, device=torch.device("cpu"))
        sim.run_round(0)
        runs[name] = sim.stacked
    for key, plain in runs["plain"].items():
        if key.startswith("head."):
            step = plain - runs["mixed"][key]
            assert step.abs().max() > 1e-4
            torch.testing.assert_close(runs["scaled"][key] - runs["mixed"][key], 10 * step, rtol=1e-4, atol=1e-6)
        else:
            assert torch.equal(runs["scaled"][key], plain), key


def test_p2p_round_trains_counts_bytes_and_reduces_consensus_gap():
    algo, model = make_model("dsgd", {"style": "mixstyle"})
    graph = nx.complete_graph(3)
    sim = P2PSimulator(algo, model, make_clients(3), FederationSettings(rounds=1, lr=0.05, batch_size=8),
                       graph, seed=0, device=torch.device("cpu"))
    result = sim.run_round(0)
    steps = sim.steps_per_round()
    shared = weights_nbytes({k: v[0] for k, v in sim.stacked.items()})
    assert sim.traffic.model_up == steps * 3 * 2 * shared  # each device sends to its 2 neighbours each step
    assert math.isfinite(result.train_loss)
    assert sim.consensus() >= 0
    assert len(sim.device_weights()) == 3


def test_p2p_refuses_adam_and_wrong_graph_size():
    algo, model = make_model("dsgd")
    with pytest.raises(ConfigError, match="nodes"):
        P2PSimulator(algo, model, make_clients(3), SETTINGS, nx.complete_graph(2), 0, torch.device("cpu"))
    adam = FederationSettings(rounds=1, lr=0.01, optimizer="adam")
    with pytest.raises(ConfigError, match="sgd"):
        P2PSimulator(algo, model, make_clients(2), adam, nx.complete_graph(2), 0, torch.device("cpu"))


def test_load_weights_in_place_keeps_parameter_objects():
    _, model = make_model()
    params = [id(p) for p in model.parameters()]
    weights = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    load_weights(model, weights)
    assert [id(p) for p in model.parameters()] == params
    assert all(float(v.abs().sum()) == 0 for v in model.state_dict().values())


# -- the exchange hooks a method can use ----------------------------------------------------
def test_setup_exchange_round_queries_and_payload_bytes():
    seed_everything(0)
    model = build_model("convnet", 4, 16)
    algo = ExchangeProbe({}, num_classes=4, num_clients=3)
    algo.configure_model(model)
    clients = make_clients(3, per_client=24)
    clients[2] = ClientData(clients[2].images[:16], clients[2].labels[:16], clients[2].domains[:16], TRANSFORM)
    sim = StarSimulator(algo, model, clients, SETTINGS, seed=0, device=torch.device("cpu"))
    info = sim.setup()
    assert "setup_seconds" in info and int(sim.server.state["bank_size"]) == 3
    expected_bank = torch.stack([c.labels.float().mean() for c in clients])
    for cid in range(3):
        assert torch.allclose(sim.client_states[cid]["bank"], expected_bank)
    setup_up = 3 * (4 + 8)  # one float32 + one int per client
    assert sim.traffic.payload_up == setup_up and sim.traffic.payload_down == 3 * 3 * 4
    sim.run_round(0)
    assert float(sim.client_states[0]["received"]) == 24.0  # client 1's size
    assert float(sim.client_states[1]["received"]) == 16.0  # client 2's size
    assert float(sim.client_states[2]["received"]) == 24.0  # client 0's size
    assert sim.traffic.payload_up == setup_up + 3 * 4 + 3 * 12  # queries + uploads
    assert sim.traffic.payload_down == 3 * 3 * 4 + 3 * 4
