"""The algorithm API the style methods build on: neck and forward_stages, aligned views, the frozen
global model and per-call scratch, client metrics in metrics.jsonl, the runtime-set modes, the
peer-to-peer share path, one-way phase detection and byte counting per transport."""

from __future__ import annotations

import json

import networkx as nx
import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.fedavg import FedAvg
from fedstyle.data.client import ClientData
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.federation import client as client_module
from fedstyle.federation.p2p import P2PSimulator
from fedstyle.federation.star import StarSimulator
from fedstyle.models import build_model
from fedstyle.models.base import Neck, PooledNeck
from fedstyle.payload import weights_nbytes
from fedstyle.seeding import seed_everything

from tiny import SETTINGS, make_clients, make_model

CPU = torch.device("cpu")


# -- the neck and forward_stages -------------------------------------------------------------------
class TwoWayNeck(Neck):
    """Test neck: pooled features next to their max, so the head is 2C wide."""

    def out_dim(self, backbone):
        return 2 * 64

    def forward(self, maps, scale: float = 1.0):
        return torch.cat([maps.mean((2, 3)), maps.amax((2, 3)) * scale], 1)


def test_default_neck_adds_no_state_keys_and_matches_pooling():
    seed_everything(0)
    model = build_model("convnet", 4, 32).eval()
    assert isinstance(model.neck, PooledNeck)
    assert not any(k.startswith("neck.") for k in model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    maps = model.backbone.forward_maps(x)
    assert torch.equal(model(x), model.head(torch.flatten(maps, 1)))


def test_set_neck_rebuilds_the_head_and_its_weights_travel():
    seed_everything(0)
    model = build_model("convnet", 4, 32)
    model.set_neck(TwoWayNeck())
    assert model.head.in_features == 128 and model.head.out_features == 4
    assert model(torch.randn(3, 3, 32, 32)).shape == (3, 4)


def test_forward_stages_calls_the_hook_after_every_stage_and_may_grow_the_batch():
    seed_everything(0)
    model = build_model("convnet", 4, 32).eval()
    seen = []

    def hook(name, x):
        seen.append((name, x.shape[0]))
        return torch.cat([x, x[:1]]) if name == "layer1" else x  # oversampling-like growth after layer1

    maps = model.backbone.forward_stages(torch.randn(2, 3, 32, 32), hook)
    assert seen == [("layer1", 2), ("layer2", 3), ("layer3", 3), ("layer4", 3)]
    assert maps.shape[0] == 3
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model.backbone.forward_stages(x), model.backbone.forward_maps(x))


@pytest.mark.parametrize("backbone,size", [("convnet", 32), ("resnet18", 32)])
def test_class_activation_maps_add_up_to_the_logit(backbone, size):
    """Pooled heads: logit = mean over positions of the CAM + bias; ConvNet (flatten): the sum."""
    seed_everything(0)
    model = build_model(backbone, 5, size).eval()
    x = torch.randn(3, 3, size, size)
    maps = model.backbone.forward_maps(x)
    classes = torch.tensor([0, 3, 4])
    cam = model.class_activation_maps(maps, classes)
    logits = model.head(model.neck(maps))[torch.arange(3), classes]
    bias = model.head.bias[classes]
    reduce = cam.sum((1, 2)) if backbone == "convnet" else cam.mean((1, 2))
    assert torch.allclose(reduce + bias, logits, atol=1e-5)


def test_class_activation_maps_need_the_pooled_neck():
    model = build_model("convnet", 4, 32)
    model.set_neck(TwoWayNeck())
    with pytest.raises(ConfigError, match="pooled neck"):
        model.class_activation_maps(torch.randn(1, 64, 2, 2), torch.tensor([0]))


# -- aligned views ---------------------------------------------------------------------------------
def test_views_get_the_same_crop_and_flip_as_the_image():
    transform = BatchTransform((0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "crop_flip")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (10, 3, 16, 16), generator=g, dtype=torch.uint8)
    data = ClientData(images, torch.arange(10) % 2, torch.zeros(10, dtype=torch.long), transform,
                      views={"negative": 255 - images})
    x, y, d, views = next(data.batches(4, torch.Generator().manual_seed(1), CPU, steps=1, views=True))
    raw = x * 0.25 + 0.5  # back to [0, 1]
    raw_view = views["negative"] * 0.25 + 0.5
    assert torch.allclose(raw + raw_view, torch.ones_like(raw), atol=1e-6)  # pixel for pixel the same crop
    # without views the same generator gives the same image batch
    x_plain, _, _ = next(data.batches(4, torch.Generator().manual_seed(1), CPU, steps=1))
    assert torch.equal(x_plain, x)


