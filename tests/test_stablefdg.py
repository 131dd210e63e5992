"""StableFDG (issue 10): the equations against hand-computed values, the fallbacks, the flags, bad
input, and the runtimes (resume, Flower's apps)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms import stablefdg_pipeline
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.stablefdg import StableFDG
from fedstyle.data.client import ClientData
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation.star import StarSimulator
from fedstyle.models.attention import AttentionNeck, same_class_partners
from fedstyle.models.base import Backbone, Classifier, PooledNeck
from fedstyle.style import MixStyle, StyleSummary, channel_stats, sharing
from fedstyle.style.fused import explore_and_mix
from fedstyle.style.oversample import balanced_extra_counts, oversample_features, oversample_indices
from fedstyle.style.selection import kmeans_pp_seeds, select_by_kmeans, selective_shift
from fedstyle.style.sharing import derangement

from tiny import SETTINGS, TRANSFORM, make_clients, make_model, interrupt_and_resume
from flower_grid import run_under_flower  # noqa: E402  (Flower's apps, messages over the wire, in process)

CPU = torch.device("cpu")


def context(data, round_index=1, phase="train", seed=0, cid=0):
    return ClientContext(client_id=cid, data=data, state={}, train=SETTINGS.train_settings(round_index),
                         round=round_index, num_clients=4, device=CPU, seed=seed, phase=phase)


def algo(hp=None, classes=4):
    return StableFDG(hp or {}, num_classes=classes, num_clients=4)


# -- style sharing: Phi_n (Eq. 2-3) ---------------------------------------------------------------
class IdentityStage(Backbone):
    """One stage that passes the normalised image through, so Phi is computable by hand."""

    stage_names = ("layer1",)
    feature_dim = 3

    def run_stage(self, name, x):
        return x


def test_phi_of_a_tiny_client_by_hand(monkeypatch):
    # 2 images, 3 channels, 1 x 2 pixels; the transform maps 0 -> -1 and 255 -> 1
    images = torch.tensor([[[[0, 255]], [[0, 0]], [[255, 0]]],
                           [[[255, 255]], [[0, 255]], [[255, 0]]]], dtype=torch.uint8)
    data = ClientData(images, torch.tensor([0, 1]), torch.zeros(2, dtype=torch.long), TRANSFORM)
    model = Classifier(IdentityStage(), 2).eval()
    method = algo({"attention": False})
    one = math.sqrt(1 + 1e-6)  # sigma of (-1, 1); sigma of a constant is sqrt(eps) = 1e-3
    # per-sample mu: [[0, -1, 0], [1, 0, 0]]; sigma: [[one, 1e-3, one], [1e-3, one, one]]
    expected = torch.tensor([[0.5, -0.5, 0.0],
                             [(one + 1e-3) / 2] * 2 + [one],
                             [0.25, 0.25, 0.0],
                             [((one - 1e-3) / 2) ** 2] * 2 + [0.0]])
    phi = method.round_query(context(data, phase="query"), model)["style"]
    assert phi.shape == (4, 3)
    assert torch.allclose(phi, expected, atol=1e-6)
    monkeypatch.setattr(sharing, "QUERY_BATCH", 1)  # the whole dataset, one image per pass: same Phi
    assert torch.allclose(method.round_query(context(data, phase="query"), model)["style"], expected, atol=1e-6)
    # style_images=1 (eval statistics): Phi of one of the two images, the same one for the same seed
    hp = {"attention": False, "style_images": 1, "style_stats": "eval"}
    one = algo(hp).round_query(context(data, phase="query"), model)["style"]
    assert torch.allclose(one[2:], torch.zeros(2, 3)) and one[0, 0] in (0.0, 1.0)
    again = algo(hp).round_query(context(data, phase="query"), model)["style"]
    assert torch.equal(one, again)
    # reference_code: per-sample variances over the 2 pixels with 1/(HW - 1), those over the 2 samples with
    # 1/(N - 1), and 1e-6 on the spread (trainer.py:697-715)
    ref = algo({"attention": False, "reference_code": True}).round_query(context(data, phase="query"), model)["style"]
    two = math.sqrt(2 + 1e-6)  # unbiased sigma of (-1, 1)
    expected = torch.tensor([[0.5, -0.5, 0.0],
                             [(two + 1e-3) / 2] * 2 + [two],
                             [0.5 + 1e-6, 0.5 + 1e-6, 1e-6],
                             [2 * ((two - 1e-3) / 2) ** 2 + 1e-6] * 2 + [1e-6]])
    assert torch.allclose(ref, expected, atol=1e-6)


def test_phi_from_training_batches_uses_batch_statistics_and_leaves_the_running_ones():
    """style_stats=train (default): Phi of the features a training forward computes (BatchNorm with each
    batch's statistics), on augmented batches of the training batch size; the model's state is untouched."""
    method, model = make_model("stablefdg", {"attention": False})
    data = make_clients(1, per_client=24)[0]
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = context(data, phase="query")
    phi = method.round_query(ctx, model)["style"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # by hand: the same batches (the context's generator), BatchNorm in training mode on a copy
    import copy
    twin = copy.deepcopy(model).train()
    mus, sigmas = [], []
    with torch.no_grad():
        for x, _, _ in data.batches(SETTINGS.batch_size, torch.Generator().manual_seed(0), CPU,
                                    data.num_batches(SETTINGS.batch_size)):
            mu, sigma = channel_stats(twin.backbone.forward_until(x, "layer1"))
            mus.append(mu.flatten(1))
            sigmas.append(sigma.flatten(1))
    mu, sigma = torch.cat(mus), torch.cat(sigmas)
    expected = torch.stack([mu.mean(0), sigma.mean(0), mu.var(0, correction=0), sigma.var(0, correction=0)])
    assert torch.allclose(phi, expected, atol=1e-5)
    evaluated = algo({"attention": False, "style_stats": "eval"}).round_query(context(data, phase="query"), model)
    assert not torch.allclose(evaluated["style"], phi, atol=1e-3)  # running statistics give another Phi
    assert StableFDG.resolve({"dp_clip": 1.0})["style_stats"] == "eval"  # the defence's bound needs it
    with pytest.raises(ConfigError, match="style_stats=eval"):
        StableFDG.resolve({"dp_clip": 1.0, "style_stats": "train"})


def test_phi_is_computed_on_the_downloaded_weights_and_eval_mode_with_eval_statistics():
    method, model = make_model("stablefdg", {"style_stats": "eval"})
    clients = make_clients(3)
    sim = StarSimulator(method, model, clients, SETTINGS, seed=0, device=CPU)
    seen = []
    original = method.round_query

    def spy(ctx, m):
        seen.append((m.training, {k: v.clone() for k, v in m.state_dict().items()}))
        return original(ctx, m)

    method.round_query = spy
    sim.run_round(0)
    assert seen and all(not training for training, _ in seen)
    for _, state in seen:
        assert all(torch.equal(state[k], v) for k, v in sim.initial_weights.items())


# -- the derangement ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", range(1, 51))
def test_derangement_never_maps_a_client_to_itself_and_is_seeded(n):
    for seed in range(3):
        perm = derangement(n, torch.Generator().manual_seed(seed))
        assert sorted(perm) == list(range(n))
        assert n == 1 or all(p != i for i, p in enumerate(perm))
        assert perm == derangement(n, torch.Generator().manual_seed(seed))
    fallback = derangement(n, torch.Generator().manual_seed(0), tries=0)  # Sattolo's cycle
    assert sorted(fallback) == list(range(n)) and (n == 1 or all(p != i for i, p in enumerate(fallback)))


def test_derangement_differs_between_seeds_and_covers_two_cycles():
    perms = {tuple(derangement(4, torch.Generator().manual_seed(s))) for s in range(200)}
    assert len(perms) == 9  # all 9 derangements of 4 items (Sattolo alone gives only the 6 4-cycles)


def test_greedy_pairing_is_the_public_codes_loop_and_can_pair_a_client_with_itself():
    """trainer.py:599-611: each participant in turn takes a free style not its own; the last one, left with
    its own, gets it on the next pass (about 25 % of assignments at n = 3, 7 % at n = 10)."""
    for n in (2, 3, 5, 10):
        selves = 0
        for seed in range(400):
            perm = sharing.greedy_pairing(n, torch.Generator().manual_seed(seed))
            assert sorted(perm) == list(range(n))
            wrong = [i for i, p in enumerate(perm) if p == i]
            assert wrong in ([], [n - 1])  # only the last participant can get its own style
            selves += bool(wrong)
        if n == 2:
            assert selves == 0  # the first takes the second's; the second is left with the first's
        else:
            assert 0 < selves < 400
    server = ServerContext(weights={}, state={}, round=3, num_clients=10, seed=7)
    queries = {c: {"style": torch.full((4, 2), float(c))} for c in range(10)}
    got = {tuple(sorted((c, int(p["style"][0, 0])) for c, p in algo({"reference_code": True}).round_payloads(
        ServerContext(weights={}, state={}, round=r, num_clients=10, seed=7), list(range(10)), queries).items()))
        for r in range(200)}
    assert any(any(c == s for c, s in pairs) for pairs in got)  # a self-pairing happens under reference_code
    assert server.round == 3


def test_round_payloads_share_one_to_one_and_one_participant_gets_nothing():
    method = algo()
    server = ServerContext(weights={}, state={}, round=3, num_clients=10, seed=7)
    queries = {c: {"style": torch.full((4, 2), float(c))} for c in (2, 5, 8, 9)}
    out = method.round_payloads(server, [2, 5, 8, 9], queries)
    senders = {c: int(p["style"][0, 0]) for c, p in out.items()}
    assert set(senders) == {2, 5, 8, 9} and sorted(senders.values()) == [2, 5, 8, 9]
    assert all(c != s for c, s in senders.items())
    again = method.round_payloads(server, [2, 5, 8, 9], queries)
    assert all(torch.equal(again[c]["style"], out[c]["style"]) for c in out)
    assert method.round_payloads(server, [5], {5: queries[5]}) == {}
    assert method.round_payloads(server, [5, 8], {5: queries[5], 8: {}}) == {}  # 8 answered nothing


# -- selective style shifting ---------------------------------------------------------------------
def test_kmeans_pp_picks_k_distinct_centres_even_among_duplicates():
    torch.manual_seed(0)
    points = torch.randn(12, 4)
    for k in range(13):
        assert len(set(kmeans_pp_seeds(points, k).tolist())) == k
    same = torch.zeros(8, 3)  # every D is 0: the next centre is uniform among the rest
    assert sorted(kmeans_pp_seeds(same, 8).tolist()) == list(range(8))
    with pytest.raises(ConfigError, match="k-means"):
        kmeans_pp_seeds(points, 13)


def test_kmeans_pp_seeds_one_centre_per_separated_cluster():
    points = torch.tensor([[0.0], [0.1], [100.0], [100.1], [200.0], [200.1]])
    for seed in range(20):
        torch.manual_seed(seed)
        seeds = kmeans_pp_seeds(points, 3)
        assert sorted(int(i) // 2 for i in seeds) == [0, 1, 2]


def test_selection_keeps_each_clusters_member_nearest_its_centre():
    # clusters {0, 1, 2} (mean 1) and {100}: the members at 1 and 100 are kept
    points = torch.tensor([[0.0], [1.0], [2.0], [100.0]])
    for seed in range(10):
        torch.manual_seed(seed)
        keep, centres = select_by_kmeans(points, 2)
        assert keep.tolist() == [False, True, False, True]
        assert sorted(centres.flatten().tolist()) == [1.0, 100.0]
    # pairs are equidistant from their mean: the lower index of each pair is kept
    torch.manual_seed(0)
    keep, _ = select_by_kmeans(torch.tensor([[0.0], [1.0], [100.0], [101.0], [200.0], [201.0]]), 3)
    assert keep.tolist() == [True, False, True, False, True, False]
    # duplicates leave clusters empty: still exactly k kept
    keep, _ = select_by_kmeans(torch.zeros(6, 2), 3)
    assert int(keep.sum()) == 3


def zero_spread(mu, sigma):
    c = len(mu)
    return StyleSummary(torch.tensor(mu), torch.tensor(sigma), torch.zeros(c), torch.zeros(c))


def test_shift_with_zero_spread_carries_the_received_statistics_exactly():
    torch.manual_seed(0)
    x = torch.randn(8, 2, 4, 4) * 3 + 1
    received = zero_spread([5.0, -2.0], [0.5, 2.0])
    out = selective_shift(x, received)
    unchanged = (out == x).flatten(1).all(1)
    assert int(unchanged.sum()) == 4  # floor(B/2) keep their style
    mu, sigma = channel_stats(out[~unchanged])
    assert torch.allclose(mu.flatten(1), torch.tensor([[5.0, -2.0]]).expand(4, 2), atol=1e-5)
    assert torch.allclose(sigma.flatten(1), torch.tensor([[0.5, 2.0]]).expand(4, 2), atol=1e-4)
    # odd batch: floor(5/2) = 2 kept, 3 shifted; batch of one: shifted
    assert int((selective_shift(x[:5], received) == x[:5]).flatten(1).all(1).sum()) == 2
    one = selective_shift(x[:1], received)
    assert torch.allclose(channel_stats(one)[0].flatten(), torch.tensor([5.0, -2.0]), atol=1e-5)


def test_shift_noise_follows_the_received_spread():
    torch.manual_seed(0)
    x = torch.randn(4000, 1, 3, 3)
    received = StyleSummary(torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([0.25]), torch.tensor([0.01]))
    out = selective_shift(x, received, "random")
    moved = ~(out == x).flatten(1).all(1)
    mu, sigma = channel_stats(out[moved])
    assert mu.mean().item() == pytest.approx(2.0, abs=0.03) and mu.std().item() == pytest.approx(0.5, abs=0.03)
    assert sigma.mean().item() == pytest.approx(1.0, abs=0.01) and sigma.std().item() == pytest.approx(0.1, abs=0.01)


def test_reference_shift_gives_the_first_half_the_centres_and_the_rest_the_received_style():
    torch.manual_seed(0)
    x = torch.randn(6, 2, 4, 4) + torch.arange(6.0).view(6, 1, 1, 1)
    out = selective_shift(x, zero_spread([5.0, -2.0], [0.5, 2.0]), "centres")  # reference_code=true
    mu, sigma = channel_stats(out)
    assert torch.allclose(mu[3:].flatten(1), torch.tensor([[5.0, -2.0]]).expand(3, 2), atol=1e-5)
    # the first three carry cluster means of the batch's own styles: inside the range of the batch
    src_mu, _ = channel_stats(x)
    assert (mu[:3] >= src_mu.min(0).values - 1e-5).all() and (mu[:3] <= src_mu.max(0).values + 1e-5).all()


# -- oversampling and exploration -----------------------------------------------------------------
def test_oversampling_is_class_balanced_minority_first():
    y = torch.tensor([0, 0, 0, 1, 1, 2])  # Appendix G: counts 3, 2, 1
    assert balanced_extra_counts(y, 1, 4).tolist() == [0, 0, 1, 0]
    assert balanced_extra_counts(y, 3, 4).tolist() == [0, 1, 2, 0]
    assert balanced_extra_counts(y, 6, 4).tolist() == [1, 2, 3, 0]  # size B: 4, 4, 4
    assert y[oversample_indices(y, 3, 4)].tolist() == [2, 2, 1]  # minority class first
    assert y[oversample_indices(y, 6, 4)].tolist() == [2, 2, 2, 1, 1, 0]
    counts = balanced_extra_counts(y, 2, 4) + torch.bincount(y, minlength=4)
    assert sorted(counts[:3].tolist()) == [2, 3, 3]  # as balanced as possible; absent class 3 untouched
    single = torch.zeros(5, dtype=torch.long)
    assert balanced_extra_counts(single, 5, 4).tolist() == [5, 0, 0, 0]
    assert oversample_indices(single, 5, 4).tolist() != [] and oversample_indices(single, 5, 4).lt(5).all()
    assert len(oversample_indices(y, 4, 4, balanced=False)) == 4


def test_oversampled_features_carry_their_labels():
    torch.manual_seed(0)
    x = torch.randn(6, 2, 3, 3)
    y = torch.tensor([0, 0, 0, 1, 1, 2])
    big, labels = oversample_features(x, y, 6, 4)
    assert big.shape[0] == 12 and torch.equal(big[:6], x)
    assert torch.bincount(labels).tolist() == [4, 4, 4]
    for row, label in zip(big[6:], labels[6:]):
        source = [i for i in range(6) if torch.equal(x[i], row)]
        assert source and all(y[i] == label for i in source)
    assert oversample_features(x, y, 3, 4)[0].shape[0] == 9
    nhwc = oversample_features(x.contiguous(memory_format=torch.channels_last), y, 6, 4)[0]
    assert nhwc.is_contiguous(memory_format=torch.channels_last)  # the layout the convolutions run fastest in


def test_exploration_alpha_zero_is_identity_and_alpha_three_moves_three_times():
    torch.manual_seed(0)
    x = torch.randn(6, 3, 5, 5) * torch.rand(6, 3, 1, 1).add(0.5) + torch.randn(6, 3, 1, 1)
    same = explore_and_mix(x, 3, 0.0)
    assert torch.equal(same[:3], x[:3]) and torch.allclose(same, x, atol=1e-5)
    mu, sigma = channel_stats(x)
    center_mu, center_sigma = mu.mean(0, keepdim=True), sigma.mean(0, keepdim=True)  # over [s, s~]
    out = explore_and_mix(x, 3, 3.0)
    new_mu, new_sigma = channel_stats(out)
    assert torch.equal(out[:3], x[:3])
    assert torch.allclose(new_mu[3:] - mu[3:], 3 * (mu[3:] - center_mu), atol=1e-4)
    expected_sigma = sigma[3:] + 3 * (sigma[3:] - center_sigma)
    assert (expected_sigma < 0).any()  # Eq. 5 crosses zero here: kept, a mirrored map of std |sigma_new|
    assert torch.allclose(new_sigma[3:], expected_sigma.abs(), atol=1e-3)
    flat = channel_stats(explore_and_mix(x, 3, 3.0, min_sigma=1e-6))[1]  # negative_sigma=clamp
    assert torch.allclose(flat[3:], expected_sigma.clamp_min(1e-6), atol=2e-3)
    # the reference code extrapolates from the original batch's mean
    ref = explore_and_mix(x, 3, 3.0, center_count=3)
    ref_mu = channel_stats(ref)[0]
    assert torch.allclose(ref_mu[3:] - mu[3:], 3 * (mu[3:] - mu[:3].mean(0, keepdim=True)), atol=1e-4)


def test_exploration_and_mixstyle_as_one_adain_equal_the_two_in_sequence():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5, 5) * torch.rand(8, 3, 1, 1).add(0.5) + torch.randn(8, 3, 1, 1)
    mix = MixStyle(p=1.0, alpha=0.1)
    torch.manual_seed(1)
    fused = explore_and_mix(x, 4, 3.0, mix_weights=mix.sample_mix_weights)
    torch.manual_seed(1)
    sequential = mix(explore_and_mix(x, 4, 3.0))  # MixStyle draws the same lambda and permutation
    assert (channel_stats(x)[1][4:] < 0.75 * channel_stats(x)[1].mean(0)).any()  # negative sigmas included
    # equal up to the 1e-6 inside sequential MixStyle's sigma, which matters most where |sigma_e| is small
    assert torch.allclose(fused, sequential, rtol=1e-3, atol=1e-3)
    torch.manual_seed(1)
    assert not torch.allclose(fused, mix(x), atol=1e-2)  # the exploration did happen
    torch.manual_seed(1)
    mix_only = explore_and_mix(x, None, 3.0, mix_weights=mix.sample_mix_weights)  # nothing oversampled: MixStyle
    torch.manual_seed(1)
    assert torch.allclose(mix_only, mix(x), atol=1e-5)


class AffineStages(Backbone):
    """Four stages that are per-channel affine maps y = a x + b (layer1: identity), so every stage's
    per-sample statistics follow by hand: mu -> a mu + b, sigma -> a sigma. Records each stage's input."""

    stage_names = ("layer1", "layer2", "layer3", "layer4")
    feature_dim = 3
    SCALE = {"layer1": (1.0, 1.0, 1.0), "layer2": (2.0, 0.5, 1.5), "layer3": (0.5, 3.0, 1.0), "layer4": (1.0, 1.0, 1.0)}
    SHIFT = {"layer1": (0.0, 0.0, 0.0), "layer2": (1.0, -1.0, 0.0), "layer3": (-2.0, 0.5, 3.0), "layer4": (0.0, 0.0, 0.0)}

    def __init__(self):
        super().__init__()
        self.inputs = {}

    def run_stage(self, name, x):
        self.inputs[name] = x.detach().clone()
        return x * torch.tensor(self.SCALE[name]).view(1, 3, 1, 1) + torch.tensor(self.SHIFT[name]).view(1, 3, 1, 1)


def _stats_by_hand(x):
    """(mu, sigma) per sample and channel, (B, C): sigma = sqrt(population variance + 1e-6)."""
    mu = x.mean((2, 3))
    return mu, ((x - mu[:, :, None, None]) ** 2).mean((2, 3)).add(1e-6).sqrt()


def _forward_with_extras(hp, x, y):
    """One training_loss through AffineStages; returns ([s, s~] as oversampled at layer1, the
    layer4 input, the backbone) — the oversampled batch is recorded before any exploration."""
    method = StableFDG(hp, num_classes=4, num_clients=4)
    backbone = AffineStages()
    model = Classifier(backbone, 4)
    method.configure_model(model)
    model.train()
    enlarged = []
    oversample = stablefdg_pipeline.oversample_features
    ctx = context(make_clients(1)[0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stablefdg_pipeline, "oversample_features",
                      lambda *args, **kw: enlarged.append(oversample(*args, **kw)) or enlarged[-1])
        loss = method.training_loss(ctx, model, x, y, {})
    assert torch.isfinite(loss) and ctx.logged_metrics()["explore_fired"] == 1.0
    assert len(enlarged) == 1
    return enlarged[0][0], backbone.inputs["layer4"], backbone


@pytest.mark.parametrize("stages", ["layer1,layer2,layer3", "layer2,layer3"])
def test_a_full_forward_explores_once_by_one_plus_alpha_not_compounding(stages):
    # Eq. 4-5 applied once to s~: after a whole forward with every stage firing (explore_p = 1,
    # MixStyle off), an extra's style at layer4's input is (1 + alpha) times its distance from the
    # batch centre at the FIRST firing stage, carried through the later (affine) stages — not (1 + alpha)^k
    torch.manual_seed(0)
    x = torch.randn(6, 3, 4, 4) * torch.rand(6, 3, 1, 1).add(0.5) + torch.randn(6, 3, 1, 1)
    y = torch.tensor([0, 0, 0, 1, 1, 2])
    alpha, b = 3.0, 6
    hp = {"share": False, "mixstyle": False, "explore_p": 1.0, "alpha": alpha, "explore_stages": stages}
    s_hat, last, _ = _forward_with_extras(hp, x, y)
    assert s_hat.shape[0] == 2 * b
    mu, sigma = _stats_by_hand(s_hat)                       # at layer1's output, before exploration
    scale = {k: torch.tensor(v) for k, v in AffineStages.SCALE.items()}
    shift = {k: torch.tensor(v) for k, v in AffineStages.SHIFT.items()}
    if stages.startswith("layer2"):                         # the first firing stage is layer2: its statistics
        mu, sigma = scale["layer2"] * mu + shift["layer2"], scale["layer2"] * sigma
        after = scale["layer3"], shift["layer3"]
    else:                                                   # layer2 then layer3 follow the exploration
        after = scale["layer2"] * scale["layer3"], scale["layer3"] * shift["layer2"] + shift["layer3"]
    centre_mu, centre_sigma = mu.mean(0), sigma.mean(0)     # over the enlarged batch [s, s~]
    mu_last, sigma_last = _stats_by_hand(last)
    a, c = after
    # originals: untouched, only carried by the affine stages
    assert torch.allclose(mu_last[:b], a * mu[:b] + c, atol=1e-4)
    assert torch.allclose(sigma_last[:b], a * sigma[:b], atol=1e-4)
    # extras: distance from the first firing stage's centre, mapped back through the later stages, is (1 + alpha) x
    assert torch.allclose((mu_last[b:] - c) / a - centre_mu, (1 + alpha) * (mu[b:] - centre_mu), atol=1e-4)
    explored_sigma = centre_sigma + (1 + alpha) * (sigma[b:] - centre_sigma)
    assert (explored_sigma < 0).any()                        # Eq. 5 crosses zero: the mirrored map has std |sigma_new|
    assert torch.allclose(sigma_last[b:] / a, explored_sigma.abs(), atol=1e-3)

    # the compounding reading, kept as an option: the same forward explores again at each later stage
    s_hat2, last2, _ = _forward_with_extras(dict(hp, explore_repeat="every_firing_stage"), x, y)
    m, s = _stats_by_hand(s_hat2)                             # layer1's output
    for stage in ("layer1", "layer2", "layer3"):
        if stage != "layer1":
            m, s = scale[stage] * m + shift[stage], scale[stage] * s
        if stage in stages.split(","):                        # Eq. 4-5 again around this stage's centre
            cm, cs = m.mean(0), s.mean(0)
            m = torch.cat([m[:b], m[b:] + alpha * (m[b:] - cm)])
            s = torch.cat([s[:b], (s[b:] + alpha * (s[b:] - cs)).abs()])
    mu_last2, sigma_last2 = _stats_by_hand(last2)
    assert torch.allclose(mu_last2, m, rtol=1e-3, atol=1e-3) and torch.allclose(sigma_last2, s, rtol=1e-3, atol=1e-3)
    # ... which moves the extras farther than once does, by about (1 + alpha)^(k - 1) more
    spread_once = (mu_last[b:] - mu_last.mean(0)).abs().mean()
    spread_every = (mu_last2[b:] - mu_last2.mean(0)).abs().mean()
    k = len(stages.split(","))                                # firings; the last one's extras land near (1 + alpha)^k
    assert spread_every > 0.5 * (1 + alpha) ** (k - 1) * spread_once


def test_explore_repeat_is_refused_with_the_reference_code_and_labelled():
    with pytest.raises(ConfigError, match="reference_code=true explores once"):
        StableFDG.resolve({"reference_code": True, "explore_repeat": "every_firing_stage"})
    assert StableFDG.resolve({})["explore_repeat"] == "once"
    assert StableFDG.display_name(StableFDG.resolve({"explore_repeat": "every_firing_stage"})) == \
        "StableFDG (explore at every firing stage)"


# -- the attention highlighter --------------------------------------------------------------------
def test_attention_weights_sum_to_one_and_match_eq8():
    torch.manual_seed(0)
    neck = AttentionNeck(PooledNeck(PoolingStage()), 8, dim=5)
    maps = torch.randn(6, 8, 3, 4)
    partner = torch.tensor([1, 0, 3, 2, 4, 5])
    for p in (None, partner):
        w = neck.weights(maps, p)
        assert w.shape == (6, 3, 4)
        assert torch.allclose(w.sum((1, 2)), torch.ones(6), atol=1e-6)
        assert torch.allclose(w, neck.weights_by_definition(maps, p), atol=1e-5)
    feats = neck(maps, partner=partner)
    assert feats.shape == (6, 16)
    assert torch.allclose(feats[:, :8], maps.mean((2, 3)))  # the wrapped embedding: here a global average pool
    assert torch.allclose(feats[:, 8:], torch.einsum("bhw,bchw->bc", neck.weights(maps, partner), maps), atol=1e-5)


def test_test_time_attention_is_self_attention_and_deterministic():
    method, model = make_model("stablefdg", size=32)
    model.eval()
    x = torch.randn(5, 3, 32, 32)
    maps = model.backbone.forward_maps(x)
    assert torch.equal(model(x), model(x))
    assert torch.allclose(model.neck(maps), model.neck(maps, partner=torch.arange(5)))  # j = i
    single = model(x[:1])
    assert torch.allclose(single, model(x)[:1], atol=1e-5)  # a sample's prediction ignores the rest of the batch


def test_partners_share_the_class_and_singletons_use_themselves():
    torch.manual_seed(0)
    y = torch.tensor([0, 1, 0, 2, 1, 0])
    for _ in range(20):
        p = same_class_partners(y)
        assert torch.equal(y[p], y) and p[3] == 3 and all(p[i] != i for i in (0, 1, 2, 4, 5))
    assert same_class_partners(y, "next").tolist() == [2, 4, 5, 3, 1, 0]
    assert same_class_partners(torch.tensor([7])).tolist() == [0]


class PoolingStage(Backbone):
    """A pooling backbone of 8 channels (the base class's global average pool) for the neck's unit tests."""

    stage_names = ("layer1",)
    feature_dim = 8

    def run_stage(self, name, x):
        return x


@pytest.mark.parametrize("backbone,size,embedding,channels", [
    ("convnet", 32, 64 * 2 * 2, 64),          # the ConvNet's own embedding: its flattened 64 x 2 x 2 map
    ("resnet18", 32, 512, 512),               # ResNets and EfficientNet: the global average pool (2C in all)
    ("resnet50", 32, 2048, 2048),
    ("efficientnet_lite0", 32, 1280, 1280)])
def test_attention_is_concatenated_with_the_backbones_own_embedding(backbone, size, embedding, channels):
    # Section 3.2: A(z) goes next to "the last embedding feature (e.g., after the global average
    # pooling in ResNet)", i.e. whatever the model gave its head without attention
    _, plain = make_model("stablefdg", hp={"attention": False}, backbone=backbone, size=size)
    assert isinstance(plain.neck, PooledNeck) and plain.head.in_features == embedding
    method, model = make_model("stablefdg", backbone=backbone, size=size)
    assert isinstance(model.neck, AttentionNeck)
    assert model.head.in_features == embedding + channels   # ConvNet 256 + 64 = 320; ResNet-18 2 x 512
    assert any(k.startswith("neck.query") for k in model.state_dict())  # aggregated like every weight
    assert not any(k.startswith("neck.embedding") for k in model.state_dict())  # the pooling has no weights
    model.eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        maps = model.backbone.forward_maps(x)
        features = model.neck(maps)
        assert features.shape == (2, embedding + channels)
        assert torch.equal(features[:, :embedding], model.backbone.pool(maps))  # flatten on the ConvNet, avgpool else
        weights = model.neck.weights(maps)
        assert torch.allclose(features[:, embedding:], torch.einsum("bhw,bchw->bc", weights, maps), atol=1e-5)
        assert model(x).shape == (2, 4)


def test_the_attention_neck_does_not_wrap_itself():
    inner = AttentionNeck(PooledNeck(PoolingStage()), 8)
    with pytest.raises(ConfigError, match="not another attention neck"):
        AttentionNeck(inner, 8)


# -- a training step: flags, fallbacks ------------------------------------------------------------
def train_step(hp, x, y, payload=None, classes=4):
    method, model = make_model("stablefdg", hp=hp, size=16, classes=classes)
    model.train()
    data = make_clients(1)[0]
    ctx = context(data)
    loss = method.training_loss(ctx, model, x, y, payload or {})
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return loss, ctx.logged_metrics()


RECEIVED = {"style": torch.stack([torch.zeros(64), torch.ones(64), torch.full((64,), 0.1), torch.full((64,), 0.01)])}
ALWAYS = {"shift_p": 1.0, "explore_p": 1.0}


@pytest.mark.parametrize("batch,labels", [(1, [2]), (2, [1, 1]), (3, [0, 1, 2]), (8, [3] * 8),
                                          (7, [0, 0, 1, 1, 2, 3, 3])])
def test_any_batch_size_and_single_class_batches_train_without_nan(batch, labels):
    torch.manual_seed(0)
    x = torch.randn(batch, 3, 16, 16)
    y = torch.tensor(labels)
    for hp in (ALWAYS, dict(ALWAYS, reference_code=True), dict(ALWAYS, local_bn=True)):
        _, metrics = train_step(hp, x, y, RECEIVED)
        assert metrics["shift_fired"] == 1.0 and metrics["explore_fired"] == 1.0
        assert {"kmeans_seconds", "shift_seconds", "oversample_seconds", "explore_mixstyle_seconds",
                "attention_seconds"} <= set(metrics)


def test_constant_features_give_no_nan():
    x = torch.zeros(6, 3, 16, 16)
    train_step(ALWAYS, x, torch.tensor([0, 0, 1, 1, 2, 2]), RECEIVED)


def test_without_a_received_style_nothing_is_shifted():
    _, metrics = train_step(ALWAYS, torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3]))
    assert metrics["shift_fired"] == 0.0


