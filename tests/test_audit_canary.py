"""The canary audit (issue 36, section 4): an empirical lower bound on eps, checked against known answers.

Synthetic surfaces release through the defence's own code (``clip_rows``, ``StylePrivacy.perturb`` with a fresh
seeded generator per release) and are scored against its own accountant (``StylePrivacy.epsilon``); the
senders' code paths (CCST, StableFDG) are checked on the tiny dataset. Fast: a few thousand releases of 3 numbers.
"""

from __future__ import annotations

import math
from itertools import count

import numpy as np
import pytest
import torch

from fedstyle.audit.canary import (canary_audit, canary_line, canary_power, clopper_pearson_upper, crafted_images,
                                   epsilon_lower_bound, plant_canary)
from fedstyle.audit.surfaces import Surface, averaged_surface
from fedstyle.errors import ConfigError
from fedstyle.style.privacy import StylePrivacy, clip_rows, gaussian_epsilon

SIZE = 8


def centred_means(images: torch.Tensor) -> torch.Tensor:
    """Each image's channel means minus 1/2 (signed: a white and a black image point in opposite directions)."""
    return images.double().div(255).mean((2, 3)) - 0.5


def defended_surface(privacy: StylePrivacy, per_image: bool) -> Surface:
    """Per-image rows or a set mean of ``centred_means``, clipped and noised by the defence's own functions."""
    draws = count()

    def release(images: torch.Tensor) -> torch.Tensor:
        rows = clip_rows(centred_means(images), privacy.clip)
        noise = privacy.generator(0, "test", next(draws))
        return privacy.perturb(rows, noise) if per_image else privacy.perturb(rows.sum(0), noise) / len(images)

    return Surface("test", "per-image style" if per_image else "dataset style", "", per_image, lambda n: n,
                   centred_means, release, centred_means, lambda r: r, privacy=privacy)


def public_pool() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(64, 192, (16, 3, SIZE, SIZE), generator=g, dtype=torch.uint8)  # greyish: no extreme


def test_clopper_pearson_and_the_bound_have_their_closed_forms():
    # no error in n trials: the one-sided upper bound solves (1 - p)^n = 1 - level
    assert clopper_pearson_upper(0, 200, 0.975) == pytest.approx(1 - 0.025 ** (1 / 200), rel=1e-9)
    assert clopper_pearson_upper(200, 200, 0.975) == 1.0
    assert clopper_pearson_upper(50, 200, 0.975) > 0.25 > clopper_pearson_upper(30, 200, 0.975)
    rng = np.random.default_rng(0)
    same = rng.normal(size=400)
    assert epsilon_lower_bound(same, same, 1e-5)["epsilon_lb"] == 0.0  # one distribution: nothing to tell
    apart = epsilon_lower_bound(np.ones(400), np.zeros(400), 1e-5)
    u = 1 - 0.025 ** (1 / 200)
    assert apart["epsilon_lb"] == pytest.approx(math.log((1 - 1e-5 - u) / u)) == pytest.approx(apart["ceiling"])
    assert (apart["tpr"], apart["fpr"], apart["trials"]) == (1.0, 0.0, 200.0)
    with pytest.raises(ConfigError, match="at least 4"):
        epsilon_lower_bound([1.0], [0.0], 1e-5)


def test_the_second_inequality_bounds_a_canary_that_is_never_missed():
    # in-world releases always read 1, out-world ones 0 or 1 at random: no false negative, FPR 1/2, so
    # 1 - FPR <= e^eps FNR + delta binds (eps infinite); the first inequality alone gives log 2 at most
    mixed = epsilon_lower_bound(np.ones(400), np.r_[np.zeros(200), np.ones(200)], 1e-5)
    assert mixed["fnr_hi"] == pytest.approx(1 - 0.025 ** (1 / 200)) and 0.4 < mixed["fpr"] < 0.6
    assert mixed["epsilon_lb"] == pytest.approx(math.log((1 - 1e-5 - mixed["fpr_hi"]) / mixed["fnr_hi"]))
    assert mixed["epsilon_lb"] > 2.5


def test_a_choice_among_many_noise_statistics_is_not_read_as_a_leak():
    # 500 candidate statistics of pure noise (both worlds one distribution, eps = 0): the one chosen on half the
    # trials looks separated there by chance; counted on the other half it shows nothing. A valid 95 % bound is
    # positive in at most 5 % of such audits; counting on the choosing half would make most of them positive
    rng = np.random.default_rng(0)
    positive = [epsilon_lower_bound(rng.normal(size=(40, 500)), rng.normal(size=(40, 500)), 1e-5, seed=s)["epsilon_lb"]
                > 0 for s in range(20)]
    assert sum(positive) <= 3


