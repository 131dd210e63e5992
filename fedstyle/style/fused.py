"""Chains of style steps on feature statistics, applied as ONE AdaIN.

Exploration, a shift to a received style and MixStyle change only the per-sample, per-channel
statistics (mu, sigma) of a feature map. Applied one after the other, each would re-measure the
statistics the previous one set; the functions here compute the final statistics and restyle once
(:func:`~fedstyle.style.stats.restyle`): the same features up to the 1e-6 inside sigma, one pass over
the map instead of several. Source statistics are detached (as MixStyle's: gradients flow through
the features only).

- :func:`explore_and_mix`: StableFDG's firing stage (Park et al., NeurIPS'23, Section 3.1 steps 4-5).
- :func:`shift_explore_mix`: StyleDDG's StyleShift -> StyleExplore -> MixStyle (Zehtabi et al.,
  MobiHoc'25, Eq. 16-19).

MixStyle's lambda comes from a ``mix_weights(batch, like)`` callable returning (B, 1, 1, 1) weights:
:meth:`~fedstyle.style.mixstyle.MixStyle.sample_mix_weights` or :class:`BetaMixWeights`.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.distributions import Beta

from fedstyle.errors import ConfigError
from fedstyle.style.shift import StyleSummary, explore_styles, sample_styles, summarize_styles
from fedstyle.style.stats import channel_stats, restyle

#: ``mix_weights(batch, like)``: MixStyle's lambda, (batch, 1, 1, 1) on ``like``'s device and dtype
MixWeights = Callable[[int, torch.Tensor], torch.Tensor]
#: ``permutation(n, device)``: MixStyle's random partners, a permutation of range(n)
Permutation = Callable[[int, torch.device], torch.Tensor]


def random_permutation(n: int, device: torch.device) -> torch.Tensor:
    """A uniform permutation of range(n) from torch's global generator of ``device``."""
    return torch.randperm(n, device=device)


