"""The learning check and the term check: every registered method, with its defaults, fits its source domains at
the rate it was measured to, the known regressions do not, and every loss term a method logs is alive.

Each method trains on ``digits3x`` (tests/learning.py: three source domains, one client each, all sampled every
round; 15 local steps of 32 images per round, lr 0.02 cosine, one torch thread, the Digits-DG ConvNet 32 channels
wide: tests/learning.py ``WIDTH``) on seed 0 (StableFDG and StyleDDG: seeds 0 and 1), once for both checks: 6 rounds for the four methods with a known regression (StableFDG, StyleDDG, PARDON,
MOON: ``BUDGET``), 4 rounds for the 22 others (``SHORT_BUDGET``; see below why).

**Learning check.** The statistic is the *late loss*: the mean training loss of the last 3 rounds (the method's
whole loss, each round's mean over its steps and clients), averaged over the method's seeds. It must be at or
under the method's ceiling (tests/learning.py ``CEILINGS``), and the best source-validation accuracy must reach
0.15 (chance 0.1: a floor for an evaluation path that breaks while the loss still falls).

Why not source-validation accuracy, as before (issue 35): after 270 steps (6 rounds, width 64) it moves by 0.04-0.08 from seed
to seed (90 validation images per domain, BatchNorm running statistics averaged over three very different domains), as
much as the regressions cost (FedAvg's best: 0.46-0.56 over seeds 0-4). The late loss averages 405 batches and
moves by 0.02-0.06. Why per-method ceilings and not one margin from FedAvg: the losses differ by design (FedSR's
includes its KL and L2 terms; MixStyle's, StableFDG's and PARDON's restyled or transferred samples), and the
slowest sound methods overlap other methods' regressions under any one threshold.

The rule (benchmarks/learning_check.py --propose), from seeds 0-4 of the methods with a regression and of every
regression (6 rounds) and seeds 0-2 of the others (4 rounds), with
*spread* the seed-to-seed std of the statistic the check uses (a run's std over the measured seeds, divided by
sqrt(2) for StableFDG and StyleDDG, which the check trains on two seeds):

* a method with a regression the statistic sees: its ceiling is the point between the sound mean and the
  regression's mean that is the same number of each one's spreads from both;
* every other method: its mean plus the larger of 4 spreads and 4 % of the mean (a spread measured on a few seeds
  may be small by luck; another machine's float rounding moves a run like another seed).

Measured (benchmarks/learning_check.py, benchmarks/learning_check_results.jsonl, the rows with ``backbone:
convnet_32ch`` in their budget; 2-core CPU, one torch thread per run; spread: of the check's statistic, * = over 2 seeds; margin = distance to the ceiling in spreads, positive on
the right side: sound methods under, regressions over; src-val: best source-validation accuracy, mean over seeds):

    variant                                      late loss per seed         mean spread  ceil margin src-val
    ccst                                         2.16 2.18 2.21              2.184  0.028 2.297  +4.0 0.31
    dsgd                                         1.73 1.80 1.76              1.761  0.037 1.908  +4.0 0.33
    dsu                                          1.97 2.01 2.03              2.007  0.030 2.125  +4.0 0.27
    fedadg                                       1.79 1.83 1.87              1.830  0.038 1.984  +4.0 0.26
    fedavg                                       1.87 1.90 1.95              1.907  0.041 2.073  +4.0 0.28
    fedbn                                        1.86 1.90 1.95              1.902  0.043 2.072  +4.0 0.28
    fedccrl                                      5.91 5.92 6.21              6.012  0.167 6.681  +4.0 0.53
    feddg_fft                                    2.03 2.08 2.09              2.069  0.030 2.190  +4.0 0.34
    feddg_ga                                     1.86 1.90 1.95              1.902  0.042 2.069  +4.0 0.28
    feddyn                                       1.62 1.67 1.79              1.692  0.085 2.032  +4.0 0.35
    fedgca                                       2.05 2.04 2.16              2.083  0.066 2.347  +4.0 0.39
    fedgma                                       1.96 2.00 2.04              2.000  0.039 2.156  +4.0 0.25
    fediir                                       1.88 1.78 1.89              1.849  0.063 2.101  +4.0 0.29
    fedomg                                       1.82 1.84 1.92              1.859  0.054 2.074  +4.0 0.31
    fedprox                                      1.87 1.91 1.96              1.912  0.041 2.077  +4.0 0.27
    fedsam                                       1.95 2.00 2.02              1.988  0.037 2.136  +4.0 0.25
    fedsr                                        3.40 3.42 3.46              3.427  0.030 3.564  +4.6 0.25
    fpl                                          3.84 3.98 3.95              3.925  0.075 4.224  +4.0 0.35
    gperxan                                      2.83 2.85 2.88              2.855  0.023 2.970  +4.9 0.48
    jigen                                        2.48 2.46 2.42              2.452  0.029 2.568  +4.0 0.23
    mixstyle                                     1.99 2.01 2.06              2.020  0.032 2.150  +4.0 0.25
    moon                                         1.97 2.21 2.12 2.10 2.14    2.107  0.085 2.446  +4.0 0.37
    pardon                                       1.99 2.00 2.02 1.93 2.03    1.994  0.038 2.147  +4.0 0.43
    rsc                                          2.17 2.22 2.19              2.193  0.026 2.297  +4.0 0.23
    stablefdg                                    2.02 2.00 2.02 1.97 2.07    2.016  0.025*2.096  +3.2 0.33
    styleddg                                     2.09 2.08 2.05 2.05 2.10    2.075  0.017*2.135  +3.5 0.33
    stablefdg:explore_repeat=every_firing_stage  2.15 2.16 2.14 2.11 2.16    2.144  0.015*2.096  +3.2 0.28
    stablefdg:pooled_attention                   2.21 2.22 2.21 2.22 2.24    2.219  0.008*2.096 +15.6 0.16
    styleddg:mix_from=explored                   2.15 2.17 2.15 2.17 2.17    2.165  0.009*2.135  +3.4 0.27
    pardon:batchnorm_stats=joint                 1.99 2.05 2.07              2.035  0.044 2.147  -2.5 0.50  guard
    pardon:ce_views=both                         2.21 2.21 2.22 2.21 2.19    2.209  0.014 2.147  +4.6 0.32
    moon:pytorch_default_init                    2.50 2.49 2.52 2.49 2.51    2.503  0.014 2.446  +3.9 0.21

StableFDG and StyleDDG train on two seeds: on one, the equal-distance point is 2.2 single-run spreads from
StableFDG and from ``explore_repeat=every_firing_stage`` and 2.5 from StyleDDG and from ``mix_from=explored``,
under the 3 asked for (the other regressions sit 4 or more of their methods' single-run spreads away). At width
64 (the rows without a backbone in their budget) StableFDG's sat 3.3 apart on one seed; StyleDDG's 2.5 there too,
and no other statistic of the same runs separated StyleDDG on one seed: the last round's loss 2.0 spreads, the last 2 rounds' 2.2, rounds 2-6 2.8, the late loss minus DSGD's on the same seed 2.1. Longer
training does not either: with a constant lr over 12 rounds StyleDDG's seeds spread as fast as its regression
falls behind (seed 0: 1.13 vs 1.45 at round 12, seeds 1-2 of the sound method 0.93 and 1.19).

PARDON with ``batchnorm_stats=joint`` (BatchNorm statistics over [x; x'], CE on the originals) fits its sources
as well as the default (late loss 2.04 vs 1.99, best source-val 0.50 vs 0.43): what it costs is the held-out
target (issue 21: 31.0 % vs 50.2 % on mnistm), which this check does not read; tests/test_pardon.py pins the
default's BatchNorm (the originals' features and running statistics do not depend on the transfers).

FedADG's row is with ``adv_lr_scale`` = 0.02 (issue 35; fedstyle/algorithms/fedadg.py says why): at the former 0.7
its discriminator's sigmoid saturated in round 1 and the late loss (1.17 1.17 1.26) was FedAvg's, which this
check could not tell from a working FedADG; the term check below does.

Why two budgets (the suite's 10 minutes; the check was ~750 CPU s of ~1,400 with 6 rounds for all): a method
with a regression needs the later rounds to tell it from the regression: at 4 rounds and width 64 (rows with
``rounds: 4`` in benchmarks/learning_check_results.jsonl, seeds 0-4) StableFDG's late loss (2.062, sd 0.033) and
``explore_repeat=every_firing_stage``'s (2.186, sd 0.027) sit 2.1 single-run spreads from their equal-distance
point, against 3.3 at 6 rounds. A method without one only has to be seen fitting its sources at its measured
rate: rounds 2-4 of 4 show it with the same rule (4 spreads, at least 4 %; FedAvg 1.91 on seeds 0-2, ceiling
2.07, where a model that learns nothing stays at ln 10 = 2.30). Where a method's own terms lift its loss near
that (CCST's ceiling 2.30, gPerXAN's 2.97), a method that stops learning is caught by the source-validation floor
(0.15, chance 0.10; the lowest mean best source-val at 4 rounds is JiGen's and RSC's 0.23). The 22 methods on 4
rounds cost a third less (about 180 CPU s of the check's at width 64).

A deliberate change to a method's defaults can move its late loss: rerun
``benchmarks/learning_check.py --variants METHOD [its regressions] --seeds 0 1 2 --rerun --propose --write-fixture``
and copy its ceiling into CEILINGS.

**Term check** (tests/loss_terms.py): in round 2 (the model trained for one round of 15 steps; FPL's server has
prototypes and MOON's clients a previous model from then on) the last 4 steps of every client run through the
method's own ``training_step`` / ``training_loss`` (a full forward pass of its real loss) with a probe on what it
logs, which takes the gradient of each weighted loss term with respect to all the model's weights. Each term's
median ratio ``|w_t| ||grad t|| / (|w_ce| ||grad ce||)`` must reach its floor; the weighted terms must add up to
the loss the step returned (a term missing from the table or a wrong weight fails there); every logged name must
be declared; a term said to start late must be absent before. The probe only reads, so it costs a few backward
passes and no training. Measured ratios and floors are in tests/loss_terms.py.

Cost knobs only: CCST and PARDON restyle with the ``fft`` backend (``lite`` decodes through a CNN, ~10x the setup
time on a CPU), FedGCA trains on J = 1 augmented view instead of 3 (every loss term still runs), FedADG's generator
is 256 -> 512 wide instead of 2,048 -> 4,096 (half its run's cost), and the network is the ConvNet 32 channels
wide instead of 64 (tests/learning.py ``WIDTH``: the check's runs 425 -> 327 CPU s in the benchmark's rows, seed 0
of each method and seed 1 of StableFDG and StyleDDG; PARDON 62 -> 36, MOON 28 -> 12); everything else runs with
its defaults. One torch thread per run: the results do not depend on the machine's core count or on how many
pytest-xdist workers share it. One test per method runs both checks on one training.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest

from fedstyle.algorithms import METHODS

# tests/learning.py (the data, budget, regressions, statistic and rule) and tests/loss_terms.py (the term check)
from learning import (BUDGET, CEILINGS, FIXTURE, REGRESSIONS, SHORT_BUDGET, Run, ceilings_by_rule, failures, margins,
                      seeds, sound, train, write_digits3x)
from loss_terms import TERMS, Probe, term_failures

@pytest.fixture(scope="session")
def digits3x(tmp_path_factory):
    return write_digits3x(tmp_path_factory.mktemp("digits3x"))


def _train_once(root, tmp_path, method: str) -> tuple[list[Run], Probe]:
    """The method's runs, one per seed, and the probe that watched the first."""
    probe, runs = Probe(method), []
    for i, seed in enumerate(seeds(method)):
        with probe.watching() if i == 0 else nullcontext():
            runs.append(train(root, tmp_path / f"run-{seed}", sound(method), seed))
    return runs, probe


