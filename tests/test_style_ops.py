"""Channel statistics, AdaIN, MixStyle and DSU: equations against hand computations and invariants."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import beta as beta_dist

from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.style import DSU, STYLE_OPS, MixStyle, adain, channel_stats, restyle

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def feature_map(batch=8, channels=4, size=6, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    # Per-sample, per-channel offsets and scales so that samples really differ in style.
    x = torch.randn(batch, channels, size, size, generator=g)
    scale = torch.rand(batch, channels, 1, 1, generator=g) * 2 + 0.5
    shift = torch.randn(batch, channels, 1, 1, generator=g) * 3
    return (x * scale + shift).to(device)


# -- channel_stats / adain ----------------------------------------------------------------------
def test_channel_stats_hand_computed():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    mu, sigma = channel_stats(x, eps=0.0)
    assert mu.shape == sigma.shape == (1, 1, 1, 1)
    assert mu.item() == pytest.approx(2.5)
    assert sigma.item() == pytest.approx(math.sqrt(1.25))  # (2.25 + 0.25 + 0.25 + 2.25) / 4
    _, sigma_u = channel_stats(x, eps=0.0, unbiased=True)
    assert sigma_u.item() == pytest.approx(math.sqrt(5.0 / 3.0))  # 5 / (4 - 1)
    _, sigma_eps = channel_stats(x, eps=0.75)
    assert sigma_eps.item() == pytest.approx(math.sqrt(2.0))  # eps inside the square root


def test_channel_stats_per_sample_per_channel():
    x = feature_map(batch=3, channels=2)
    mu, sigma = channel_stats(x, eps=0.0)
    assert mu.shape == (3, 2, 1, 1)
    for b in range(3):
        for c in range(2):
            values = x[b, c].flatten().double()
            assert mu[b, c].item() == pytest.approx(values.mean().item(), rel=1e-5)
            assert sigma[b, c].item() == pytest.approx(values.std(unbiased=False).item(), rel=1e-5)


def test_channel_stats_rejects_bad_shapes():
    with pytest.raises(ConfigError, match=r"\(B, C, H, W\)"):
        channel_stats(torch.zeros(2, 3, 4))
    with pytest.raises(ConfigError, match="H\\*W >= 2"):
        channel_stats(torch.zeros(2, 3, 1, 1), unbiased=True)


def test_adain_hand_computed():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    out = adain(x, torch.tensor(10.0), torch.tensor(2.0), eps=0.0)
    # 2 * (x - 2.5) / sqrt(1.25) + 10
    expected = torch.tensor([7.316718, 9.105573, 10.894427, 12.683282]).reshape(1, 1, 2, 2)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_adain_output_has_target_statistics(device):
    x = feature_map(device=device)
    g = torch.Generator().manual_seed(1)
    mu_t = torch.randn(8, 4, 1, 1, generator=g).to(device)
    sigma_t = (torch.rand(8, 4, 1, 1, generator=g) + 0.5).to(device)
    out = adain(x, mu_t, sigma_t)
    assert out.device == x.device
    mu_out, sigma_out = channel_stats(out, eps=0.0)
    torch.testing.assert_close(mu_out, mu_t, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sigma_out, sigma_t, atol=1e-5, rtol=1e-4)


def test_adain_is_differentiable_in_input_and_targets():
    x = feature_map().requires_grad_()
    mu_t = torch.zeros(1, 4, 1, 1, requires_grad=True)
    sigma_t = torch.ones(1, 4, 1, 1, requires_grad=True)
    (adain(x, mu_t, sigma_t) * torch.randn(8, 4, 6, 6)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert mu_t.grad is not None and sigma_t.grad is not None and sigma_t.grad.abs().sum() > 0


def test_restyle_matches_formula():
    x = feature_map()
    mu, sigma = channel_stats(x)
    mu_t, sigma_t = mu.flip(0), sigma.flip(0)
    torch.testing.assert_close(restyle(x, mu, sigma, mu_t, sigma_t), sigma_t * (x - mu) / sigma + mu_t)
    torch.testing.assert_close(restyle(x, mu, sigma, mu_t, sigma_t), adain(x, mu_t, sigma_t))


# -- MixStyle ----------------------------------------------------------------------------------
def fixed_lambda(value):
    return lambda batch, like: torch.full((batch, 1, 1, 1), value, device=like.device, dtype=like.dtype)


def test_mixstyle_identity_in_eval_mode():
    op = MixStyle(p=1.0).eval()
    x = feature_map()
    assert op(x) is x


def test_mixstyle_identity_when_p_is_zero():
    op = MixStyle(p=0.0).train()
    x = feature_map()
    for _ in range(5):
        assert op(x) is x


def test_mixstyle_lambda_one_is_identity(monkeypatch):
    op = MixStyle(p=1.0).train()
    monkeypatch.setattr(op, "sample_mix_weights", fixed_lambda(1.0))
    x = feature_map()
    torch.testing.assert_close(op(x), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unbiased", [False, True])
def test_mixstyle_output_has_mixed_statistics(monkeypatch, device, unbiased):
    perm = torch.tensor([3, 0, 1, 2, 7, 4, 5, 6])
    real_randperm = torch.randperm
    monkeypatch.setattr(torch, "randperm", lambda n, device=None: perm.to(device))
    op = MixStyle(p=1.0, unbiased=unbiased).train()
    monkeypatch.setattr(op, "sample_mix_weights", fixed_lambda(0.3))
    x = feature_map(device=device)
    out = op(x)
    monkeypatch.setattr(torch, "randperm", real_randperm)
    mu, sigma = channel_stats(x, unbiased=unbiased)
    p = perm.to(device)
    mu_mix = 0.3 * mu + 0.7 * mu[p]
    sigma_mix = 0.3 * sigma + 0.7 * sigma[p]
    mu_out, sigma_out = channel_stats(out, eps=0.0, unbiased=unbiased)
    torch.testing.assert_close(mu_out, mu_mix, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sigma_out, sigma_mix, atol=1e-5, rtol=1e-4)
    # Not a no-op: sample 0 now carries 70 % of sample 3's style.
    assert (mu_out[0] - mu[0]).abs().max() > 0.1


def test_mixstyle_statistics_are_detached(monkeypatch):
    # With mu, sigma constants, out = (sigma_mix / sigma) * x + const, so d<w, out>/dx = w * sigma_mix / sigma.
    op = MixStyle(p=1.0).train()
    monkeypatch.setattr(op, "sample_mix_weights", fixed_lambda(0.5))
    x = feature_map().requires_grad_()
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    (op(x) * weights).sum().backward()
    torch.manual_seed(0)
    perm = torch.randperm(x.shape[0])
    _, sigma = channel_stats(x.detach())
    sigma_mix = 0.5 * sigma + 0.5 * sigma[perm]
    torch.testing.assert_close(x.grad, weights * sigma_mix / sigma)


def test_mixstyle_lambda_distribution():
    op = MixStyle(alpha=0.1)
    torch.manual_seed(0)
    lam = op.sample_mix_weights(20000, torch.zeros(1))
    assert lam.shape == (20000, 1, 1, 1)
    assert 0.0 <= lam.min() and lam.max() <= 1.0
    middle = ((lam > 0.1) & (lam < 0.9)).float().mean().item()
    expected = beta_dist(0.1, 0.1).cdf(0.9) - beta_dist(0.1, 0.1).cdf(0.1)  # 0.187
    assert middle == pytest.approx(expected, abs=0.015)
    assert lam.mean().item() == pytest.approx(0.5, abs=0.02)


def test_mixstyle_fires_with_probability_p():
    op = MixStyle(p=0.3).train()
    x = feature_map(batch=4)
    torch.manual_seed(0)
    fired = sum(op(x) is not x for _ in range(400))
    assert fired / 400 == pytest.approx(0.3, abs=0.08)  # binomial sd 0.023


def test_mixstyle_is_deterministic_given_the_seed():
    op = MixStyle(p=0.5).train()
    x = feature_map()
    torch.manual_seed(7)
    first = [op(x) for _ in range(6)]
    torch.manual_seed(7)
    second = [op(x) for _ in range(6)]
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(o is not x for o in first)


@pytest.mark.parametrize("kwargs", [{"p": 1.5}, {"p": -0.1}, {"alpha": 0.0}])
def test_mixstyle_rejects_bad_hyperparameters(kwargs):
    with pytest.raises(ConfigError):
        MixStyle(**kwargs)


# -- DSU ---------------------------------------------------------------------------------------
def test_dsu_identity_in_eval_mode_and_when_p_is_zero():
    x = feature_map()
    assert DSU(p=1.0).eval()(x) is x
    assert DSU(p=0.0).train()(x) is x


def test_dsu_single_sample_passes_through():
    x = feature_map(batch=1)
    assert DSU(p=1.0).train()(x) is x


@pytest.mark.parametrize("device", DEVICES)
def test_dsu_perturbs_statistics_by_batch_spread(device):
    torch.manual_seed(0)
    # Many samples so that the standardised perturbations can be tested as N(0, 1) draws.
    g = torch.Generator().manual_seed(2)
    # Styles spread in mean and scale, but with scales far from 0 so that the perturbed sigma stays positive.
    x = torch.randn(512, 8, 16, 16, generator=g) * (3 + 0.3 * torch.rand(512, 8, 1, 1, generator=g))
    x = (x + torch.randn(512, 8, 1, 1, generator=g)).to(device)
    out = DSU(p=1.0).train()(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert not torch.allclose(out, x)
    mu, sigma = channel_stats(x, eps=1e-6, unbiased=True)
    spread_mu = (mu.var(dim=0, keepdim=True) + 1e-6).sqrt()
    spread_sigma = (sigma.var(dim=0, keepdim=True) + 1e-6).sqrt()
    mu_out, sigma_out = channel_stats(out, eps=0.0, unbiased=True)
    z_mu = ((mu_out - mu) / spread_mu).flatten()
    z_sigma = ((sigma_out - sigma) / spread_sigma).flatten()
    assert (sigma - 4 * spread_sigma).min() > 0  # gamma stays positive, so out's std is gamma
    for z in (z_mu, z_sigma):  # 4096 draws: sd of the mean 0.016, of the std ~0.011
        assert z.mean().item() == pytest.approx(0.0, abs=0.08)
        assert z.std().item() == pytest.approx(1.0, abs=0.06)
    # The batch mean of the new statistics stays close to the old one.
    assert (mu_out.mean(0) - mu.mean(0)).abs().max() < 4 * spread_mu.max() / math.sqrt(512)


def test_dsu_is_differentiable_and_deterministic_given_the_seed():
    x = feature_map().requires_grad_()
    op = DSU(p=1.0).train()
    torch.manual_seed(3)
    a = op(x)
    torch.manual_seed(3)
    b = op(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    a.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


# -- registry ----------------------------------------------------------------------------------
def test_style_op_registry():
    assert STYLE_OPS.names() == ["dsu", "mixstyle"]
    mix = STYLE_OPS.get("mixstyle")(p=0.25)
    dsu = STYLE_OPS.get("dsu")(p=0.75)
    assert isinstance(mix, MixStyle) and mix.p == 0.25
    assert isinstance(dsu, DSU) and dsu.p == 0.75
    assert list(mix.parameters()) == [] and list(dsu.state_dict()) == []  # ops add no model state
    with pytest.raises(UnknownNameError, match="mixstyle"):
        STYLE_OPS.get("mixup")