def _pieces(hp):
    """One training step with every style op of the pipeline spied on: its logged metrics and each op's calls."""
    calls = {"selective_shift": [], "oversample_indices": [], "oversample_features": [], "explore_and_mix": []}

    def spy(name, op):
        return lambda *args, **kw: calls[name].append((args, kw)) or op(*args, **kw)

    with pytest.MonkeyPatch.context() as patch:
        for name in calls:
            patch.setattr(stablefdg_pipeline, name, spy(name, getattr(stablefdg_pipeline, name)))
        torch.manual_seed(0)
        _, metrics = train_step(dict(ALWAYS, **hp), torch.randn(6, 3, 16, 16), torch.tensor([0, 0, 1, 1, 2, 3]),
                                RECEIVED)
    return metrics, calls


#: per switch, what the step shows of it (the defaults, with every piece firing, show the opposite of each)
SWITCHED_OFF = {
    "attention": ({"attention": False}, lambda m, c: "attention_seconds" not in m),
    "no sharing": ({"share": False, "oversample": False, "mixstyle": False},
                   lambda m, c: m["shift_fired"] == 0 and not c["selective_shift"] and not c["oversample_features"]
                   and not c["explore_and_mix"]),
    "oversample": ({"oversample": False},  # exploration works on the oversampled samples: none, so it stops too
                   lambda m, c: not c["oversample_features"] and m["explore_fired"] == 0),
    "explore": ({"explore": False}, lambda m, c: m["explore_fired"] == 0 and c["oversample_features"]
                and all(args[1] is None for args, _ in c["explore_and_mix"])),
    "mixstyle": ({"mixstyle": False}, lambda m, c: all(kw["mix_weights"] is None for _, kw in c["explore_and_mix"])),
    "random selection": ({"select": "random"}, lambda m, c: [a[2] for a, _ in c["selective_shift"]] == ["random"]),
    "unbalanced": ({"oversample_balanced": False}, lambda m, c: [a[3] for a, _ in c["oversample_indices"]] == [False]),
    "ratio": ({"oversample_ratio": 0.25}, lambda m, c: [a[2] for a, _ in c["oversample_features"]] == [2]),  # 0.25 B
}