@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_every_method_fits_its_sources_and_every_logged_loss_term_is_alive(digits3x, tmp_path, method):
    """Both checks on one training per method, in one test: as two tests sharing a cached run, pytest-xdist's
    --dist loadgroup did not keep a method's two tests on one worker here (xdist_group marks on parameters), so
    about half the methods trained twice (1,000 CPU s instead of ~650)."""
    assert method in CEILINGS, (f"{method} has no ceiling in tests/learning.py CEILINGS: measure it with "
                                f"benchmarks/learning_check.py --variants {method} --seeds 0 1 2 --propose "
                                "--write-fixture")
    assert method in TERMS, (f"{method} is not in tests/loss_terms.py TERMS: declare what it logs (its cross-"
                             "entropy, its loss terms with their weights, its other logged values), then measure "
                             f"its terms with benchmarks/learning_check.py --variants {method} --seeds 0 1 2")
    runs, probe = _train_once(digits3x, tmp_path, method)
    problems = failures(method, runs)
    if problems:
        problems[-1] += (" — if the change is intended, rerun benchmarks/learning_check.py for this method and update "
                         "its ceiling")
    problems += term_failures(probe, len(runs[0].losses))
    assert not problems, "; ".join(problems)
    for name, why in TERMS[method].dead.items():
        pytest.xfail(f"{method}: {name} is {probe.median_ratios()[name]:.3g} of the cross-entropy's gradient: {why}")


