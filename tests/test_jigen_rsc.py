"""JiGen and RSC (issue 25: centralized DG methods inside each client) against hand computations.

The learning check (tests/test_learning.py) and the method x topology matrices run both end to end.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.jigen import JiGen, jigsaw_permutations, shuffle_tiles, tile_index
from fedstyle.algorithms.rsc import muted_samples, top_mask
from fedstyle.federation.star import StarSimulator

from tiny import SETTINGS, make_clients, make_model

CPU = torch.device("cpu")


def _ctx(data) -> ClientContext:
    return ClientContext(client_id=0, data=data, state={}, train=SETTINGS.train_settings(0), round=0,
                         num_clients=1, device=CPU, seed=0)


def _batch(n=8, size=16, seed=0):
    x, y, _ = next(make_clients(1, per_client=n, size=size)[0].batches(n, torch.Generator().manual_seed(seed), CPU,
                                                                        steps=1))
    return x, y


def _hand_shuffle(img: torch.Tensor, perm, tile: int, offset: int) -> torch.Tensor:
    """Tile t (row-major) of the output is tile perm[t] of the input, tile by tile."""
    out = img.clone()
    for t in range(9):
        r, c = divmod(t, 3)
        sr, sc = divmod(int(perm[t]), 3)
        out[..., offset + r * tile: offset + (r + 1) * tile, offset + c * tile: offset + (c + 1) * tile] = \
            img[..., offset + sr * tile: offset + (sr + 1) * tile, offset + sc * tile: offset + (sc + 1) * tile]
    return out


# -- JiGen ------------------------------------------------------------------------------------------
def test_tile_shuffle_on_a_6x6_image_by_hand():
    # pixel value = 10 * tile + position inside the 2 x 2 tile
    img = torch.tensor([[10 * (3 * (r // 2) + c // 2) + 2 * (r % 2) + c % 2 for c in range(6)] for r in range(6)],
                       dtype=torch.float32)
    perm = [2, 0, 1, 8, 4, 3, 5, 7, 6]
    expected = torch.tensor([[20, 21, 0, 1, 10, 11], [22, 23, 2, 3, 12, 13],
                             [80, 81, 40, 41, 30, 31], [82, 83, 42, 43, 32, 33],
                             [50, 51, 70, 71, 60, 61], [52, 53, 72, 73, 62, 63]], dtype=torch.float32)
    perms = torch.tensor([list(range(9)), perm])
    x = torch.stack([img, img + 100, img + 200]).unsqueeze(0).repeat(2, 1, 1, 1)  # 2 samples, 3 channels
    out = shuffle_tiles(x, torch.tensor([1, 0]), tile_index(perms, 6, 6))
    assert torch.equal(out[0, 0], expected) and torch.equal(out[0, 2], expected + 200)
    assert torch.equal(out[1], x[1])  # class 0: the ordered image
    cl = x.contiguous(memory_format=torch.channels_last)  # the runtime's layout gives the same values
    assert torch.equal(shuffle_tiles(cl, torch.tensor([1, 0]), tile_index(perms, 6, 6)), out)


@pytest.mark.parametrize("size,tile,offset", [(8, 2, 1), (16, 5, 0), (32, 10, 1)])
def test_tile_shuffle_of_sizes_not_divisible_by_3_keeps_the_border(size, tile, offset):
    perms = jigsaw_permutations(30)
    x = torch.randn(3, 2, size, size)
    orders = torch.tensor([4, 17, 30])
    out = shuffle_tiles(x, orders, tile_index(perms, size, size))
    for i, o in enumerate(orders.tolist()):
        assert torch.equal(out[i], _hand_shuffle(x[i], perms[o], tile, offset))
    inside = torch.zeros(size, size, dtype=torch.bool)
    inside[offset: offset + 3 * tile, offset: offset + 3 * tile] = True
    assert torch.equal(out[..., ~inside], x[..., ~inside])  # the leftover rows and columns stay


def test_permutations_are_distinct_identity_first_greedy_and_seeded():
    perms = jigsaw_permutations(30, seed=0)
    assert perms.shape == (31, 9) and perms[0].tolist() == list(range(9))
    assert len({tuple(p) for p in perms.tolist()}) == 31
    assert all(sorted(p) == list(range(9)) for p in perms.tolist())
    assert torch.equal(jigsaw_permutations(30, seed=0), perms)  # deterministic
    assert not torch.equal(jigsaw_permutations(30, seed=1), perms)  # the seed breaks ties differently
    every = np.array(list(itertools.permutations(range(9))))
    chosen = perms.numpy()
    for k in range(1, 6):  # each pick maximises the summed Hamming distance to the picks before it
        total = sum((every != chosen[j]).sum(1) for j in range(k))
        assert sum(int((chosen[k] != chosen[j]).sum()) for j in range(k)) == total.max()
    assert all(int((p != perms[0]).sum()) == 9 for p in perms[1:3])


def test_orders_are_ordered_with_probability_beta():
    algo = JiGen({"bias_whole_image": 0.75}, num_classes=4, num_clients=1)
    torch.manual_seed(0)
    orders = algo.draw_orders(20000, CPU)
    assert float((orders == 0).float().mean()) == pytest.approx(0.75, abs=0.015)
    assert set(orders[orders > 0].tolist()) == set(range(1, 31))
    assert bool((JiGen({"bias_whole_image": 1.0}, num_classes=4, num_clients=1).draw_orders(50, CPU) == 0).all())
    assert bool((JiGen({"bias_whole_image": 0.0}, num_classes=4, num_clients=1).draw_orders(50, CPU) > 0).all())


class FixedOrders(JiGen):
    name = "jigen_fixed"
    ORDERS = torch.tensor([0, 3, 0, 30, 0, 0, 12, 0])

    def draw_orders(self, batch, device):
        return self.ORDERS[:batch].to(device)


@pytest.mark.parametrize("classify", ["ordered", "all"])
def test_jigen_loss_through_the_full_forward_pass_by_hand(classify):
    alpha = 0.5
    algo, model = make_model(algo_cls=FixedOrders, hp={"jig_weight": alpha, "classify": classify})
    model.train()
    x, y = _batch()
    ctx = _ctx(make_clients(1)[0])
    loss = algo.training_loss(ctx, model, x, y, {})
    orders = FixedOrders.ORDERS
    shuffled = torch.stack([_hand_shuffle(x[i], algo.perms[o], 5, 0) for i, o in enumerate(orders.tolist())])
    with torch.no_grad():
        z = torch.flatten(model.backbone.forward_maps(shuffled), 1)  # the ConvNet's neck: flatten
        logp = (z @ model.head.weight.T + model.head.bias).log_softmax(1)
        logq = (z @ model.jigsaw_head.weight.T + model.jigsaw_head.bias).log_softmax(1)
    rows = [i for i in range(8) if orders[i] == 0] if classify == "ordered" else list(range(8))
    ce = -sum(float(logp[i, y[i]]) for i in rows) / len(rows)
    jig = -sum(float(logq[i, orders[i]]) for i in range(8)) / 8
    assert float(loss.detach()) == pytest.approx(ce + alpha * jig, rel=1e-5)
    metrics = ctx.logged_metrics()
    assert metrics["jigen_ce"] == pytest.approx(ce, rel=1e-5) and metrics["jigen_ordered"] == pytest.approx(5 / 8)
    assert metrics["jigen_jigsaw"] == pytest.approx(jig, rel=1e-5)
    loss.backward()
    assert model.jigsaw_head.weight.grad is not None and model.backbone.layer1[0].weight.grad is not None


def test_jigsaw_head_is_part_of_the_model_and_averaged():
    algo, model = make_model("jigen")
    assert model.jigsaw_head.out_features == 31 and model.jigsaw_head.in_features == model.head.in_features
    assert "jigsaw_head.weight" in algo.param_keys
    x, _ = _batch()
    model.eval()
    assert torch.equal(model(x), model.head(model.features(x)))  # test time: the object classifier only
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    before = sim.server.weights["jigsaw_head.weight"].clone()
    result = sim.run_round(0)
    assert not torch.equal(sim.server.weights["jigsaw_head.weight"], before)
    assert {"jigen_ce", "jigen_jigsaw", "jigen_ordered"} <= set(result.metrics) and math.isfinite(result.train_loss)


# -- RSC --------------------------------------------------------------------------------------------
def test_top_mask_and_batch_rule_on_hand_vectors():
    scores = torch.tensor([[0.1, 0.9, -0.3, 0.5, 0.2, 0.0], [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    assert top_mask(scores, 1 / 3).tolist() == [[1, 0, 1, 0, 1, 1], [0, 0, 1, 1, 1, 1]]  # ceil(6/3) = 2
    assert top_mask(scores, 0.5).tolist() == [[1, 0, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1]]
    assert top_mask(scores[:, :1], 1 / 3).tolist() == [[1], [1]]  # one entry: nothing muted
    before = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    after = torch.tensor([0.1, 0.8, 0.6, 0.7, 0.45, 0.0])  # drops 0.8, 0, 0.1, -0.1, 0.05, 0.4
    assert muted_samples(before, after, 0.5).tolist() == [True, False, True, False, False, True]
    assert muted_samples(before, after, 1 / 3).tolist() == [True, False, False, False, False, True]
    assert muted_samples(before, after, 1.0).tolist() == [True, False, True, False, True, True]  # drops > 0 only


def _rsc(hp):
    algo, model = make_model("rsc", hp={"drop_b": 1.0, **hp}, size=32)
    torch.manual_seed(1)
    with torch.no_grad():  # a fixed, well spread head
        model.head.weight.copy_(torch.randn_like(model.head.weight))
    model.train()
    x, y = _batch(size=32)
    with torch.no_grad():
        maps = model.backbone.forward_maps(x)
    return algo, model, x, y, maps


def _hand_masks(model, maps, y, mode, score):
    """The flattening ConvNet's linear head: d logit_y / d maps = W[y] viewed as (C, h, w)."""
    b, c, h, w = maps.shape
    grad = model.head.weight[y].detach().view(b, c, h, w)
    masks = []
    for i in range(b):
        if mode == "channel":
            s = grad[i].mean((1, 2))
            m = torch.ones(c, 1, 1)
            m[s.argsort(descending=True)[:22]] = 0  # ceil(64/3)
        else:
            s = grad[i].mean(0) if score == "gradient" else (maps[i] * grad[i].mean((1, 2))[:, None, None]).sum(0)
            m = torch.ones(1, h * w)
            m[0, s.flatten().argsort(descending=True)[:2]] = 0  # ceil(4/3) of the 2 x 2 positions
            m = m.view(1, h, w)
        masks.append(m)
    return torch.stack(masks)