@pytest.mark.parametrize("switch", sorted(SWITCHED_OFF))
def test_every_piece_switches_off(switch):
    hp, off = SWITCHED_OFF[switch]
    assert off(*_pieces(hp)), switch
    assert not off(*_pieces({})), f"the default step already shows {switch} off: the check tells nothing"


@pytest.mark.parametrize("hp,select,center_count,min_sigma", [
    ({}, "kmeans", None, None),
    ({"select": "random", "negative_sigma": "clamp"}, "random", None, 1e-6),
    ({"reference_code": True}, "centres", 6, None),  # the public code: centres' styles, the original batch's centre
])
def test_the_pipeline_hands_the_hyperparameters_to_the_style_ops(hp, select, center_count, min_sigma):
    calls = {"selective_shift": [], "oversample_features": [], "explore_and_mix": []}

    def spy(name, op):
        return lambda *args, **kw: calls[name].append((args, kw)) or op(*args, **kw)

    with pytest.MonkeyPatch.context() as patch:
        for name in calls:
            patch.setattr(stablefdg_pipeline, name, spy(name, getattr(stablefdg_pipeline, name)))
        train_step(dict(ALWAYS, oversample_ratio=0.5, alpha=2.0, **hp), torch.randn(6, 3, 16, 16),
                   torch.tensor([0, 0, 1, 1, 2, 3]), RECEIVED)
    assert [args[2] for args, _ in calls["selective_shift"]] == [select]
    # M = round(0.5 B) extras, drawn by the pipeline's draws (balanced)
    assert [(args[2:], tuple(kw["indices"].shape)) for args, kw in calls["oversample_features"]] == [((3, 4), (3,))]
    (args, kw), *later = calls["explore_and_mix"]  # once per firing stage: exploration at the first only
    assert args[1:] == (6, 2.0) and kw["center_count"] == center_count and kw["min_sigma"] == min_sigma
    assert kw["mix_weights"] is not None and all(args[1] is None for args, _ in later)