def test_the_canary_is_crafted_at_the_worst_case_the_clipping_allows():
    crafted = crafted_images(SIZE, SIZE)
    assert crafted.dtype == torch.uint8 and crafted.shape[1:] == (3, SIZE, SIZE)
    planted = plant_canary(defended_surface(StylePrivacy(0.5, 1.0, source="seeded"), True), public_pool())
    # white and black: centred means +-(1/2, 1/2, 1/2), norm 0.87 > C, clipped to C in opposite directions: 2C apart
    assert {int(planted["canary"].float().mean()), int(planted["replacement"].float().mean())} == {0, 255}
    assert planted["share"] == pytest.approx(1.0)
    assert float(planted["direction"].norm()) == pytest.approx(1.0)


@pytest.mark.parametrize("per_image", [True, False])
def test_without_noise_the_canary_is_found_in_every_release(per_image):
    scores = canary_audit(defended_surface(StylePrivacy(0.5, 0.0), per_image), public_pool()[:3], public_pool(), 200)
    assert (scores["canary_tpr"], scores["canary_fpr"]) == (1.0, 0.0)
    assert scores["canary_epsilon_lb"] == pytest.approx(scores["canary_ceiling"]) and scores["canary_ceiling"] > 3.2
    assert math.isinf(scores["canary_epsilon"]) and "no noise" in canary_line(scores)


def _audit(privacy: StylePrivacy, trials: int = 1500) -> dict[str, float]:
    return canary_audit(defended_surface(privacy, True), public_pool()[:3], public_pool(), trials)


def test_the_empirical_eps_stays_below_the_analytic_one_and_catches_a_wrong_accountant():
    # z = 1 at delta = 0.05 (a delta a few thousand trials can resolve): analytic eps 1.57
    privacy = StylePrivacy(0.5, 1.0, delta=0.05, source="seeded")
    scores = _audit(privacy)
    assert scores["canary_epsilon"] == pytest.approx(gaussian_epsilon(1.0, 0.05)) == pytest.approx(1.57, abs=0.01)
    assert 0.6 < scores["canary_epsilon_lb"] <= scores["canary_epsilon"]
    # the noise is what the defence claims: sums 2C apart under noise of std 2C z read as separation 1 / z
    assert scores["canary_expected_separation"] == pytest.approx(1.0)
    assert scores["canary_separation"] == pytest.approx(1.0, abs=0.1)
    # an accountant that claimed twice the noise (z = 2: eps 0.51) for this release would be caught
    assert scores["canary_epsilon_lb"] > gaussian_epsilon(2.0, 0.05)
    assert "analytic for the same release" in canary_line(scores)
    # the run's delta, z = 4: analytic 0.93, the bound stays below
    low = _audit(StylePrivacy(0.5, 4.0, source="seeded"), trials=500)
    assert low["canary_epsilon"] == pytest.approx(0.926, abs=1e-3) and low["canary_epsilon_lb"] < 0.926


@pytest.mark.parametrize("shrink,delta,analytic", [(2, 0.05, 1.57), (10, 1e-5, 4.38)])
def test_noise_smaller_than_claimed_is_caught(monkeypatch, shrink, delta, analytic):
    # the mutations: noise std z * C instead of z * 2C (the sensitivity of replace-one taken as C), caught at a
    # delta the trials resolve (bound 2.8); noise 10x too small, caught at the runs' delta (the trials' ceiling,
    # 5.3 with 750 counted, above 4.38); the accountant, unchanged, still claims the eps of the full noise
    monkeypatch.setattr(StylePrivacy, "std", property(lambda self: self.noise * self.sensitivity / shrink))
    scores = _audit(StylePrivacy(0.5, 1.0, delta=delta, source="seeded"))
    assert scores["canary_epsilon"] == pytest.approx(analytic, abs=0.01)
    assert scores["canary_epsilon_lb"] > scores["canary_epsilon"]


def test_a_combination_of_releases_is_audited_against_its_composed_eps():
    # the receiver's mean of T = 4 releases at z = 2: the noise of one release at z = 1 (Gaussian composition)
    privacy = StylePrivacy(0.5, 2.0, delta=0.05, source="seeded")
    scores = canary_audit(averaged_surface(defended_surface(privacy, True), 4), public_pool()[:3], public_pool(), 500)
    assert scores["canary_epsilon"] == pytest.approx(privacy.total_epsilon(4))
    assert scores["canary_epsilon"] == pytest.approx(gaussian_epsilon(1.0, 0.05))
    assert scores["canary_expected_separation"] == pytest.approx(1.0)  # ||Delta|| sqrt(T) / sigma = 2C * 2 / 4C
    assert scores["canary_separation"] == pytest.approx(1.0, abs=0.15)
    assert scores["canary_epsilon_lb"] <= scores["canary_epsilon"]


def test_refusals():
    surface = defended_surface(StylePrivacy(0.5, 1.0, source="seeded"), True)
    with pytest.raises(ConfigError, match="8 to 100,000 releases per world"):
        canary_audit(surface, public_pool()[:3], public_pool(), 4)
    flat = Surface("test", "per-image style", "", True, lambda n: n, lambda im: torch.zeros(len(im), 3),
                   surface.release, centred_means, lambda r: r, privacy=surface.privacy)
    with pytest.raises(ConfigError, match="ignores its images"):
        plant_canary(flat, public_pool(), crafted=False)


