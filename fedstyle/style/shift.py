"""Style summaries, shifts to a received style, and style exploration — the feature-level ops that
StableFDG (Park et al., NeurIPS'23) and StyleDDG share.

Notation (methods notes): for features x (B, C, H, W), mu and sigma are the per-sample, per-channel
statistics of :func:`~fedstyle.style.stats.channel_stats`. A **style summary** of a set of samples is
four per-channel vectors (4 x C numbers)::

    mu_bar = mean_b mu_b,  sigma_bar = mean_b sigma_b,
    var_mu = mean_b (mu_b - mu_bar)^2,  var_sigma = mean_b (sigma_b - sigma_bar)^2

— StableFDG's Phi_n over a client's whole dataset (Eq. 2–3) and StyleDDG's psi_i over a mini-batch
(Eq. 15). Variances divide by the count (the papers' 1/|D| and 1/B); ``unbiased=True`` divides by
count - 1. Everything is a tensor op on the features' device: no host synchronisation, no NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from fedstyle.errors import ConfigError
from fedstyle.style.privacy import StylePrivacy, clip_factors
from fedstyle.style.stats import channel_stats, restyle

_FIELDS = ("mu_mean", "sigma_mean", "mu_var", "sigma_var")


@dataclass
class StyleSummary:
    """Per-channel centre and spread of a set of styles: four (C,) tensors."""

    mu_mean: torch.Tensor
    sigma_mean: torch.Tensor
    mu_var: torch.Tensor
    sigma_var: torch.Tensor

    @property
    def channels(self) -> int:
        return int(self.mu_mean.shape[0])

    def as_tensor(self) -> torch.Tensor:
        """(4, C): rows mu_mean, sigma_mean, mu_var, sigma_var (the order of StableFDG's Eq. 3)."""
        return torch.stack([self.mu_mean, self.sigma_mean, self.mu_var, self.sigma_var])

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "StyleSummary":
        if t.dim() != 2 or t.shape[0] != 4:
            raise ConfigError(f"a style summary is a (4, C) tensor, got shape {tuple(t.shape)}")
        return cls(*t.unbind(0))

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "StyleSummary":
        return StyleSummary(*(getattr(self, f).to(device=device, dtype=dtype) for f in _FIELDS))


def summarize_styles(mu: torch.Tensor, sigma: torch.Tensor, unbiased: bool = False) -> StyleSummary:
    """The style summary of per-sample statistics ``mu``, ``sigma`` ((B, C) or (B, C, 1, 1))."""
    mu, sigma = mu.reshape(mu.shape[0], -1), sigma.reshape(sigma.shape[0], -1)
    if mu.shape[0] < (2 if unbiased else 1):
        raise ConfigError(f"a style summary needs at least {2 if unbiased else 1} samples, got {mu.shape[0]}")
    var_mu, mean_mu = torch.var_mean(mu, dim=0, correction=1 if unbiased else 0)
    var_sigma, mean_sigma = torch.var_mean(sigma, dim=0, correction=1 if unbiased else 0)
    return StyleSummary(mean_mu, mean_sigma, var_mu, var_sigma)


def batch_style(x: torch.Tensor, eps: float = 1e-6, unbiased: bool = False) -> StyleSummary:
    """The style summary of a batch of feature maps (StyleDDG Eq. 15)."""
    mu, sigma = channel_stats(x, eps=eps)
    return summarize_styles(mu, sigma, unbiased=unbiased)


class StyleAccumulator:
    """The style summary of a dataset seen batch by batch (StableFDG Eq. 2–3 over a client's data).

    Keeps float64 per-channel sums of mu, mu^2, sigma, sigma^2 on the features' device. ``clip`` = C > 0
    (the defence of :mod:`fedstyle.style.privacy`): each sample's contribution [mu, mu^2, sigma, sigma^2]
    (4 numbers a channel) is scaled to L2 norm at most C before it joins the sums, so that one sample moves them by
    at most 2C; :meth:`privatize` adds the Gaussian noise.
    """

    def __init__(self, clip: float = 0.0) -> None:
        self.count = 0
        self.clip = float(clip)
        self._sums: torch.Tensor | None = None  # (4, C): sum mu, sum mu^2, sum sigma, sum sigma^2
        self._sigma_floor: float | None = None  # set by privatize: noisy sums can give sigma_mean <= 0
        self._eps = 1e-6

    def add(self, x: torch.Tensor, eps: float = 1e-6, unbiased: bool = False) -> None:
        """Adds every sample of the feature maps ``x``; ``unbiased``: per-sample variances over H x W with
        1/(HW - 1) (the public StableFDG code's ``x.var``)."""
        mu, sigma = channel_stats(x, eps=eps, unbiased=unbiased)
        mu, sigma = mu.flatten(1).double(), sigma.flatten(1).double()
        mu2, sigma2 = mu * mu, sigma * sigma
        if self.clip > 0:
            scale = clip_factors(torch.cat([mu, mu2, sigma, sigma2], 1), self.clip)
            mu, mu2, sigma, sigma2 = mu * scale, mu2 * scale, sigma * scale, sigma2 * scale
        sums = torch.stack([mu.sum(0), mu2.sum(0), sigma.sum(0), sigma2.sum(0)])
        self._sums = sums if self._sums is None else self._sums + sums
        self.count += int(x.shape[0])
        self._eps = eps

    def privatize(self, privacy: StylePrivacy, generator: torch.Generator) -> None:
        """Gaussian noise N(0, (z 2C)^2) on every sum (the count N stays: public), as ``privacy`` says; the
        summary's sigma_mean is then floored at sqrt(eps), the smallest sigma a feature map has."""
        if self._sums is not None and privacy.noise > 0:
            self._sums = privacy.perturb(self._sums, generator)
            self._sigma_floor = math.sqrt(self._eps)

    def summary(self, unbiased: bool = False, spread_eps: float = 0.0) -> StyleSummary:
        """Means and variances of the per-sample statistics; ``unbiased``: variances over the samples with
        1/(N - 1); ``spread_eps`` is added to both variances (the public StableFDG code's spread is
        sqrt(var + 1e-6), trainer.py:721)."""
        if self._sums is None or self.count < (2 if unbiased else 1):
            raise ConfigError("a style summary needs samples; the client has none")
        n = float(self.count)
        s_mu, s_mu2, s_sigma, s_sigma2 = self._sums
        mean_mu, mean_sigma = s_mu / n, s_sigma / n
        denom = n - 1 if unbiased else n
        var_mu = ((s_mu2 - n * mean_mu * mean_mu) / denom).clamp_min(0)
        var_sigma = ((s_sigma2 - n * mean_sigma * mean_sigma) / denom).clamp_min(0)
        if self._sigma_floor is not None:
            mean_sigma = mean_sigma.clamp_min(self._sigma_floor)
        var_mu, var_sigma = var_mu + spread_eps, var_sigma + spread_eps
        return StyleSummary(*(t.float() for t in (mean_mu, mean_sigma, var_mu, var_sigma)))


#: ``normal(shape, like)``: standard normal draws of ``shape`` on ``like``'s device and dtype
Normal = Callable[[tuple, torch.Tensor], torch.Tensor]


def standard_normal(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """N(0, 1) of ``shape`` from torch's global generator of ``like``'s device."""
    return torch.randn(shape, device=like.device, dtype=like.dtype)


def sample_styles(summary: StyleSummary, count: int, like: torch.Tensor, noise: bool = True,
                  normal: Normal = standard_normal, sigma_floor: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` styles drawn around a received summary, each (count, C, 1, 1) on ``like``'s device:

        mu' = mu_bar + eps_mu * sqrt(var_mu),  sigma' = sigma_bar + eps_sigma * sqrt(var_sigma),
        eps ~ N(0, 1) per sample and channel

    (StableFDG Section 3.1 step 2: eps ~ N(0, Sigma_n'); StyleDDG Eq. 17 with DSU's per-element
    noise). ``noise=False`` gives the centre itself. sigma' is clamped at ``sigma_floor`` (1e-6) so that
    a large negative draw cannot flip a feature map's sign (the public StableFDG code clamps at 0,
    style_insert.py:64). ``normal(shape, like)`` draws the noise, eps_mu first (tests force draws through it).
    """
    s = summary.to(like.device, like.dtype)
    shape = (count, s.channels, 1, 1)
    mu = s.mu_mean.view(1, -1, 1, 1).expand(shape)
    sigma = s.sigma_mean.view(1, -1, 1, 1).expand(shape)
    if noise:
        mu = mu + normal(shape, like) * s.mu_var.clamp_min(0).sqrt().view(1, -1, 1, 1)
        sigma = sigma + normal(shape, like) * s.sigma_var.clamp_min(0).sqrt().view(1, -1, 1, 1)
    return mu, sigma.clamp_min(sigma_floor)


def shift_to_style(x: torch.Tensor, summary: StyleSummary, noise: bool = True, eps: float = 1e-6,
                   detach_stats: bool = True) -> torch.Tensor:
    """AdaIN of every sample of ``x`` to a style drawn around ``summary`` (:func:`sample_styles`).

    The source statistics are detached (as MixStyle's: gradients flow through x) unless
    ``detach_stats=False``.
    """
    mu, sigma = channel_stats(x, eps=eps)
    if detach_stats:
        mu, sigma = mu.detach(), sigma.detach()
    mu_t, sigma_t = sample_styles(summary, x.shape[0], x, noise=noise)
    return restyle(x, mu, sigma, mu_t, sigma_t)


def explore_styles(mu: torch.Tensor, sigma: torch.Tensor, alpha: float,
                   center: tuple[torch.Tensor, torch.Tensor] | None = None,
                   min_sigma: float | None = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Extrapolate styles away from their batch mean (StableFDG step 3, StyleDDG Eq. 18):

        mu_new = mu + alpha (mu - mean_b mu),  sigma_new = sigma + alpha (sigma - mean_b sigma)

    ``center`` = (mean mu, mean sigma) to extrapolate from instead of the batch's own means (the
    public StableFDG code uses the original batch's). alpha = 0 is the identity. Extrapolating a
    small sigma can cross zero: sigma_new is clamped at ``min_sigma`` (1e-6; AdaIN then flattens the
    map to its new mean); ``min_sigma=None`` keeps the equation's value, and AdaIN to a negative
    sigma inverts the map's contrast around its new mean.
    """
    if alpha < 0:
        raise ConfigError(f"the exploration alpha must be >= 0, got {alpha}")
    if center is None:
        center = (mu.mean(0, keepdim=True), sigma.mean(0, keepdim=True))
    mu_new = mu + alpha * (mu - center[0])
    sigma_new = sigma + alpha * (sigma - center[1])
    return mu_new, (sigma_new if min_sigma is None else sigma_new.clamp_min(min_sigma))


def explore(x: torch.Tensor, alpha: float, eps: float = 1e-6,
            center: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """AdaIN of ``x`` to its explored styles (:func:`explore_styles`), statistics detached."""
    mu, sigma = channel_stats(x, eps=eps)
    mu, sigma = mu.detach(), sigma.detach()
    mu_new, sigma_new = explore_styles(mu, sigma, alpha, center)
    return restyle(x, mu, sigma, mu_new, sigma_new)