@pytest.mark.parametrize("mode,score", [("spatial", "gradient"), ("spatial", "gradcam"), ("channel", "gradcam")])
def test_rsc_mutes_the_top_gradient_features_computed_by_hand(mode, score):
    algo, model, x, y, maps = _rsc({"mode": mode, "spatial_score": score})
    mask, muted = algo.rsc_mask(model, maps, y, mode == "spatial")
    expected = _hand_masks(model, maps, y, mode, score)
    assert bool(muted.any())
    for i in range(len(y)):
        assert torch.equal(mask[i], expected[i] if muted[i] else torch.ones_like(expected[i]))


def test_rsc_batch_rule_by_hand():
    algo, model, x, y, maps = _rsc({"mode": "channel", "drop_b": 1 / 3})
    mask, muted = algo.rsc_mask(model, maps, y, spatial=False)
    full = _hand_masks(model, maps, y, "channel", "gradcam")
    with torch.no_grad():
        p0 = model(x).softmax(1)[range(8), y]
        p1 = model.head(torch.flatten(maps * full, 1)).softmax(1)[range(8), y]
    drop = (p0 - p1).tolist()
    top = sorted(range(8), key=lambda i: -drop[i])[:3]  # round(8/3) = 3 largest drops, if positive
    assert muted.tolist() == [i in top and drop[i] > 0 for i in range(8)]
    assert all(torch.equal(mask[i], torch.ones(64, 1, 1)) for i in range(8) if not muted[i])


