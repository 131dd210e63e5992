"""The privacy audit's attack library (fedstyle.audit): every test checks a known answer."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.audit.attributes import attribute_scores, train_probe
from fedstyle.audit.gradient_inversion import gradient_from_update, infer_labels, invert_gradients
from fedstyle.audit.invert import invert_statistics
from fedstyle.audit.membership import membership_auc, nearest_style_score, set_membership_score
from fedstyle.audit.metrics import best_match, psnr, roc_auc, ssim
from fedstyle.errors import ConfigError
from fedstyle.style.stats import channel_stats


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny images and models: one thread is fastest (two on a busy 2-core machine: 75 s, not 6 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def natural_patches(n: int, seed: int, size: int = 16) -> torch.Tensor:
    """n colour patches (n, 3, size, size) in [0, 1]: random crops of skimage's bundled photographs
    downsampled 4x (astronaut, coffee, chelsea, rocket; no download)."""
    import skimage.data

    rng = np.random.default_rng(seed)
    photos = [F.avg_pool2d(torch.tensor(f()).permute(2, 0, 1).float()[None] / 255, 4)[0]
              for f in (skimage.data.astronaut, skimage.data.coffee, skimage.data.chelsea, skimage.data.rocket)]
    out = []
    for i in range(n):
        p = photos[i % len(photos)]
        y, x = rng.integers(0, p.shape[1] - size), rng.integers(0, p.shape[2] - size)
        out.append(p[:, y : y + size, x : x + size])
    return torch.stack(out)


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()  # 1797 8x8 digits, shipped with scikit-learn
    return torch.tensor(d.images, dtype=torch.float32)[:, None] / 16, torch.tensor(d.target)


def test_psnr_known_values():
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 0.9
    assert torch.isinf(psnr(x, x)).all()
    assert torch.allclose(psnr(x, x + 0.1), torch.full((3,), 20.0, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(psnr(x, x + 0.1, peak=10.0), torch.full((3,), 40.0, dtype=torch.float64), atol=1e-4)


def test_ssim_matches_skimage():
    from skimage.metrics import structural_similarity

    g = torch.Generator().manual_seed(1)
    a = natural_patches(2, seed=0, size=32)
    pairs = [(a[0], (a[0] + 0.1 * torch.randn(a[0].shape, generator=g)).clamp(0, 1)), (a[0], a[1]),
             (torch.rand(3, 20, 27, generator=g), torch.rand(3, 20, 27, generator=g))]
    for x, y in pairs:
        ours = ssim(x[None], y[None]).item()
        ref = structural_similarity(x.double().numpy(), y.double().numpy(), gaussian_weights=True, sigma=1.5,
                                    use_sample_covariance=False, data_range=1, channel_axis=0)
        assert abs(ours - ref) < 1e-4, (ours, ref)
    assert ssim(a, a).sub(1).abs().max() < 1e-5


def test_roc_auc_and_best_match_by_hand():
    assert roc_auc([3, 2], [1, 2]) == 0.875  # 3>1, 3>2, 2>1, 2=2 counted half: 3.5 / 4
    assert roc_auc([5, 6], [1, 2, 3]) == 1.0 and roc_auc([1], [2]) == 0.0 and roc_auc([1, 1], [1]) == 0.5
    truth = natural_patches(3, seed=2)
    recon = torch.stack([truth[2], (truth[0] + 0.05).clamp(0, 1)])
    scores, index = best_match(recon, truth)
    assert index.tolist() == [2, 0] and torch.isinf(scores[0]) and 20 < scores[1] < 30


def test_one_image_style_reconstructs_better_than_a_64_image_summary():
    """Gain over an uninformed guess (PSNR of the reconstruction minus PSNR of public images of the
    same kind, scored the same way): a per-image style (one image) leaks several dB; the summary of
    a 64-image set leaks nothing a random public patch would not match as well."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
    encoder.requires_grad_(False)

    def per_image(x):  # channel mean and std at both conv outputs: (R, 64)
        h1 = encoder[:2](x)
        h2 = encoder[2:](h1)
        return torch.cat([s.flatten(1) for h in (h1, h2) for s in channel_stats(h)], 1)

    def summary(x):  # [mean mu, mean sigma ; var mu, var sigma] over the set: (2, 64)
        s = per_image(x)
        return torch.stack([s.mean(0), s.var(0, unbiased=False)])

    data = natural_patches(128, seed=1)
    members, public = data[:64], data[64:]
    gains = []
    for k in range(4):
        x = members[k : k + 1]
        inv = invert_statistics(per_image, per_image(x), x.shape, steps=200, seed=k)
        assert inv.images.shape == x.shape and 0 <= inv.images.min() and inv.images.max() <= 1
        assert inv.loss < 0.01 * inv.initial_loss  # the statistics match far better than the init's
        guess = psnr(public, x.expand_as(public)).mean()
        gains.append((psnr(inv.images, x) - guess).item())
    inv = invert_statistics(summary, summary(members), members.shape, steps=200, seed=0)
    assert inv.loss < 0.01 * inv.initial_loss
    set_gain = (best_match(inv.images, members)[0].mean() - best_match(public, members)[0].mean()).item()
    one_gain = float(np.mean(gains))
    assert one_gain > 2.0 and one_gain > set_gain + 3.0, (gains, set_gain)  # seen: 5.5 dB vs -4.0 dB