def test_switch_dependencies_and_labels():
    only_attention = StableFDG.resolve({"share": False, "oversample": False, "mixstyle": False})
    assert not only_attention["shift"] and not only_attention["explore"]
    assert StableFDG.display_name(only_attention) == "StableFDG (attention only)"
    assert StableFDG.display_name(StableFDG.resolve({"attention": False})) == "StableFDG (style only)"
    assert StableFDG.display_name(StableFDG.resolve({})) == "StableFDG"
    assert StableFDG.display_name(StableFDG.resolve({"local_bn": True})) == "StableFDG + FedBN"
    assert not algo({"share": False}).uses_phase("query") and algo().uses_phase("query")
    assert StableFDG.resolve({"reference_code": True})["aggregation"] == "uniform"
    assert StableFDG.resolve({"reference_code": True, "aggregation": "size"})["aggregation"] == "size"


@pytest.mark.parametrize("hp,match", [
    ({"share_stage": "layer9"}, "unknown backbone stage 'layer9'.*stages are"),
    ({"explore_stages": "layer1,conv5"}, "unknown backbone stage 'conv5'"),
    ({"alpha": -1}, "alpha .* must be >= 0.*paper's 3"),
    ({"share": False, "shift": True}, "shift=true needs share=true"),
    ({"oversample": False, "explore": True}, "explore=true needs oversample=true"),
    ({"share": True, "shift": False}, "share=true with shift=false"),
])
def test_bad_hyperparameters_are_one_line_errors(hp, match):
    with pytest.raises(ConfigError, match=match) as err:
        StableFDG.resolve(hp)
    assert "\n" not in str(err.value)


