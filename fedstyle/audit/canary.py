"""Canary audit (issue 36, section 4): an empirical lower bound on the eps of a defended style release.

The analytic eps of :mod:`fedstyle.style.privacy` is a proof about the code as it is meant to be; the canary
audit measures the code as it runs (Jagielski, Ullman & Oprea, NeurIPS'20, "Auditing differentially private
machine learning: how private is private SGD?"; Nasr, Song, Thakurta, Papernot & Carlini, IEEE S&P'21,
"Adversary instantiation: lower bounds for differentially private machine learning"):

1. **Plant a canary** (:func:`plant_canary`). Replace-one adjacency: the world *with* the canary holds the
   canary image, the world *without* it a replacement image in its place, the other images the same. After
   clipping each contribution has norm <= C, so the two worlds' sums differ by Delta = clip(v_canary) -
   clip(v_replacement), ||Delta|| <= 2C. The pair is searched for the largest ||Delta||: crafted images
   (flat colours, checkerboards, stripes, noise; :func:`crafted_images`) and public images, every pair
   compared after clipping. ``share`` = ||Delta|| / 2C says how close to the worst case the canary came
   (contributions with non-negative coordinates cannot point in opposite directions: share <= 0.71 then).
2. **Release many times** in both worlds, through the surface's own ``release`` (the senders' code path and
   the run's defence: clipping C, noise z), fresh seeded noise each time.
3. **The receiver's best test**: under Gaussian noise on the sums the likelihood ratio of the two worlds is
   monotone in the projection of the release (read back into the space of the sums, :func:`read_sums`) onto
   Delta (Neyman-Pearson); the receiver says "canary in" above a threshold.
4. **From TPR / FPR to eps** (:func:`epsilon_lower_bound`): an (eps, delta)-DP release obeys
   TPR <= e^eps FPR + delta and 1 - FPR <= e^eps FNR + delta for every test, so
   eps >= max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR)). The threshold is chosen on one half
   of the trials, the rates counted on the other half and replaced by their one-sided Clopper-Pearson upper
   bounds (each at 1 - (1 - level) / 2, so that the bound holds with probability ``level``): a valid lower
   bound, never above the true eps but with probability 1 - level.

The bound is limited by the trials: with m trials per world in the counting half even perfect separation
gives only ``ceiling`` = log((1 - delta - u) / u), u = 1 - ((1 - level) / 2)^(1/m) (m = 500: 4.9), and the
analytic eps at delta = 1e-5 is set by tails that a few thousand trials do not reach: an empirical eps well
below the analytic one is expected, one above it means the noise or the accountant is wrong.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
from scipy import stats

from fedstyle.audit.surfaces import Images, Surface
from fedstyle.errors import ConfigError
from fedstyle.style.privacy import clip_rows


def crafted_images(height: int, width: int, seed: int = 0) -> Images:
    """uint8 (K, 3, H, W) images made to have extreme statistics: the 8 corners of the RGB cube and mid grey
    (flat), black/white and complementary-colour checkerboards of period 2, 4 and 8, stripes both ways, and
    uniform noise."""
    corners = torch.tensor([[r, g, b] for r in (0, 255) for g in (0, 255) for b in (0, 255)] + [[128, 128, 128]],
                           dtype=torch.uint8)
    out = [c.view(3, 1, 1).expand(3, height, width) for c in corners]
    yy, xx = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pairs = [(corners[0], corners[7]), (corners[1], corners[6]), (corners[2], corners[5]), (corners[4], corners[3])]
    for period in (2, 4, 8):
        half = period // 2
        for mask in (((yy // half) + (xx // half)) % 2 == 0, (yy // half) % 2 == 0, (xx // half) % 2 == 0):
            for a, b in pairs[: 4 if period == 2 else 1]:
                out.append(torch.where(mask, a.view(3, 1, 1), b.view(3, 1, 1)))
    g = torch.Generator().manual_seed(seed)
    out += list(torch.randint(0, 256, (4, 3, height, width), generator=g, dtype=torch.uint8))
    return torch.stack([o.contiguous() for o in out])


def _clip_of(surface: Surface) -> float:
    return surface.privacy.clip if surface.privacy is not None else 0.0


def plant_canary(surface: Surface, pool: Images, *, crafted: bool = True) -> dict[str, Any]:
    """The (canary, replacement) pair among ``pool`` (and :func:`crafted_images` of its size) whose clipped
    contributions are farthest apart (a set payload: over its ``linear`` coordinates, the ones the receiver reads
    back exactly). Returns ``canary`` and ``replacement`` (uint8 (1, 3, H, W)), ``direction`` Delta (D,) float64 on
    the CPU (every coordinate) and ``share`` ||Delta|| / 2C over the coordinates compared (NaN without clipping)."""
    if pool.dim() != 4 or len(pool) == 0:
        raise ConfigError(f"plant_canary needs a pool of images (N, 3, H, W), got shape {tuple(pool.shape)}")
    candidates = torch.cat([pool, crafted_images(*pool.shape[-2:])]) if crafted else pool
    vectors = clip_rows(surface.image_vectors(candidates).double().cpu(), _clip_of(surface))
    compared = vectors if surface.linear is None else vectors[:, surface.linear.cpu()]
    distance = torch.cdist(compared, compared, compute_mode="donot_use_mm_for_euclid_dist")
    i, j = divmod(int(distance.argmax()), len(candidates))
    if float(distance[i, j]) == 0.0:
        raise ConfigError("every candidate canary has the same contribution: the surface ignores its images")
    clip = _clip_of(surface)
    share = float(distance[i, j]) / (2 * clip) if clip > 0 else math.nan
    return {"canary": candidates[i:i + 1], "replacement": candidates[j:j + 1], "direction": vectors[i] - vectors[j],
            "share": share}


def read_sums(surface: Surface, set_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Release -> the canary's part in the space of the clipped contributions: a per-image payload's first row
    (the canary's, placed first), a set payload's sums (its mean of contributions times the set size)."""
    if surface.per_image:
        return lambda release: release[0].double().cpu()
    return lambda release: surface.set_mean(release).double().cpu() * set_size