def test_invert_statistics_is_deterministic_and_checks_the_statistic():
    stat = lambda x: torch.cat([x.mean((2, 3)), x.std((2, 3))], 1)
    target = torch.tensor([[0.2, 0.5, 0.8, 0.1, 0.1, 0.1]])
    a = invert_statistics(stat, target, (1, 3, 8, 8), steps=150, seed=3)
    b = invert_statistics(stat, target, (1, 3, 8, 8), steps=150, seed=3)
    assert torch.equal(a.images, b.images) and a.loss == b.loss
    assert torch.allclose(stat(a.images), target, atol=0.03)  # channel means / stds are reached
    with pytest.raises(ConfigError, match="statistic"):
        invert_statistics(stat, target[:, :3], (1, 3, 8, 8), steps=1)
    with pytest.raises(ConfigError, match="NaN"):
        invert_statistics(stat, target * float("nan"), (1, 3, 8, 8), steps=1)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Sigmoid(), nn.Linear(32, 10))


def _observed_update(model, x, y, lr=0.05):
    before = copy.deepcopy(model.state_dict())
    local = copy.deepcopy(model)
    optimiser = torch.optim.SGD(local.parameters(), lr=lr)
    F.cross_entropy(local(x), y).backward()
    true_grads = {n: p.grad.clone() for n, p in local.named_parameters()}
    optimiser.step()
    return gradient_from_update(before, local.state_dict(), lr), true_grads


def test_gradient_from_update_and_labels_are_exact():
    model = _mlp()
    x, y = digits()
    grads, true_grads = _observed_update(model, x[:4], y[:4])
    assert grads.keys() == true_grads.keys()
    for n in grads:
        assert torch.allclose(grads[n], true_grads[n], atol=1e-5, rtol=1e-3), n
    for i in range(10):  # iDLG: one image's label is the one negative bias-gradient entry
        g, _ = _observed_update(model, x[i : i + 1], y[i : i + 1])
        assert infer_labels(g["3.bias"], 1).tolist() == [y[i].item()]
    hand = torch.tensor([0.3, -0.5, 0.1, -0.2])
    assert infer_labels(hand, 2).tolist() == [1, 3] and infer_labels(hand, 4).tolist() == [1, 3, 1, 1]


def test_invert_gradients_recovers_one_image_better_than_a_batch_of_eight():
    model = _mlp()
    x, y = digits()
    g1, _ = _observed_update(model, x[:1], y[:1])
    batch = x[10:18]
    g8, _ = _observed_update(model, batch, y[10:18])
    model.train()
    model[1].bias.requires_grad_(False)  # a flag the attack must restore
    params_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    one = invert_gradients(model, g1, (1, 1, 8, 8), infer_labels(g1["3.bias"], 1), steps=200)
    eight = invert_gradients(model, g8, tuple(batch.shape), y[10:18], steps=200)
    p1 = psnr(one.images, x[:1]).item()
    p8 = best_match(eight.images, batch)[0].mean().item()
    assert p1 > 30 and p1 > p8 + 10, (p1, p8)  # seen: 55 dB vs 37 dB
    assert model.training and model[1].bias.requires_grad is False and model[3].bias.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, params_before[n]) for n, p in model.named_parameters())
    with pytest.raises(ConfigError, match="one entry per image"):
        invert_gradients(model, g1, (2, 1, 8, 8), torch.tensor([0]), steps=1)