class BetaMixWeights:
    """lambda ~ Beta(alpha, alpha) per sample, (B, 1, 1, 1), from ``torch.distributions.Beta`` with its
    parameters on the features' device (made once per device: no copy per step)."""

    def __init__(self, alpha: float):
        self.alpha = float(alpha)
        self._beta: dict[torch.device, Beta] = {}

    def for_device(self, device: torch.device) -> Beta:
        if device not in self._beta:
            c = torch.full((), self.alpha, device=device)
            self._beta[device] = Beta(c, c)
        return self._beta[device]

    def __call__(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        return self.for_device(like.device).sample((batch, 1, 1, 1)).to(like.dtype)


def mix_statistics(own_mu: torch.Tensor, own_sigma: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor,
                   lam: torch.Tensor, perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MixStyle's mixed statistics: lambda * own + (1 - lambda) * other[perm], for mu and for sigma."""
    return lam * own_mu + (1 - lam) * mu[perm], lam * own_sigma + (1 - lam) * sigma[perm]


def explore_and_mix(x: torch.Tensor, start: int | None, alpha: float, *, center_count: int | None = None,
                    min_sigma: float | None = None, mix_weights: MixWeights | None = None,
                    permutation: Permutation = random_permutation, reference: bool = False) -> torch.Tensor:
    """What a firing stage of StableFDG does: exploration of the oversampled part (the samples from
    ``start`` on, Eq. 4-5), mu_new = mu + alpha (mu - mean mu), sigma_new likewise, means over the
    whole batch (``center_count``: over its first ``center_count`` samples, the public code's centre),
    then MixStyle over the whole batch (step 5), as ONE AdaIN.

    ``start=None`` (or B): nothing to explore; ``mix_weights=None``: no MixStyle, and the samples
    before ``start`` stay bit for bit. ``min_sigma`` floors an extrapolated sigma
    (:func:`~fedstyle.style.shift.explore_styles`); None keeps a negative one as Eq. 5 gives it
    (AdaIN's negative scale mirrors the normalised map). ``permutation(n, device)`` draws MixStyle's
    partners (after lambda).

    In sequence, MixStyle would measure an explored sample's statistics as (mu_e, |sigma_e|) (up
    to the 1e-6 inside sigma) and its normalised map as sign(sigma_e) times the original's; so
    the two ops are the single map sign(sigma_e) (x - mu) / sigma * mix(|sigma_e|) + mix(mu_e),
    one pass over the features instead of two (statistics detached, as in both ops).

    ``reference=True`` is the public code's OMA module (oma.py:157-200), which differs in three ways:
    per-sample variances with 1/(HW - 1); mu and sigma normalise the map *with* their gradients (only
    the targets are detached, oma.py:191); and MixStyle mixes the explored statistics as they are,
    a negative sigma_e included (signed; no |sigma_e| and no sign flip), so a sample mixed with a
    negative partner can get any sigma.
    """
    explore = start is not None and start < x.shape[0]
    if not explore and mix_weights is None:
        return x
    mu, sigma = channel_stats(x, unbiased=reference)
    target_mu, target_sigma = mu.detach(), sigma.detach()
    if not reference:
        mu, sigma = target_mu, target_sigma
    if explore:
        centre_mu, centre_sigma = ((target_mu, target_sigma) if center_count is None
                                   else (target_mu[:center_count], target_sigma[:center_count]))
        center = (centre_mu.mean(0, keepdim=True), centre_sigma.mean(0, keepdim=True))
        mu_e, sigma_e = explore_styles(target_mu[start:], target_sigma[start:], alpha, center, min_sigma=min_sigma)
        if mix_weights is None:  # the original part stays bit for bit
            return torch.cat([x[:start], restyle(x[start:], mu[start:], sigma[start:], mu_e, sigma_e)])
        mu_t, sigma_t = torch.cat([target_mu[:start], mu_e]), torch.cat([target_sigma[:start], sigma_e])
    else:
        mu_t, sigma_t = target_mu, target_sigma
    lam = mix_weights(x.shape[0], x)
    perm = permutation(x.shape[0], x.device)
    if reference:
        mu_t, sigma_t = mix_statistics(mu_t, sigma_t, mu_t, sigma_t, lam, perm)
        return restyle(x, mu, sigma, mu_t, sigma_t)
    sign = torch.where(sigma_t < 0, -1.0, 1.0).to(sigma.dtype)
    sigma_t = sigma_t.abs()
    mu_t, sigma_t = mix_statistics(mu_t, sigma_t, mu_t, sigma_t, lam, perm)
    return restyle(x, mu, sigma * sign, mu_t, sigma_t)


def shift_explore_mix(h: torch.Tensor, target: StyleSummary | None, *, shift: bool = True, explore: bool = True,
                      mix_weights: MixWeights | None = None, alpha: float = 3.0, noise: bool = True,
                      own_style: bool = False, explore_center: str = "shifted", mix_from: str = "shifted",
                      min_sigma: float | None = None) -> tuple[torch.Tensor, bool]:
    """StyleDDG's StyleShift -> StyleExplore -> MixStyle (Eq. 16-19) on features ``h`` at one stage, as one
    AdaIN of ``h`` to the final statistics; returns the restyled features and whether a style was shifted to.

    - StyleShift (``shift``, Eq. 16-17): a random half (floor(B/2) samples) takes a style drawn around
      ``target`` (:func:`~fedstyle.style.shift.sample_styles`; ``noise=False``: its mean exactly).
      ``target=None``: no shift, unless ``own_style`` (the batch's own summary as the target).
    - StyleExplore (``explore``, Eq. 18): a random half of the result is extrapolated by ``alpha`` from
      E_b of the StyleShift output (``explore_center="shifted"``) or of the original styles
      (``original``); ``min_sigma`` as in :func:`~fedstyle.style.shift.explore_styles`.
    - MixStyle (``mix_weights`` given, Eq. 19): lambda * own + (1 - lambda) * explored[pi], own = the
      StyleShift output's statistics (``mix_from="shifted"``, Eq. 19 with Eq. 4-5) or the explored
      ones (``explored``, Fig. 1c).

    Random draws, in this order: the shifted half, the noise, the explored half, lambda, pi.
    """
    if explore_center not in ("shifted", "original"):
        raise ConfigError(f"explore_center must be shifted or original, got {explore_center!r}")
    if mix_from not in ("shifted", "explored"):
        raise ConfigError(f"mix_from must be shifted or explored, got {mix_from!r}")
    batch, half = h.shape[0], h.shape[0] // 2
    mu, sigma = channel_stats(h)
    mu, sigma = mu.detach(), sigma.detach()
    new_mu, new_sigma = mu, sigma
    shifted = False
    if shift:  # Eq. 16-17
        if target is None and own_style:
            target = summarize_styles(mu, sigma)
        if target is not None and half > 0:
            idx = torch.randperm(batch, device=h.device)[:half]
            t_mu, t_sigma = sample_styles(target, half, h, noise=noise)
            new_mu, new_sigma = new_mu.index_copy(0, idx, t_mu), new_sigma.index_copy(0, idx, t_sigma)
            shifted = True
    shift_mu, shift_sigma = new_mu, new_sigma
    if explore and half > 0:  # Eq. 18
        ref_mu, ref_sigma = (new_mu, new_sigma) if explore_center == "shifted" else (mu, sigma)
        center = (ref_mu.mean(0, keepdim=True), ref_sigma.mean(0, keepdim=True))
        idx = torch.randperm(batch, device=h.device)[:half]
        e_mu, e_sigma = explore_styles(new_mu[idx], new_sigma[idx], alpha, center, min_sigma=min_sigma)
        new_mu, new_sigma = new_mu.index_copy(0, idx, e_mu), new_sigma.index_copy(0, idx, e_sigma)
    if mix_weights is not None:  # Eq. 19: MixStyle_lambda(x, mu_e[pi], sigma_e[pi]), x the StyleShift output
        lam = mix_weights(batch, h)
        perm = torch.randperm(batch, device=h.device)
        # lambda's operand: mu(x) of the StyleShift output (Eq. 4-5 inside Eq. 19) or mu_e (Fig. 1c)
        own_mu, own_sigma = (shift_mu, shift_sigma) if mix_from == "shifted" else (new_mu, new_sigma)
        new_mu, new_sigma = mix_statistics(own_mu, own_sigma, new_mu, new_sigma, lam, perm)
    return restyle(h, mu, sigma, new_mu, new_sigma), shifted