def clopper_pearson_upper(errors: np.ndarray | int, trials: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound(s) at confidence ``level`` of a rate seen ``errors`` times in
    ``trials``: the Beta(k + 1, n - k) quantile at ``level`` (1 when k = n)."""
    k = np.asarray(errors, dtype=float)
    safe = np.minimum(k, trials - 1)
    upper = stats.beta.ppf(level, safe + 1, trials - safe)
    return np.where(k >= trials, 1.0, upper)


def _bound(fpr_hi: np.ndarray, fnr_hi: np.ndarray, delta: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(np.maximum(1 - delta - fnr_hi, 0.0) / fpr_hi)
        two = np.log(np.maximum(1 - delta - fpr_hi, 0.0) / fnr_hi)
    return np.maximum(np.maximum(one, two), 0.0)


def separation(scores_in: np.ndarray, scores_out: np.ndarray) -> float:
    """The gap of the mean scores in units of their pooled standard deviation (d'); +-inf when both worlds' scores
    are constant and differ, 0 when they are equal."""
    gap = float(np.mean(scores_in) - np.mean(scores_out))
    spread = math.sqrt((np.var(scores_in, ddof=1) + np.var(scores_out, ddof=1)) / 2)
    if spread > 1e-12 * max(1.0, abs(gap)):
        return gap / spread
    return math.copysign(math.inf, gap) if gap != 0 else 0.0


def epsilon_lower_bound(scores_in, scores_out, delta: float, *, level: float = 0.95, seed: int = 0
                        ) -> dict[str, float]:
    """Empirical eps from membership scores of releases with (``scores_in``) and without (``scores_out``) the
    canary, higher = "in", (trials,) or (trials, K) for K candidate statistics: on a random half of the trials the
    statistic with the largest :func:`separation` and its threshold that maximises the bound (then TPR - FPR), the
    bound from the other half with Clopper-Pearson upper bounds on FPR and FNR (each at 1 - (1 - level) / 2).

    Returns ``epsilon_lb``, ``tpr`` / ``fpr`` (point estimates on the counting half), ``fpr_hi`` / ``fnr_hi``,
    ``threshold``, ``statistic`` (the column chosen), ``trials`` (per world in the counting half) and ``ceiling``
    (the bound perfect separation would give with those trials)."""
    a, b = np.asarray(scores_in, dtype=float), np.asarray(scores_out, dtype=float)
    a, b = (x.reshape(len(x), -1) for x in (a, b))
    if min(len(a), len(b)) < 4 or a.shape[1] != b.shape[1] or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ConfigError("the canary audit needs at least 4 finite scores per world, as many statistics in both "
                          "(use more trials)")
    if not (0.0 < delta < 1.0 and 0.0 < level < 1.0):
        raise ConfigError(f"delta and level must be in (0, 1), got {delta} and {level}")
    rng = np.random.default_rng(seed)
    a, b = a[rng.permutation(len(a))], b[rng.permutation(len(b))]
    pick_a, count_a, pick_b, count_b = a[: len(a) // 2], a[len(a) // 2:], b[: len(b) // 2], b[len(b) // 2:]
    one_sided = 1 - (1 - level) / 2

    def rates(ins: np.ndarray, outs: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fn = np.searchsorted(np.sort(ins), thresholds, side="left")              # in-scores below t
        fp = len(outs) - np.searchsorted(np.sort(outs), thresholds, side="left")  # out-scores at or above t
        return fn, fp

    column = int(np.argmax([separation(pick_a[:, k], pick_b[:, k]) for k in range(a.shape[1])]))
    thresholds = np.unique(np.concatenate([pick_a[:, column], pick_b[:, column], [np.inf]]))
    fn, fp = rates(pick_a[:, column], pick_b[:, column], thresholds)
    bounds = _bound(clopper_pearson_upper(fp, len(pick_b), one_sided),
                    clopper_pearson_upper(fn, len(pick_a), one_sided), delta)
    youden = (1 - fn / len(pick_a)) - fp / len(pick_b)  # ties of the bound (few trials: all 0) by TPR - FPR
    chosen = float(thresholds[int(np.lexsort((youden, bounds))[-1])])
    fn, fp = (int(x[0]) for x in rates(count_a[:, column], count_b[:, column], np.array([chosen])))
    fpr_hi = float(clopper_pearson_upper(fp, len(count_b), one_sided))
    fnr_hi = float(clopper_pearson_upper(fn, len(count_a), one_sided))
    perfect = float(_bound(clopper_pearson_upper(0, len(count_b), one_sided),
                           clopper_pearson_upper(0, len(count_a), one_sided), delta))
    return {"epsilon_lb": float(_bound(np.array(fpr_hi), np.array(fnr_hi), delta)),
            "tpr": 1 - fn / len(count_a), "fpr": fp / len(count_b), "fpr_hi": fpr_hi, "fnr_hi": fnr_hi,
            "threshold": chosen, "statistic": float(column), "trials": float(min(len(count_a), len(count_b))),
            "ceiling": perfect}


def canary_audit(surface: Surface, others: Images, pool: Images, trials: int, *, delta: float | None = None,
                 level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Plant a canary (:func:`plant_canary`) beside ``others`` (the rest of the sender's set, the same in both
    worlds), release ``trials`` times with it and ``trials`` times with the replacement instead, score each
    release by its projection onto Delta and bound eps (:func:`epsilon_lower_bound`). A set payload is scored
    twice, over every coordinate read back and over its ``linear`` ones only (the means: the second moments come
    through variances the senders' code clamps at 0, which noise on a small set hits), and the selection half
    of the trials picks the one with the larger separation.

    ``surface.release`` is the senders' code with the run's defence (a combination of T releases,
    :func:`~fedstyle.audit.surfaces.averaged_surface`, is audited as one); ``delta``: the defence's by default.
    Returns, prefixed ``canary_``: the bound's numbers, ``epsilon`` (the analytic eps of what was released:
    one release, or T composed; inf without noise), ``share`` (||Delta|| / 2C over the coordinates the chosen
    statistic reads), ``separation`` (the measured gap of the two worlds' mean scores of the chosen statistic in
    units of their standard deviation; inf without noise), ``linear_separation`` (the same over the coordinates read
    back linearly: a set payload's means, a per-image row's every coordinate) beside ``expected_separation``
    (||Delta|| sqrt(T) / sigma over those coordinates: what the noise the defence claims gives; it does not apply
    to a statistic over second moments, which come back through clamped variances), ``linear`` (1: the statistic
    over the linear coordinates was chosen)."""
    if int(trials) < 8:
        raise ConfigError(f"the canary audit needs at least 8 trials per world (a few hundred to bound eps), "
                          f"got {trials}")
    privacy = surface.privacy
    delta = float(delta if delta is not None else privacy.delta if privacy is not None else 1e-5)
    planted = plant_canary(surface, pool)
    directions = [planted["direction"]]
    if surface.linear is not None:
        directions.append(planted["direction"] * surface.linear.cpu().double())
    units = torch.stack([d / d.norm() for d in directions], 1)  # (D, K)
    worlds = [torch.cat([planted[name], others]) for name in ("canary", "replacement")]
    read = read_sums(surface, len(worlds[0]))
    scores: list[list[torch.Tensor]] = [[], []]
    for _ in range(int(trials)):
        for world, out in zip(worlds, scores):
            rows = surface.release(world)
            if surface.per_image and len(rows) != len(world):
                raise ConfigError(f"a per-image release of {len(world)} images gave {len(rows)} rows: the canary's "
                                  "row cannot be found")
            out.append(read(rows) @ units)
    a, b = (torch.stack(s).numpy() for s in scores)
    bound = epsilon_lower_bound(a, b, delta, level=level, seed=seed)
    column = int(bound["statistic"])
    noisy = privacy is not None and privacy.noise > 0
    used = float(directions[column].norm())
    # the noise check reads the coordinates that come back linearly in the noisy sums (a set payload's means; a
    # per-image row's every coordinate): there the two worlds' scores are ||Delta|| sqrt(T) / sigma apart in units
    # of their spread. Second moments come back through variances clamped at 0, which noise on a small set hits
    # often, so a statistic over them separates less than that, and no closed form says by how much.
    checked = len(directions) - 1
    clip = _clip_of(surface)
    out = {**bound, "epsilon": privacy.total_epsilon(surface.releases) if noisy else math.inf,
           "share": used / (2 * clip) if clip > 0 else math.nan,
           "separation": separation(a[:, column], b[:, column]) if noisy else math.inf,
           "linear_separation": separation(a[:, checked], b[:, checked]) if noisy else math.inf,
           "expected_separation": (float(directions[checked].norm()) * math.sqrt(surface.releases) / privacy.std
                                   if noisy else math.inf),
           "linear": float(column == 1), "delta": delta, "level": level}
    return {f"canary_{k}": float(v) for k, v in out.items()}


def audit_canary(surface: Surface, sender: Images, public: list[Images], trials: int, seed: int = 0
                 ) -> dict[str, float]:
    """:func:`canary_audit` of a run's surface as ``fedstyle audit privacy --canary N`` does it: the others are
    3 images of a sender (the guarantee holds for every set, so a small one, quick to release, is as good a
    test), the candidate canaries up to 256 public images and the crafted ones."""
    pool = torch.cat(public)
    pool = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:256]]
    others = sender[:3]
    return canary_audit(surface, others, pool, trials, seed=seed)


