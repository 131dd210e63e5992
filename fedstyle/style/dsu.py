"""DSU (Li et al., ICLR'22): domain shifts with uncertainty, i.e. Gaussian noise on feature statistics."""

from __future__ import annotations

import torch
from torch import nn

from fedstyle.style.mixstyle import check_probability, fires
from fedstyle.style.stats import channel_stats, restyle


class DSU(nn.Module):
    """DSU at one stage; identity in eval mode.

    With probability ``p`` per forward call (training only), with per-sample statistics
    mu, sigma = sqrt(unbiased var over H x W + eps):

        Sigma_mu = sqrt(Var_batch(mu) + eps),  Sigma_sigma = sqrt(Var_batch(sigma) + eps)  (per channel)
        beta = mu + N(0, 1) * Sigma_mu,  gamma = sigma + N(0, 1) * Sigma_sigma           (noise per element)
        out = gamma * (x - mu) / sigma + beta

    Nothing is detached, as in the reference code. The variances are unbiased, so a batch of one
    sample, or a map of one position (a 1 x 1 last stage on small inputs), has no spread to estimate
    and passes through unchanged (the reference code's output is NaN there).
    """

    label = "DSU"

    def __init__(self, p: float = 0.5, eps: float = 1e-6):
        super().__init__()
        self.p = check_probability(p)
        self.eps = float(eps)

    def extra_repr(self) -> str:
        return f"p={self.p}, eps={self.eps}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or x.shape[0] < 2 or x.shape[2] * x.shape[3] < 2 or not fires(self.p):
            return x
        mu, sigma = channel_stats(x, eps=self.eps, unbiased=True)
        spread_mu = (mu.var(dim=0, keepdim=True) + self.eps).sqrt()
        spread_sigma = (sigma.var(dim=0, keepdim=True) + self.eps).sqrt()
        beta = mu + torch.randn_like(mu) * spread_mu
        gamma = sigma + torch.randn_like(sigma) * spread_sigma
        return restyle(x, mu, sigma, beta, gamma)
