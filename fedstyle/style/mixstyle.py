"""MixStyle (Zhou et al., ICLR'21): mix feature statistics between samples of a batch."""

from __future__ import annotations

import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.style.stats import channel_stats, restyle


def check_probability(p: float, name: str = "p") -> float:
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"{name} must be a probability in [0, 1], got {p}")
    return float(p)


def fires(p: float) -> bool:
    """One Bernoulli(p) draw from torch's global CPU generator.

    Drawn on the CPU so that deciding whether an op runs never synchronises with an accelerator;
    ``torch.manual_seed`` seeds this generator together with the device ones.
    """
    if p >= 1.0:
        return True
    if p <= 0.0:
        return False
    return bool(torch.rand(()) < p)


class MixStyle(nn.Module):
    """MixStyle at one stage; identity in eval mode.

    With probability ``p`` per forward call (training only): lambda ~ Beta(alpha, alpha) per sample,
    a random permutation ``perm`` of the batch, and

        mu_mix = lambda * mu + (1 - lambda) * mu[perm],  sigma_mix likewise,
        out = sigma_mix * (x - mu) / sigma + mu_mix,

    with (mu, sigma) detached from the graph as in the paper (gradients flow through x only).
    sigma uses the 1/HW variance of the paper's equations; ``unbiased=True`` reproduces the
    authors' code (``torch.var`` default, 1/(HW - 1)). The random permutation is the paper's
    "random" mixing; samples are drawn from torch's global generator of ``x``'s device.
    """

    label = "MixStyle"

    def __init__(self, p: float = 0.5, alpha: float = 0.1, eps: float = 1e-6, unbiased: bool = False):
        super().__init__()
        self.p = check_probability(p)
        if alpha <= 0:
            raise ConfigError(f"MixStyle alpha must be > 0 (Beta concentration), got {alpha}")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.unbiased = unbiased

    def extra_repr(self) -> str:
        return f"p={self.p}, alpha={self.alpha}, eps={self.eps}, unbiased={self.unbiased}"

    def sample_mix_weights(self, batch_size: int, like: torch.Tensor) -> torch.Tensor:
        """lambda ~ Beta(alpha, alpha), shape (B, 1, 1, 1), on ``like``'s device and dtype.

        Drawn as G1 / (G1 + G2) with G ~ Gamma(alpha) sampled on the device: no host
        synchronisation (``torch.distributions.Beta`` validates its arguments with a host check,
        and a fresh device tensor per call is a blocking copy on CUDA).
        """
        concentration = torch.full((2, batch_size, 1, 1, 1), self.alpha, device=like.device, dtype=torch.float32)
        gammas = torch._standard_gamma(concentration)
        lam = gammas[0] / (gammas[0] + gammas[1]).clamp_min(torch.finfo(torch.float32).tiny)
        return lam.to(like.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not fires(self.p):
            return x
        batch = x.shape[0]
        mu, sigma = channel_stats(x, eps=self.eps, unbiased=self.unbiased)
        mu, sigma = mu.detach(), sigma.detach()
        lam = self.sample_mix_weights(batch, x)
        perm = torch.randperm(batch, device=x.device)
        return mix_styles(x, mu, sigma, mu[perm], sigma[perm], lam)


def mix_styles(x: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor, mu_other: torch.Tensor,
               sigma_other: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """MixStyle's transfer (Zhou et al. ICLR'21, Eq. 3-5) of ``x``, whose statistics are (``mu``, ``sigma``), towards
    other statistics: ``mu_mix = lam * mu + (1 - lam) * mu_other`` (``sigma_mix`` likewise), then
    ``sigma_mix * (x - mu) / sigma + mu_mix``. All statistics broadcast against (B, C, 1, 1): the batch's own,
    permuted (:class:`MixStyle`), or ones shared by other clients (FedCCRL's cross-client domain transfer)."""
    mu_mix = lam * mu + (1 - lam) * mu_other
    sigma_mix = lam * sigma + (1 - lam) * sigma_other
    return restyle(x, mu, sigma, mu_mix, sigma_mix)