def canary_line(scores: dict[str, float]) -> str:
    """The report's sentence on a canary audit (``canary_*`` scores), or "" without one."""
    if "canary_epsilon_lb" not in scores:
        return ""
    s = scores
    counted = (f"{int(s['canary_trials'])} releases per world counted, threshold from as many others; "
               f"TPR {s['canary_tpr']:.3f} at FPR {s['canary_fpr']:.3f}; "
               f"{s['canary_ceiling']:.2f} is the most these trials can show")
    share = "" if math.isnan(s["canary_share"]) else f"; the canary moves the sums by {s['canary_share']:.2f} of 2C"
    if math.isinf(s["canary_epsilon"]):
        return (f"canary: no noise, eps >= {s['canary_epsilon_lb']:.2f} empirically ({counted}){share}; "
                "no analytic eps")
    measured = s.get("canary_linear_separation", s["canary_separation"])  # reports written before issue 50
    return (f"canary: eps >= {s['canary_epsilon_lb']:.2f} empirically at delta={s['canary_delta']:g} "
            f"({100 * s['canary_level']:.0f} % Clopper-Pearson; {counted}) vs {s['canary_epsilon']:.3g} analytic "
            f"for the same release{share}, "
            f"separation {measured:.2f} measured vs {s['canary_expected_separation']:.2f} from the claimed noise "
            "on the coordinates read back linearly")


