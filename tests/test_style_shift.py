"""Style summaries, shifts to a received style and exploration against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from fedstyle.errors import ConfigError
from fedstyle.style import (
    StyleAccumulator,
    StyleSummary,
    batch_style,
    channel_stats,
    explore,
    explore_styles,
    sample_styles,
    shift_to_style,
    summarize_styles,
)


def test_summary_of_two_samples_by_hand():
    # per-sample statistics of 2 samples x 2 channels
    mu = torch.tensor([[1.0, 4.0], [3.0, 8.0]])
    sigma = torch.tensor([[0.5, 1.0], [1.5, 3.0]])
    s = summarize_styles(mu, sigma)
    assert s.mu_mean.tolist() == [2.0, 6.0]
    assert s.sigma_mean.tolist() == [1.0, 2.0]
    assert s.mu_var.tolist() == [1.0, 4.0]  # mean of squared deviations: ((1-2)^2 + (3-2)^2) / 2
    assert s.sigma_var.tolist() == [0.25, 1.0]
    u = summarize_styles(mu, sigma, unbiased=True)
    assert u.mu_var.tolist() == [2.0, 8.0]
    assert torch.equal(StyleSummary.from_tensor(s.as_tensor()).as_tensor(), s.as_tensor())
    assert s.as_tensor().shape == (4, 2)


def test_batch_style_of_constant_maps():
    # sample b, channel c is the constant b + c: mu = b + c, sigma = sqrt(eps)
    x = (torch.arange(3).view(3, 1, 1, 1) + torch.arange(2).view(1, 2, 1, 1)).float().expand(3, 2, 4, 4)
    s = batch_style(x, eps=0.0)
    assert torch.allclose(s.mu_mean, torch.tensor([1.0, 2.0]))
    assert torch.allclose(s.mu_var, torch.tensor([2.0 / 3, 2.0 / 3]))
    assert torch.allclose(s.sigma_mean, torch.zeros(2)) and torch.allclose(s.sigma_var, torch.zeros(2))


def test_accumulator_matches_the_summary_of_all_samples_at_once():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 3, 5, 5, generator=g) * torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1) + 2
    acc = StyleAccumulator()
    for part in x.split([3, 4, 3]):
        acc.add(part)
    mu, sigma = channel_stats(x)
    whole = summarize_styles(mu, sigma)
    assert acc.count == 10
    assert torch.allclose(acc.summary().as_tensor(), whole.as_tensor(), atol=1e-5)
    with pytest.raises(ConfigError, match="needs samples"):
        StyleAccumulator().summary()


def test_zero_spread_shift_carries_the_received_statistics_exactly():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 2, 8, 8, generator=g) * 3 + 1
    target = StyleSummary(torch.tensor([5.0, -2.0]), torch.tensor([0.5, 2.0]), torch.zeros(2), torch.zeros(2))
    out = shift_to_style(x, target, noise=True)  # zero variance: the noise vanishes
    mu, sigma = channel_stats(out)
    assert torch.allclose(mu.flatten(1), target.mu_mean.expand(6, 2), atol=1e-4)
    assert torch.allclose(sigma.flatten(1), target.sigma_mean.expand(6, 2), atol=1e-3)


def test_sampled_styles_spread_like_the_received_variance():
    torch.manual_seed(0)
    target = StyleSummary(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([4.0]), torch.tensor([0.01]))
    mu, sigma = sample_styles(target, 20000, torch.zeros(1))
    assert mu.shape == (20000, 1, 1, 1)
    assert mu.mean().item() == pytest.approx(1.0, abs=0.05) and mu.std().item() == pytest.approx(2.0, rel=0.03)
    assert sigma.std().item() == pytest.approx(0.1, rel=0.05)
    centre_mu, centre_sigma = sample_styles(target, 3, torch.zeros(1), noise=False)
    assert centre_mu.flatten().tolist() == [1.0] * 3 and centre_sigma.flatten().tolist() == [2.0] * 3


def test_exploration_by_hand():
    mu = torch.tensor([[1.0], [3.0]]).view(2, 1, 1, 1)
    sigma = torch.tensor([[1.0], [2.0]]).view(2, 1, 1, 1)
    same_mu, same_sigma = explore_styles(mu, sigma, alpha=0.0)
    assert torch.equal(same_mu, mu) and torch.equal(same_sigma, sigma)
    new_mu, new_sigma = explore_styles(mu, sigma, alpha=3.0)
    # batch means 2 and 1.5: each statistic moves 3x its deviation further out
    assert new_mu.flatten().tolist() == [-2.0, 6.0]
    assert new_sigma.flatten().tolist() == pytest.approx([1e-6, 3.5])  # 1 - 3 * 0.5 = -0.5, clamped
    _, literal_sigma = explore_styles(mu, sigma, alpha=3.0, min_sigma=None)
    assert literal_sigma.flatten().tolist() == [-0.5, 3.5]  # the equation's value, not clamped
    centred_mu, _ = explore_styles(mu, sigma, alpha=1.0, center=(torch.zeros(1), torch.zeros(1)))
    assert centred_mu.flatten().tolist() == [2.0, 6.0]
    with pytest.raises(ConfigError, match=">= 0"):
        explore_styles(mu, sigma, alpha=-1.0)


def test_explore_with_alpha_zero_is_the_identity_on_features():
    x = torch.randn(4, 3, 6, 6)
    assert torch.allclose(explore(x, 0.0), x, atol=1e-5)
    out = explore(x, 3.0)
    mu, sigma = channel_stats(x)
    mu_out, _ = channel_stats(out)
    expected = mu + 3.0 * (mu - mu.mean(0, keepdim=True))
    assert torch.allclose(mu_out, expected, atol=1e-4)
