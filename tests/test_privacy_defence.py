"""Tests that catch a broken style defence (issue 50, section 5), each written against a named mutation that the
other tests let through (tests/privacy_mutations.py applies them and shows each fails here):

- N1: CCST's per-image styles clipped *after* the noise; N14: the overall style's second moments summed unclipped
  (no noisy CCST test had a clip that binds): a noisy release with a binding clip, computed by hand;
- N7c: the OS noise replaced by a fixed-seed process-wide generator: two fresh processes draw different noise;
- N8b: half the OS noise a copy of the other half (Box-Muller's sine half duplicated from its cosine half, when
  the sampler was Box-Muller): no correlation between coordinates i and i + n/2;
- N4b: the canary audit's threshold (or statistic) chosen on the half that counts the rates: the choice depends on
  the selection half only, and the bound stays valid over many audits of a release with no canary effect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import fedstyle
from fedstyle.audit.canary import epsilon_lower_bound
from fedstyle.seeding import derive_seed
from fedstyle.style.privacy import OSGaussian, StylePrivacy
from fedstyle.style.transfer.feature_adain import ADAIN_EPS

from test_style_privacy import PixelAdaIN, images


def _seeded_noise(shape, seed, *parts) -> torch.Tensor:
    """The seeded defence's standard normals, drawn here as the module docstring says they are drawn."""
    g = torch.Generator().manual_seed(derive_seed(seed, "style-privacy", *parts))
    return torch.randn(shape, generator=g, dtype=torch.float64)


def test_ccst_per_image_styles_are_clipped_then_noised():
    backend, batch = PixelAdaIN(), images(n=12)
    singles = backend.image_styles(batch)
    rows = torch.cat([singles.tensors["mean"], singles.tensors["std"]], 1).double()  # [mu, sigma] of 3 channels
    clip, z = 0.1, 0.5
    norms = rows.norm(dim=1, keepdim=True)
    assert bool((norms > 2 * clip).all())  # the clip binds on every row
    privacy = StylePrivacy(clip=clip, noise=z, source="seeded")
    released = backend.private_styles(singles, privacy, privacy.generator(3, "ccst"))
    by_hand = rows * (clip / norms) + _seeded_noise(rows.shape, 3, "ccst") * (z * 2 * clip)
    # the released style is float32 (what travels): its rounding is the tolerance
    torch.testing.assert_close(released.tensors["mean"].double(), by_hand[:, :3], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(released.tensors["std"].double(), by_hand[:, 3:].clamp_min(ADAIN_EPS ** 0.5),
                               rtol=1e-6, atol=1e-7)


def test_ccst_overall_style_sums_clipped_moments_then_noises_them():
    backend, batch = PixelAdaIN(), images(n=20)
    clip, z = 0.1, 0.05
    features = backend.encode(batch).double()
    first, second = features.mean(dim=(2, 3)), features.square().mean(dim=(2, 3))  # (N, 3) each
    scale = (clip / torch.cat([first, second], 1).norm(dim=1, keepdim=True)).clamp(max=1.0)
    assert bool((scale < 0.5).all())  # the clip binds on every image, on both moments
    sums = torch.stack([(first * scale).sum(0), (second * scale).sum(0)]) + _seeded_noise((2, 3), 5, "ccst") * (
        z * 2 * clip)
    mean = sums[0] / len(batch)
    var = sums[1] / len(batch) - mean.square()
    assert bool((var > 0).all())  # not clamped: the hand value is the formula's
    privacy = StylePrivacy(clip=clip, noise=z, source="seeded")
    released = backend.dataset_style([batch[:8], batch[8:]], privacy=privacy, generator=privacy.generator(5, "ccst"))
    torch.testing.assert_close(released.tensors["mean"].double(), mean[None], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(released.tensors["std"].double(), (var + ADAIN_EPS).sqrt()[None], rtol=1e-6,
                               atol=1e-7)


_DRAW = ("import json, numpy, torch; torch.manual_seed(0); numpy.random.seed(0); "
         "from fedstyle.style.privacy import StylePrivacy; p = StylePrivacy(clip=1.0, noise=1.0, source='os'); "
         "print(json.dumps(p.perturb(torch.zeros(16, dtype=torch.float64), p.generator(0, 'x')).tolist()))")


def test_two_fresh_processes_draw_different_os_noise():
    # each process seeds torch and numpy alike and asks for the same seed's noise: only the OS's entropy differs
    env = {**os.environ, "PYTHONPATH": str(Path(fedstyle.__file__).resolve().parents[1])}
    draws = [json.loads(subprocess.run([sys.executable, "-c", _DRAW], capture_output=True, text=True, check=True,
                                       env=env, timeout=120).stdout) for _ in range(2)]
    assert len(draws[0]) == 16 and len(set(draws[0])) == 16
    assert not set(draws[0]) & set(draws[1])  # not one value in common


@pytest.mark.parametrize("source", ["os", "seeded"])
def test_noise_coordinates_i_and_i_plus_half_are_uncorrelated(source):
    half = 10_000
    privacy = StylePrivacy(clip=0.5, noise=1.0, source=source)
    draws = privacy.perturb(torch.zeros(2 * half, dtype=torch.float64), privacy.generator(0, "x")).numpy()
    r = float(np.corrcoef(draws[:half], draws[half:])[0, 1])
    # independent halves: sqrt(n) r is close to N(0, 1); |.| > 5.5 has probability 3.8e-8 (a false alarm below
    # 1e-6); a copied half gives r = +-1, a half copied with its sign changed r = -1
    assert abs(r) * np.sqrt(half) < 5.5, r
    assert 2 * stats.norm.sf(5.5) < 1e-6


def test_the_canary_threshold_is_chosen_on_the_selection_half_only():
    g = np.random.default_rng(0)
    scores_in, scores_out = g.normal(1.0, 1.0, 400), g.normal(0.0, 1.0, 400)
    bound = epsilon_lower_bound(scores_in, scores_out, 0.05, seed=3)
    # the split epsilon_lower_bound makes (its seed's permutations; the first half selects)
    rng = np.random.default_rng(3)
    count_in, count_out = rng.permutation(400)[200:], rng.permutation(400)[200:]
    moved_in, moved_out = scores_in.copy(), scores_out.copy()
    moved_in[count_in] += 0.7  # the counting half changes: the rates it gives may change, the choice may not
    moved_out[count_out] -= 0.4
    again = epsilon_lower_bound(moved_in, moved_out, 0.05, seed=3)
    assert again["threshold"] == bound["threshold"] and again["statistic"] == bound["statistic"]
    assert again["tpr"] != bound["tpr"] or again["fpr"] != bound["fpr"]  # the counting half was used to count


def test_the_canary_bound_is_valid_over_many_audits_at_delta_005():
    # 200 audits of releases that do not depend on the canary (true eps = 0 at any delta), each scored by 256
    # candidate statistics: an audit whose choices saw the counting half finds a statistic and threshold that
    # separate by chance. A valid bound exceeds the true eps in at most 5 % of the audits (level 0.95), so more
    # than `allowed` exceedances of 200 has probability below 1e-6.
    audits, delta, level = 200, 0.05, 0.95
    allowed = int(stats.binom.isf(1e-6, audits, 1 - level))
    g = np.random.default_rng(0)
    exceed = sum(epsilon_lower_bound(g.normal(size=(40, 256)), g.normal(size=(40, 256)), delta, level=level,
                                     seed=k)["epsilon_lb"] > 0 for k in range(audits))
    assert exceed <= allowed, (exceed, allowed)