def canary_power(share: float, noise: float, delta: float, trials: int, factors: tuple[float, ...] = (1, 2, 3, 5, 10),
                 *, repeats: int = 100, level: float = 0.95, seed: int = 0) -> dict[float, float]:
    """How often the canary audit catches noise ``f`` times smaller than claimed, for each ``f`` in ``factors``:
    P(the bound > the analytic eps of one release at ``noise`` = z and ``delta``), over ``repeats`` audits of
    ``trials`` releases per world. A canary that moves the (linearly read) release by ``share`` x 2C, under noise of
    std z 2C / f, gives scores N(share f / z, 1) with it and N(0, 1) without (the receiver's projection on Delta),
    so the audits are simulated from those scores through :func:`epsilon_lower_bound`; f = 1 (the claimed noise)
    gives the false alarm rate, below 1 - level. What it does not see: an accountant that over-claims eps by less
    than the gap between the bound (limited by ``trials``) and the true eps."""
    if not (0 < share and 0 < noise and 0 < delta < 1 and int(trials) >= 8 and int(repeats) >= 1):
        raise ConfigError("canary_power needs share > 0, noise > 0, delta in (0, 1), trials >= 8 and repeats >= 1")
    from fedstyle.style.privacy import gaussian_epsilon

    claimed = gaussian_epsilon(noise, delta)
    g = np.random.default_rng(seed)
    power = {}
    for factor in factors:
        gap = share * float(factor) / noise
        caught = sum(epsilon_lower_bound(g.normal(gap, 1.0, int(trials)), g.normal(0.0, 1.0, int(trials)), delta,
                                         level=level, seed=k)["epsilon_lb"] > claimed for k in range(int(repeats)))
        power[float(factor)] = caught / int(repeats)
    return power