@pytest.mark.parametrize("method,hp", [("ccst", {"style_type": "single"}), ("ccst", {"style_type": "overall"}),
                                       ("stablefdg", {})])
def test_the_canary_is_released_through_the_senders_code(tiny_config, method, hp):
    from test_audit_run import _surface

    exp, surface = _surface(tiny_config, method, dp_clip=1.0, dp_noise=0.0, **hp)
    public = torch.cat([s.images for s in exp.source_val.values()])[:8]
    scores = canary_audit(surface, exp.simulator.clients[0].images[:3], public, 8)
    # clipped, no noise: the sender's release with the canary differs from the one without it, every time
    assert (scores["canary_tpr"], scores["canary_fpr"]) == (1.0, 0.0)
    assert 0.2 < scores["canary_share"] <= 1.0 + 1e-9


def test_the_senders_noise_is_the_claimed_noise(tiny_config):
    from test_audit_run import _surface

    exp, surface = _surface(tiny_config, "stablefdg", dp_clip=1.0, dp_noise=0.5)
    public = torch.cat([s.images for s in exp.source_val.values()])[:8]
    scores = canary_audit(surface, exp.simulator.clients[0].images[:3], public, 200)
    assert scores["canary_epsilon"] == pytest.approx(gaussian_epsilon(0.5, 1e-5))
    # what the two worlds' releases are apart, in units of the noise, is what the claimed noise gives (1.4 here)
    assert scores["canary_linear_separation"] == pytest.approx(scores["canary_expected_separation"], abs=0.3)
    assert scores["canary_epsilon_lb"] <= scores["canary_epsilon"]


def test_the_canary_audits_power_against_noise_smaller_than_claimed():
    # the per-image setting of docs/results/privacy.md's CCST table: a canary moving the row by 0.74 of 2C,
    # z = 1, delta = 1e-5, 1000 releases per world. Correct noise never passes the analytic eps (4.38); noise 10x
    # too small always does; 2x too small does not (the bound's ceiling at 500 counted releases is 4.91, and the
    # true eps of 2x-too-small noise at this canary is reached only in tails these trials do not resolve)
    power = canary_power(0.74, 1.0, 1e-5, 1000, (1, 2, 10), repeats=20)
    assert power == {1.0: 0.0, 2.0: 0.0, 10.0: 1.0}
    with pytest.raises(ConfigError, match="canary_power needs"):
        canary_power(0.74, 1.0, 1e-5, 4)


def test_ccst_overall_styles_noise_check_reads_the_means(tiny_config):
    # CCST's dataset style: with the claimed noise the means' separation is what the noise gives; a statistic over
    # every moment reads second moments through variances clamped at 0, and separates less (0.02 vs 0.29 before)
    from test_audit_run import _surface

    exp, surface = _surface(tiny_config, "ccst", style_type="overall", dp_clip=1.0, dp_noise=0.5)
    public = torch.cat([s.images for s in exp.source_val.values()])[:8]
    scores = canary_audit(surface, exp.simulator.clients[0].images[:3], public, 200)
    assert scores["canary_linear_separation"] == pytest.approx(scores["canary_expected_separation"], abs=0.3)
    assert scores["canary_epsilon_lb"] <= scores["canary_epsilon"]
    assert "on the coordinates read back linearly" in canary_line(scores)


def test_canary_refusals_are_one_line_before_any_attack(tiny_config, tmp_path, capsys):
    """Issue 55 item 4: --canary 1e9 was accepted (months of work, no progress bar), and on a run with no style
    payload (FedAvg) --canary was skipped without a word."""
    from fedstyle.cli.main import main

    assert main(["audit", "privacy", str(tmp_path / "nowhere"), "--canary", "1000000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "8 to 100,000" in err
    run = tmp_path / "fedavg-run"
    run.mkdir()
    (run / "config.json").write_text(tiny_config.updated(method="fedavg").to_json() + "\n")
    assert main(["audit", "privacy", str(run), "--canary", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fedavg run, which releases none: drop --canary" in err and "ccst" in err
    assert not (run / "audit").exists()


def test_a_canary_audit_shows_its_progress_and_time_left(tiny_config, capsys):
    from test_audit_run import _surface

    exp, surface = _surface(tiny_config, "stablefdg", dp_clip=1.0, dp_noise=0.0)
    public = torch.cat([s.images for s in exp.source_val.values()])[:8]
    canary_audit(surface, exp.simulator.clients[0].images[:3], public, 8, progress=True)
    assert "canary audit" in capsys.readouterr().err
    canary_audit(surface, exp.simulator.clients[0].images[:3], public, 8)
    assert "canary audit" not in capsys.readouterr().err