@pytest.mark.parametrize("mode", ["spatial", "channel"])
def test_rsc_loss_through_the_full_forward_pass_by_hand(mode):
    algo, model, x, y, maps = _rsc({"mode": mode})
    ctx = _ctx(make_clients(1, size=32)[0])
    loss = algo.training_loss(ctx, model, x, y, {})
    _, muted = algo.rsc_mask(model, maps, y, mode == "spatial")
    full = _hand_masks(model, maps, y, mode, "gradcam")
    hand = torch.stack([maps[i] * full[i] if muted[i] else maps[i] for i in range(8)])
    with torch.no_grad():
        logp = (torch.flatten(hand, 1) @ model.head.weight.T + model.head.bias).log_softmax(1)
    assert float(loss.detach()) == pytest.approx(-float(logp[range(8), y].mean()), rel=1e-5)
    metrics = ctx.logged_metrics()
    assert metrics["rsc_muted"] == pytest.approx(float(muted.float().mean()))
    assert metrics["rsc_spatial"] == float(mode == "spatial")
    loss.backward()
    assert model.backbone.layer1[0].weight.grad is not None  # the muted maps train the backbone


def test_rsc_random_mode_picks_spatial_half_the_time_seeded():
    algo, _ = make_model("rsc")
    torch.manual_seed(0)
    picks = [algo.choose_spatial() for _ in range(400)]
    torch.manual_seed(0)
    assert [algo.choose_spatial() for _ in range(400)] == picks
    assert 0.4 < sum(picks) / 400 < 0.6