def test_views_follow_replace_and_are_checked():
    images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    data = ClientData(images, torch.arange(4), torch.zeros(4, dtype=torch.long), make_clients(1)[0].transform)
    data.set_view("stylized", torch.arange(4, dtype=torch.uint8).view(4, 1, 1, 1).expand(4, 3, 8, 8).clone())
    data.replace(torch.zeros(6, 3, 8, 8, dtype=torch.uint8), torch.tensor([0, 0, 1, 1, 3, 3]))
    assert data.views["stylized"][:, 0, 0, 0].tolist() == [0, 0, 1, 1, 3, 3]
    with pytest.raises(ConfigError, match="rows"):
        data.set_view("bad", torch.zeros(5, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="no aligned views"):
        next(make_clients(1)[0].batches(4, torch.Generator(), CPU, steps=1, views=True))


# -- global model, scratch, modes, metrics ---------------------------------------------------------
class Recorder(FedAvg):
    """Records the model's mode in every hook, the frozen global model it sees, and logs metrics."""

    name = "recorder"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.modes: list[tuple[str, bool]] = []
        self.globals: list[torch.nn.Module] = []

    def setup_upload(self, ctx, model):
        self.modes.append(("setup_upload", model.training))
        return {"x": torch.ones(1)}

    def setup_download(self, ctx, model, broadcast):
        self.modes.append(("setup_download", model.training))

    def round_query(self, ctx, model):
        self.modes.append(("round_query", model.training))
        return {}

    def local_train(self, ctx, model, payload):
        assert not ctx.scratch  # a fresh scratch per call
        ctx.scratch["anchor"] = 1
        frozen = ctx.global_model()
        self.globals.append(frozen)
        assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
        for key, value in frozen.state_dict().items():
            assert torch.equal(value, ctx.global_weights[key])
        result = super().local_train(ctx, model, payload)
        for key, value in frozen.state_dict().items():  # training the client's model left the copy alone
            assert torch.equal(value, ctx.global_weights[key])
        return result

    def training_loss(self, ctx, model, x, y, payload):
        self.modes.append(("training_loss", model.training))
        ctx.log("client_term", float(ctx.client_id))
        ctx.log("client_term", float(ctx.client_id) + 2.0)
        with ctx.timed("forward"):
            logits = model(x)
        return F.cross_entropy(logits, y)


def test_runtime_sets_modes_offers_one_frozen_global_and_averages_metrics(monkeypatch):
    algo, model = make_model(algo_cls=Recorder)
    copies = []
    original = client_module.FrozenGlobal.__init__

    def counting_init(self, m):
        copies.append(1)
        original(self, m)

    monkeypatch.setattr(client_module.FrozenGlobal, "__init__", counting_init)
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    sim.setup()
    result = sim.run_round(0)
    sim.run_round(1)
    modes = dict(algo.modes)
    assert modes == {"setup_upload": False, "setup_download": False, "round_query": False, "training_loss": True}
    assert len(copies) == 1  # one frozen copy for the run, not one per client
    assert all(g is algo.globals[0] for g in algo.globals)
    # per-client mean of (cid, cid + 2) = cid + 1, then the mean over clients 0..2 = 2
    assert result.metrics["client_term"] == pytest.approx(2.0)
    assert result.metrics["forward_seconds"] > 0


def test_client_metrics_land_in_metrics_jsonl(tmp_path, monkeypatch):
    from fedstyle.algorithms import METHODS
    from fedstyle.experiments.runner import run_experiment

    METHODS.add("recorder", Recorder)
    try:
        # resolution 16: the tiny images' own size (a folder dataset's default since issue 53), said outright
        config = RunConfig(method="recorder", dataset="folder", data_root=str(_tiny_root(tmp_path)), targets=["grey"],
                           resolution=16, rounds=2, local_steps=2, batch_size=8, device="cpu", eval_every=1)
        run_experiment(config, tmp_path / "run", quiet=True)
    finally:
        METHODS._items.pop("recorder")  # keep the registry (and the method x topology matrix) as shipped
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [l for l in lines if "round" in l and "event" not in l]
    assert [l["round"] for l in evals] == [1, 2]
    for line in evals:
        assert line["train_metrics"]["client_term"] == pytest.approx(2.0)  # three clients 0, 1, 2
        assert "forward_seconds" in line["train_metrics"]


def _tiny_root(tmp_path):
    from PIL import Image

    root = tmp_path / "tiny"
    g = torch.Generator().manual_seed(0)
    for domain in ("a", "b", "c", "grey"):
        for cls in ("x", "y"):
            folder = root / domain / cls
            folder.mkdir(parents=True)
            for i in range(8):
                pixels = torch.randint(0, 256, (16, 16, 3), generator=g, dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


# -- phases decided one way; bytes as they travel --------------------------------------------------
def test_phase_detection_is_one_rule():
    class Querying(FedAvg):
        def round_query(self, ctx, model):
            return {}

    class Switchable(Querying):
        def uses_phase(self, phase):
            return False if phase == "query" else super().uses_phase(phase)

    assert not FedAvg({}, num_classes=2, num_clients=1).uses_phase("query")
    assert Querying({}, num_classes=2, num_clients=1).uses_phase("query")
    assert not Switchable({}, num_classes=2, num_clients=1).uses_phase("query")


def test_query_phase_sends_and_counts_the_weights_a_second_time():
    class Querying(FedAvg):
        def round_query(self, ctx, model):
            return {"n": torch.ones(2)}

    plain_algo, plain_model = make_model()
    plain = StarSimulator(plain_algo, plain_model, make_clients(3), SETTINGS, seed=0, device=CPU)
    plain.run_round(0)
    algo, model = make_model(algo_cls=Querying)
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    sim.run_round(0)
    one_model = weights_nbytes(sim.download())
    assert plain.traffic.model_down == 3 * one_model
    assert sim.traffic.model_down == 6 * one_model  # the query and the training message both carry them
    assert sim.traffic.payload_up == plain.traffic.payload_up + 3 * 8


def test_setup_exchange_sends_no_weights():
    algo, model = make_model(algo_cls=Recorder)
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    sim.setup()
    assert sim.traffic.model_down == 0 and sim.traffic.payload_up == 3 * 4


# -- peer-to-peer share path -----------------------------------------------------------------------
class ShareProbe(Algorithm):
    """Shares a random number and its own id each iteration; records what training_loss receives."""

    name = "share_probe"
    topologies = ("ring",)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.received: list[tuple[int, dict]] = []
        self.draws: list[float] = []
        self.share_modes: list[bool] = []

    def p2p_share(self, ctx, model, x):
        self.share_modes.append(model.training)
        draw = float(torch.rand(()))
        self.draws.append(draw)
        return {"id": ctx.client_id, "draw": torch.tensor([draw])}

    def training_loss(self, ctx, model, x, y, payload):
        self.received.append((ctx.client_id, {j: int(p["id"]) for j, p in payload.items()}))
        return F.cross_entropy(model(x), y)


def test_p2p_share_reaches_only_neighbours_as_the_payload_and_draws_differ_per_step():
    seed_everything(0)
    model = build_model("convnet", 4, 16)
    algo = ShareProbe({}, num_classes=4, num_clients=5)
    algo.configure_model(model)
    graph = nx.cycle_graph(5)
    settings = SETTINGS.__class__(rounds=1, lr=0.01, batch_size=8, local_steps=3)
    sim = P2PSimulator(algo, model, make_clients(5), settings, graph, seed=0, device=CPU)
    sim.run_round(0)
    assert not any(algo.share_modes)  # shares are computed in eval mode
    for device, payload in algo.received:
        assert sorted(payload) == sorted(graph.neighbors(device))
        assert all(payload[j] == j for j in payload)  # each entry is that neighbour's own share
    per_device = {}
    for step in range(3):
        for device in range(5):
            per_device.setdefault(device, []).append(algo.draws[step * 5 + device])
    assert all(len(set(draws)) == 3 for draws in per_device.values())  # a fresh seed per step
    share_bytes = (8 + 4) * 2 * 3 * 5  # id + one float32, to 2 neighbours, 3 steps, 5 devices
    assert sim.traffic.payload_up == share_bytes