def test_a_backbone_without_the_stage_is_refused_before_anything_is_written(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="ConvNet backbone has no stage 'stem' for share_stage; choose among layer1"):
        run_experiment(tiny_config.updated(method="stablefdg", hparams={"share_stage": "stem"}), tmp_path / "a")
    with pytest.raises(ConfigError, match="before share_stage"):
        run_experiment(tiny_config.updated(method="stablefdg", hparams={"share_stage": "layer2"}), tmp_path / "b")
    with pytest.raises(ConfigError, match="alpha"):
        run_experiment(tiny_config.updated(method="stablefdg", hparams={"alpha": -0.5}), tmp_path / "c")
    assert not any((tmp_path / n).exists() for n in "abc")
    method, model = make_model("stablefdg", hp={"share_stage": "stem", "explore_stages": "layer1"},
                               backbone="resnet18", size=32)
    assert model.head.in_features == 1024  # ResNets have a stem


# -- runs: bytes, metrics, resume, Flower ---------------------------------------------------------
def _records(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "event" not in r]


def _without_timings(records):
    out = []
    for r in records:
        r = {k: v for k, v in r.items() if k != "seconds"}
        if "train_metrics" in r:
            r["train_metrics"] = {k: v for k, v in r["train_metrics"].items() if not k.endswith("_seconds")}
        out.append(r)
    return out