def test_rsc_spatial_gradient_is_flat_on_a_pooling_backbone_hence_gradcam_by_default():
    algo, model = make_model("rsc", backbone="resnet18", size=64)
    assert algo.hp["spatial_score"] == "gradcam"
    x, y = _batch(size=64)
    model.train()
    maps = model.backbone.forward_maps(x).detach().requires_grad_(True)  # (8, 512, 2, 2)
    (grad,) = torch.autograd.grad(model.head(model.neck(maps)).gather(1, y[:, None]).sum(), maps)
    paper = grad.mean(1).flatten(1)  # W[y].mean() / 4 at every position: no ranking
    assert torch.allclose(paper, (model.head.weight[y].mean(1) / 4)[:, None].expand(8, 4).detach(), atol=1e-7)
    gradcam = (maps * grad.mean((2, 3))[:, :, None, None]).sum(1).flatten(1)
    assert bool((gradcam.std(1) > 0).all())


@pytest.mark.parametrize("method,term", [("fpl", "fpl_ce"), ("jigen", "jigen_jigsaw"), ("rsc", "rsc_ce"),
                                         ("fedadg", "fedadg_adv_f")])
def test_issue25_baselines_train_with_a_style_op_firing_at_three_stages(method, term):
    """Every new baseline composes with the local style op: MixStyle at layer1-3 with p = 1 changes the
    round's loss against the same run without it, and the method's own loss terms are still logged."""
    from tiny import SETTINGS, make_clients, make_model

    small = {"noise_dim": 6, "gen_hidden": 5, "rp_size": 4, "disc_hidden": 3, "ce_warmup": 0.0} if method == "fedadg" else {}
    results = {}
    for style in ("none", "mixstyle"):
        hp = {**small, "style": style, "style_p": 1.0, "style_stages": "layer1,layer2,layer3"}
        algo, model = make_model(method, hp=hp)
        sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=torch.device("cpu"))
        results[style] = [sim.run_round(r) for r in range(2)]
    styled = results["mixstyle"]
    assert all(math.isfinite(r.train_loss) for r in styled)
    assert term in styled[-1].metrics
    assert styled[0].train_loss != pytest.approx(results["none"][0].train_loss, rel=1e-6)



def _weights_after_two_rounds(method: str, hp: dict) -> dict:
    algo, model = make_model(method, hp=hp)
    sim = StarSimulator(algo, model, make_clients(3), SETTINGS, seed=0, device=CPU)
    for round_index in range(2):
        sim.run_round(round_index)
    return sim.server.weights


def test_jigen_without_jigsaw_loss_or_shuffled_tiles_is_fedavg_bitwise():
    """alpha = 0 and beta = 1 (every image ordered, the jigsaw CE weighted 0) leave Eq. 1's object CE alone: the
    shared weights after two rounds equal FedAvg's bit for bit (the jigsaw head draws after the network, so the
    shared initial weights and the data order are FedAvg's). The method card says so; this keeps it true."""
    fedavg = _weights_after_two_rounds("fedavg", {})
    jigen = _weights_after_two_rounds("jigen", {"jig_weight": 0.0, "bias_whole_image": 1.0})
    assert set(jigen) - set(fedavg) == {"jigsaw_head.weight", "jigsaw_head.bias"}
    assert all(torch.equal(value, jigen[name]) for name, value in fedavg.items())
    # and the check can fail: the default beta (0.9) shuffles some images, which moves the weights
    shuffled = _weights_after_two_rounds("jigen", {"jig_weight": 0.0})
    assert not all(torch.equal(value, shuffled[name]) for name, value in fedavg.items())