def test_every_method_has_a_ceiling_and_its_terms_declared_and_every_regression_a_method():
    methods = set(METHODS.names())
    assert not methods - set(CEILINGS), (
        f"no ceiling in tests/learning.py CEILINGS for {sorted(methods - set(CEILINGS))}: declare its terms in "
        "tests/loss_terms.py TERMS, then measure it with benchmarks/learning_check.py --variants METHOD --seeds 0 1 2 "
        "--propose --write-fixture and copy its ceiling")
    assert not methods - set(TERMS), f"not in tests/loss_terms.py TERMS: {sorted(methods - set(TERMS))}"
    assert set(CEILINGS) <= methods and set(TERMS) <= methods, "a ceiling or TERMS entry for a method not registered"
    assert {r.method for r in REGRESSIONS} <= methods


def test_the_ceilings_are_the_rule_on_the_measured_seeds_and_decide_by_3_spreads():
    """CEILINGS is the rule applied to the seeds in tests/fixtures/learning_check.json (the table above), and on
    those seeds every sound method sits 3 or more spreads under its ceiling and every regression this check is for
    3 or more over it."""
    measured = json.loads(FIXTURE.read_text())
    assert measured["budget"] == BUDGET and measured["short_budget"] == SHORT_BUDGET, (
        "the fixture was measured on other budgets: rerun the benchmark")
    late = {name: list(by_seed.values()) for name, by_seed in measured["late_loss"].items()}
    assert set(METHODS.names()) <= set(late), f"not measured: {sorted(set(METHODS.names()) - set(late))}"
    assert ceilings_by_rule(late) == CEILINGS
    margin = margins(late, CEILINGS)
    decided = [*METHODS.names(), *(r.name for r in REGRESSIONS if not r.guard)]
    assert all(margin[name] >= 3 for name in decided), {name: round(margin[name], 1) for name in decided}