def test_style_bytes_and_metrics_reach_metrics_jsonl(tiny_config, tmp_path):
    run_experiment(tiny_config.updated(method="stablefdg"), tmp_path / "run", quiet=True)
    records = _records(tmp_path / "run")
    phi_bytes = 4 * 64 * 4  # Phi: 4 x C float32 at layer1 of the ConvNet
    assert [r["bytes_payload_up"] for r in records] == [3 * phi_bytes, 6 * phi_bytes]  # 3 clients a round
    assert [r["bytes_payload_down"] for r in records] == [3 * phi_bytes, 6 * phi_bytes]
    for r in records:
        assert {"ce", "style_query_seconds", "kmeans_seconds", "attention_seconds"} <= set(r["train_metrics"])


def test_resumed_run_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    config = tiny_config.updated(method="stablefdg", rounds=3, partition="per_domain", clients=6, clients_per_round=4)
    run_experiment(config, tmp_path / "full", quiet=True)
    interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert _without_timings(_records(tmp_path / "cut")) == _without_timings(_records(tmp_path / "full"))


def test_under_flower_equals_simulator_with_a_query_phase(tiny_config, tmp_path):
    """The query phase (each round's style statistics up, the shifted styles down) and the training through
    Flower's ServerApp and ClientApp (tests/flower_grid.py): the simulator's records and weights, bitwise."""
    pytest.importorskip("flwr")
    from safetensors.torch import load_file

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = tiny_config.updated(method="stablefdg", partition="per_domain", clients=6, clients_per_round=4,
                                     lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(before)
    sim, flower = _records(tmp_path / "sim"), _records(tmp_path / "flower")
    assert _without_timings(flower) == _without_timings(sim)
    assert all(r["bytes_payload_up"] > 0 for r in sim)
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    assert all(torch.equal(v, b[k]) for k, v in a.items() if k.startswith("global/"))


def test_registered():
    assert METHODS.get("stablefdg") is StableFDG