def test_nearest_style_membership_is_perfect_without_noise():
    g = torch.Generator().manual_seed(0)
    members, others = torch.randn(50, 32, generator=g), torch.randn(50, 32, generator=g)
    shared = members[torch.randperm(50, generator=g)]
    s_in, s_out = nearest_style_score(members, shared), nearest_style_score(others, shared)
    assert torch.equal(s_in, torch.zeros(50, dtype=torch.float64))
    assert membership_auc(s_in, s_out) == 1.0


def test_set_membership_fades_with_the_set_size():
    g = torch.Generator().manual_seed(0)
    dim, auc = 16, {}
    reference = torch.randn(2000, dim, generator=g).mean(0)  # public data of the same kind
    for n in (1, 64):
        s_in, s_out = [], []
        for _ in range(400):
            members, outsider = torch.randn(n, dim, generator=g), torch.randn(1, dim, generator=g)
            shared = members.mean(0)
            s_in.append(set_membership_score(members[:1], shared, reference, n))
            s_out.append(set_membership_score(outsider, shared, reference, n))
        auc[n] = membership_auc(torch.cat(s_in), torch.cat(s_out))
    assert auc[1] > 0.95 and auc[64] < 0.75 and auc[64] > 0.5, auc  # theory: SNR ~ sqrt(16 / n)


def test_probes_read_separable_domains_and_linear_mixes():
    g = torch.Generator().manual_seed(0)
    centres = 3.0 * torch.eye(3, 6)
    labels = torch.arange(300) % 3 + 7  # arbitrary label values
    feats = centres[labels - 7] + 0.5 * torch.randn(300, 6, generator=g)
    probe = train_probe(feats[:150], labels[:150], kind="classify")
    scores = attribute_scores(probe, feats[150:], labels[150:], "classify")
    assert scores["accuracy"] > 0.97 and scores["chance"] == pytest.approx(1 / 3)
    assert set(probe.predict(feats[:5]).tolist()) <= {7, 8, 9}

    torch.manual_seed(0)  # Dirichlet.sample takes no generator
    mixes = torch.distributions.Dirichlet(torch.ones(4)).sample((200,))
    mixing = torch.randn(4, 10, generator=g)
    feats = mixes @ mixing + 0.01 * torch.randn(200, 10, generator=g)
    probe = train_probe(feats[:100], mixes[:100], kind="regress")
    scores = attribute_scores(probe, feats[100:], mixes[100:] * 50, "regress")  # counts work as histograms
    assert scores["tv_error"] < 0.05 and scores["tv_error_uniform_guess"] > 0.2, scores
    assert scores["majority_class_accuracy"] > 0.9 > scores["majority_chance"]


def test_bad_input_raises_config_error():
    x = torch.rand(2, 3, 16, 16)
    cases = [
        lambda: psnr(x, x[:, :2]),
        lambda: ssim(x[..., :8, :8], x[..., :8, :8]),
        lambda: psnr(x * float("nan"), x),
        lambda: roc_auc([], [1.0]),
        lambda: roc_auc([float("nan")], [1.0]),
        lambda: best_match(x, torch.rand(2, 1, 16, 16)),
        lambda: nearest_style_score(torch.rand(3, 4), torch.rand(3, 5)),
        lambda: nearest_style_score(torch.rand(3, 4), torch.empty(0, 4)),
        lambda: set_membership_score(torch.rand(3, 4), torch.rand(4), torch.rand(5), 8),
        lambda: set_membership_score(torch.rand(3, 4), torch.rand(4), torch.rand(4), 0),
        lambda: train_probe(torch.rand(4, 3), torch.zeros(4, dtype=torch.long)),
        lambda: train_probe(torch.rand(4, 3), torch.zeros(5, dtype=torch.long)),
        lambda: train_probe(torch.empty(0, 3), torch.empty(0)),
        lambda: gradient_from_update({"w": torch.zeros(2)}, {"v": torch.zeros(2)}, 0.1),
        lambda: gradient_from_update({"w": torch.zeros(2)}, {"w": torch.zeros(3)}, 0.1),
        lambda: infer_labels(torch.zeros(3, 2), 1),
        lambda: invert_statistics(lambda im: im.mean(), torch.ones(1), (1, 3, 0, 8), steps=1),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(ConfigError):
            case()
            print(f"bad-input case {i} raised no ConfigError")  # printed with pytest's DID NOT RAISE
