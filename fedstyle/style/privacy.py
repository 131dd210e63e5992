"""A defence for shared styles (issue 24): clipping and Gaussian noise on the statistics, with their (eps, delta).

**What is clipped.** A shared style is formed from sums over a client's images of a per-image
*contribution* vector v_i (float64):

* StableFDG's Phi_n (Eq. 2-3): v_i = [mu_i, mu_i^2, sigma_i, sigma_i^2] (4 per channel), image i's channel statistics at
  ``share_stage`` (:class:`~fedstyle.style.shift.StyleAccumulator`); Phi = means and 1/N variances of the sums;
* CCST's overall style (Eq. 8): v_i = [mean_hw f_i, mean_hw f_i^2] (2 per channel), image i's first and second feature
  moments per channel (:meth:`~fedstyle.style.transfer.feature_adain.FeatureAdaIN.dataset_style`); mu = S_1 / N,
  sigma = sqrt(S_2 / N - mu^2 + eps): the all-pixel moments of Eq. 8, a client's images having one size;
* CCST's single-image styles (Eq. 6-7): v_i = [mu_i, sigma_i] (2 per channel), each of the J drawn images its own "sum".

Each v_i is scaled to L2 norm at most C (``clip``): v_i <- v_i min(1, C / ||v_i||). Replacing one image by
another then moves the sum S = sum_i v_i by ||v_j' - v_j|| <= ||v_j'|| + ||v_j|| <= 2C, whatever the images
and the network: the L2 sensitivity is Delta = 2C by the clipping alone. This needs each v_i to depend on
image i only: the networks run in eval mode (BatchNorm on running statistics), and which images are used
(``style_images``, J) is drawn by index with a seed. Gaussian noise N(0, sigma^2 I), sigma = z Delta (z =
``noise``, the noise multiplier), on every released sum is the Gaussian mechanism; the statistics are formed
from the noisy sums (post-processing: variances clamped at 0, standard deviations at a positive floor).

**Choosing C.** C must not come from the clients' own contributions: a C read off their norms (their
median, say) is itself a function of their images, released without noise, and the eps above does not
cover it. :func:`clip_from_public` picks C as a quantile (default the median, the target of adaptive
clipping, Andrew et al. NeurIPS'21) of the contribution norms of *public* images of the same kind (the
audit's source-validation split: ``fedstyle audit privacy`` prints that value and the share of public
contributions a run's C clips).

**Adjacency: replace-one, the set size N public.** N is no secret here: FedAvg weights each client by its
sample count, sent with every update, and the statistics divide by N. (Add/remove would give Delta = C
but change N, which would then need noise too.) CCST's class-stratified ``style_images`` sample depends on
the labels: for it, neighbours differ in one image's pixels with its label kept.

**What eps covers.** The style releases of one client, the network that computes them taken as given. Not
the run: the weights a client uploads depend on its images too and are not protected (that takes DP-SGD),
and StableFDG's Phi is computed by a network they trained. Subsampling (``style_images``, J, the clients
sampled per round) is not used for amplification: conservative.

**Where the noise comes from** (``source``). Noise only protects against a receiver who cannot predict it.
``os``: OpenDP's Gaussian mechanism (:class:`OSGaussian`: exact discrete-Gaussian sampling on a fine lattice,
from the operating system's entropy, safe against floating-point attacks) — nothing seeded, so the coordinator of
a deployment, who knows the run's config and seed, cannot regenerate and subtract it. ``seeded``: a torch
generator seeded by ``derive_seed(seed, "style-privacy", ...)`` — reproducible, for simulations, where one process
plays every party; anyone with the seed can remove this noise, so it protects nothing across a trust boundary.
``auto`` (the hyperparameter's default) is ``seeded`` in ``fedstyle run`` (the simulators; the run's
config.json records the choice) and ``os`` everywhere else: ``fedstyle deploy`` writes ``os``, and a
Flower site outside the simulation engine uses ``os`` whatever the config it receives says (the config
comes from the coordinator).

**Accounting.** One release: :func:`gaussian_epsilon` (analytic Gaussian mechanism, Balle & Wang ICML'18,
Thm 8). T releases (StableFDG, each round the client is sampled): :func:`composed_epsilon` (Renyi DP,
Mironov CSF'17, Prop. 7 + Props. 1, 3); :meth:`StylePrivacy.total_epsilon` also takes the exact composition
of Gaussian mechanisms (Gaussian DP, Dong, Roth & Su JRSS-B'22, Cor. 3.3: T releases at z compose to one at
z / sqrt(T)) and reports the smaller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import log_ndtr

from fedstyle.errors import ConfigError
from fedstyle.seeding import derive_seed

#: ctx.state key counting a client's releases of a defended style (checkpointed with the client state)
_RELEASES = "style_privacy/releases"
#: where the noise of a defended style comes from (see the module docstring); ``auto`` is resolved by the runtime
NOISE_SOURCES = ("auto", "os", "seeded")


class OSGaussian:
    """The Gaussian mechanism of a deployment, sampled by OpenDP (``opendp``, the ``privacy`` extra, part of
    ``flower``): ``release(sums, std)`` is ``sums`` + N(0, std^2) on every element, drawn from the operating system's
    entropy with no seed. OpenDP rounds the input to a lattice of step 2^k, adds *discrete* Gaussian noise sampled
    exactly (Canonne, Kamath & Steinke, NeurIPS'20) and rounds the result to the nearest float64, so the set of
    possible outputs does not depend on the input: the floating-point attacks on textbook samplers (Box-Muller or
    inverse-CDF on floats; Mironov, CCS'12) do not apply. Written on OpenDP rather than by hand, since exact
    sampling is the hard part (the library's proof documents cover it)."""

    @staticmethod
    def mechanism(size: int, std: float):
        """OpenDP's measurement adding N(0, std^2) to a float64 vector of ``size`` (L2 input metric)."""
        try:
            import opendp.prelude as dp
        except ImportError:  # an extra: 47 MB of compiled Rust that a simulation never needs
            raise ConfigError("the style defence's noise from the OS (dp_noise_source=os, a deployment's) is sampled "
                              "by OpenDP, which is not installed: pip install -c constraints.txt 'fedstyle[privacy]' "
                              "(or run a simulation, whose noise is seeded)") from None
        dp.enable_features("contrib")
        space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=int(size)), dp.l2_distance(T=float)
        return space >> dp.m.then_gaussian(scale=float(std))

    def release(self, sums: torch.Tensor, std: float) -> torch.Tensor:
        """``sums`` (any shape; float64 on the CPU for OpenDP) with N(0, std^2) added to every element, on
        ``sums``'s device."""
        flat = sums.detach().to("cpu", torch.float64).reshape(-1)
        if not bool(torch.isfinite(flat).all()):
            raise ConfigError("a style statistic to release is NaN or infinite: the network produced non-finite "
                              "features; nothing was sent")
        noisy = self.mechanism(flat.numel(), std)(flat.tolist())
        return torch.tensor(noisy, dtype=torch.float64).reshape(sums.shape).to(sums.device)


def _check(noise_multiplier: float, delta: float) -> None:
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ConfigError(f"the noise multiplier must be a finite number >= 0, got {noise_multiplier}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}; 1e-5 is usual (below 1 / the images of a client)")


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """eps of one release of the Gaussian mechanism with sigma = z Delta, at ``delta`` (analytic Gaussian
    mechanism, Balle & Wang ICML'18, Theorem 8): the smallest eps >= 0 with

        delta(eps) = Phi(1 / (2z) - eps z) - e^eps Phi(-1 / (2z) - eps z) <= delta,

    by bisection (delta(eps) falls with eps), in log space (scipy's log_ndtr). z = 0 (no noise): inf."""
    z = float(noise_multiplier)
    _check(z, delta)
    if z == 0.0:
        return math.inf

    def profile(eps: float) -> float:  # Phi(a) (1 - e^eps Phi(b) / Phi(a)), accurate when both terms are tiny
        log_a, log_b = log_ndtr(0.5 / z - eps * z), log_ndtr(-0.5 / z - eps * z)
        return float(np.exp(log_a) * -np.expm1(min(0.0, eps + log_b - log_a)))

    if profile(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while profile(hi) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if profile(mid) > delta else (lo, mid)
    return hi


def composed_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """eps of ``releases`` = T Gaussian releases at noise multiplier z, by Renyi DP: each is
    (alpha, alpha / (2 z^2))-RDP (Mironov CSF'17, Prop. 7), T of them (alpha, T alpha / (2 z^2))-RDP (Prop. 1), and
    eps = min over alpha > 1 of T alpha / (2 z^2) + log(1 / delta) / (alpha - 1) (Prop. 3), attained at
    alpha = 1 + z sqrt(2 log(1/delta) / T): eps = T / (2 z^2) + sqrt(2 T log(1/delta)) / z. No subsampling
    amplification (conservative). T = 0: 0; z = 0: inf."""
    z, t = float(noise_multiplier), int(releases)
    _check(z, delta)
    if t < 0:
        raise ConfigError(f"the number of releases must be >= 0, got {releases}")
    if t == 0:
        return 0.0
    if z == 0.0:
        return math.inf
    return t / (2.0 * z * z) + math.sqrt(2.0 * t * math.log(1.0 / delta)) / z


def clip_factors(rows: torch.Tensor, clip: float) -> torch.Tensor:
    """(B, 1) factors min(1, C / ||row||) that scale each row of ``rows`` (B, D) to L2 norm at most C = ``clip``
    (exactly 1.0 for a row already within C, so such a row is unchanged bit for bit)."""
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    return (float(clip) / norms).clamp(max=1.0)  # norm 0: inf -> 1


def clip_rows(rows: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row of ``rows`` (B, D) scaled to L2 norm at most ``clip`` (0: unchanged)."""
    return rows * clip_factors(rows, clip) if clip > 0 else rows


def clip_from_public(norms: torch.Tensor, quantile: float = 0.5) -> float:
    """C = the ``quantile`` of ``norms``, the L2 norms of per-image contributions computed on *public* images
    (never the clients': see "Choosing C" above). The median clips half of the contributions a little and
    bounds the rest's influence at C; a higher quantile keeps more signal and needs more noise for the same eps."""
    values = torch.as_tensor(norms, dtype=torch.float64).reshape(-1)
    if values.numel() == 0 or not torch.isfinite(values).all() or (values < 0).any():
        raise ConfigError("clip_from_public needs the finite, non-negative contribution norms of public images "
                          "(at least one); compute them on the public split, not on the clients' data")
    if not 0.0 < quantile <= 1.0:
        raise ConfigError(f"quantile must be in (0, 1], got {quantile}; 0.5 (the median) is usual")
    clip = float(torch.quantile(values, float(quantile)))
    if clip <= 0:
        raise ConfigError("the public contributions' norms are 0 at that quantile, so C would be 0; use a higher "
                          "quantile or public images that are not blank")
    return clip


@dataclass(frozen=True)
class StylePrivacy:
    """The defence's settings: ``clip`` C (0: no clipping), ``noise`` multiplier z (0: no noise), ``delta``.

    Noise without clipping is refused (the sensitivity is unbounded). Clipping alone is allowed (it bounds
    what one image can do to the statistics) but gives no (eps, delta)."""

    clip: float = 0.0
    noise: float = 0.0
    delta: float = 1e-5
    #: ``os`` or ``seeded`` (``auto`` is taken as ``os``: the safe reading when no runtime resolved it)
    source: str = "os"

    def __post_init__(self) -> None:
        if self.source not in NOISE_SOURCES:
            raise ConfigError(f"dp_noise_source must be one of {', '.join(NOISE_SOURCES)}, got {self.source!r}")
        if self.source == "auto":
            object.__setattr__(self, "source", "os")
        for name, value in (("dp_clip", self.clip), ("dp_noise", self.noise)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0 (0 = off), got {value}")
        if not 0.0 < self.delta < 1.0:
            raise ConfigError(f"dp_delta must be in (0, 1), got {self.delta}; 1e-5 is usual")
        if self.noise > 0 and self.clip == 0:
            raise ConfigError(f"dp_noise={self.noise:g} without clipping: the statistics' sensitivity is unbounded, "
                              "so noise gives no guarantee; set dp_clip=C > 0 too (each image's contribution is "
                              "clipped to L2 norm C), or dp_noise=0")

    @property
    def enabled(self) -> bool:
        return self.clip > 0 or self.noise > 0

    @property
    def sensitivity(self) -> float:
        """Delta = 2C, the L2 sensitivity of the clipped sums under replace-one adjacency."""
        return 2.0 * self.clip

    @property
    def std(self) -> float:
        """sigma = z Delta, the standard deviation of the noise on every released sum."""
        return self.noise * self.sensitivity

    def epsilon(self) -> float:
        """eps of one release (:func:`gaussian_epsilon`); inf without noise."""
        return gaussian_epsilon(self.noise, self.delta)

    def total_epsilon(self, releases: int) -> float:
        """eps of ``releases`` releases: the smaller of the RDP bound (:func:`composed_epsilon`) and the exact
        composition of Gaussian mechanisms (GDP: :func:`gaussian_epsilon` at z / sqrt(T))."""
        if releases <= 0:
            return 0.0
        if self.noise == 0:
            return math.inf
        return min(composed_epsilon(self.noise, releases, self.delta),
                   gaussian_epsilon(self.noise / math.sqrt(releases), self.delta))

    def describe(self, releases: int = 1) -> str:
        if not self.enabled:
            return "style privacy off"
        if self.noise == 0:
            return f"styles clipped at C={self.clip:g}, no noise: no (eps, delta) guarantee"
        origin = ("from the OS CSPRNG, by OpenDP" if self.source == "os"
                  else "seeded (reproducible: the seed removes it)")
        text = (f"styles clipped at C={self.clip:g}, Gaussian noise z={self.noise:g} (sigma={self.std:g}, {origin}): "
                f"eps={self.epsilon():.4g} per release at delta={self.delta:g}")
        if releases > 1:
            text += f", {self.total_epsilon(releases):.4g} over {releases} releases"
        return text

    def recipe(self) -> dict[str, float | str]:
        """What changes the released style (cache keys): C, z and, with noise, its source; delta only changes
        the accounting. (A cached OS-noised release is sent again as it is: no new release, nothing more learnt.)"""
        out: dict[str, float | str] = {"clip": float(self.clip), "noise": float(self.noise)}
        if self.noise > 0 and self.source != "seeded":  # seeded keys stay what they were
            out["source"] = self.source
        return out

    def generator(self, seed: int, *parts: int | str) -> torch.Generator | OSGaussian:
        """Where the noise is drawn from: ``seeded``, a torch generator seeded by ``derive_seed(seed,
        "style-privacy", *parts)`` (reproducible simulations); ``os``, OpenDP's exact sampler on the OS's entropy
        (:class:`OSGaussian`; seed and parts unused)."""
        if self.source == "os":
            return OSGaussian()
        return torch.Generator().manual_seed(derive_seed(seed, "style-privacy", *parts))

    def perturb(self, sums: torch.Tensor, generator: torch.Generator | OSGaussian) -> torch.Tensor:
        """``sums`` + N(0, sigma^2) on every element, in float64: ``os``, OpenDP's mechanism on the sums
        themselves (:class:`OSGaussian`); ``seeded``, torch's normal draws from ``generator`` on the CPU (the noise
        does not depend on the device) added to the sums. Unchanged without noise."""
        if self.noise == 0:
            return sums
        if isinstance(generator, OSGaussian):
            return generator.release(sums, self.std)
        noise = torch.randn(sums.shape, generator=generator, dtype=torch.float64)
        return sums.to(torch.float64) + (noise * self.std).to(sums.device)

    def metrics(self, releases: int) -> dict[str, float]:
        """``dp_epsilon`` (one release), ``dp_epsilon_total`` (``releases`` releases) and ``dp_releases`` for the
        round's metrics; {} without noise or releases."""
        if self.noise == 0 or releases <= 0:
            return {}
        return {"dp_epsilon": self.epsilon(), "dp_epsilon_total": self.total_epsilon(releases),
                "dp_releases": float(releases)}


def count_release(state: dict[str, torch.Tensor], privacy: StylePrivacy) -> None:
    """One more defended release of this client (kept in its persistent ``ctx.state``)."""
    if privacy.enabled:
        state[_RELEASES] = torch.tensor(float(state.get(_RELEASES, 0.0)) + 1.0, dtype=torch.float64)


def release_count(state: dict[str, torch.Tensor]) -> int:
    """This client's defended releases so far (:func:`count_release`; 0 when it has made none)."""
    return int(float(state.get(_RELEASES, 0.0)))


def release_metrics(state: dict[str, torch.Tensor], privacy: StylePrivacy) -> dict[str, float]:
    """:meth:`StylePrivacy.metrics` of this client's releases so far (:func:`count_release`)."""
    return privacy.metrics(release_count(state))
