"""The term check's own known answers (tests/loss_terms.py; the check itself runs in tests/test_learning.py on the
learning check's runs): a probed run trains exactly as an unprobed one, and the check fails a loss term switched
off (weight 0: the case issue 35 names, which the learning check passes by construction), a wrong weight, and a
logged name nobody declared. One brief FedSR run (2 rounds x 3 local steps, alpha_cmi = 0) through the real
training loop, probed in round 2, and the same run unprobed.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from learning import BUDGET, FIXTURE, Variant, train, write_digits3x  # tests/learning.py
from loss_terms import FLOOR, TERMS, Probe, hp, term_failures  # tests/loss_terms.py

BRIEF = dict(BUDGET, rounds=2, local_steps=3)
CMI_OFF = Variant("fedsr:alpha_cmi=0", "fedsr", {"alpha_cmi": 0.0})


@pytest.fixture(scope="session")
def brief(tmp_path_factory):
    """(the probe, the probed run, the unprobed run) of FedSR with its CMI term switched off (session-scoped, so
    pytest-xdist's interleaving of modules does not train it again)."""
    root = write_digits3x(tmp_path_factory.mktemp("digits3x-terms"))
    probe = Probe("fedsr", probe_round=1, steps=2)
    with probe.watching():
        probed = train(root, tmp_path_factory.mktemp("probed") / "run", CMI_OFF, budget=BRIEF)
    unprobed = train(root, tmp_path_factory.mktemp("unprobed") / "run", CMI_OFF, budget=BRIEF)
    return probe, probed, unprobed


def _with(probe: Probe, **changes) -> Probe:
    other = copy.copy(probe)
    other.terms = dataclasses.replace(probe.terms, **changes)
    return other


def test_a_probed_run_trains_exactly_as_an_unprobed_one(brief):
    probe, probed, unprobed = brief
    assert len(probe.steps) == 3 * 2  # 3 clients x the first 2 steps of round 2
    assert probed.losses == unprobed.losses and probed.source_val == unprobed.source_val


def test_a_term_switched_off_fails_and_the_others_pass(brief):
    probe, probed, _ = brief
    ratios = probe.median_ratios()
    assert ratios["fedsr_cmi"] == 0.0 and ratios["fedsr_l2r"] > 0.02
    problems = term_failures(probe, len(probed.losses))
    assert len(problems) == 1 and "fedsr_cmi's weighted gradient is 0 of the cross-entropy's" in problems[0]


def test_a_wrong_weight_fails_the_sum(brief):
    probe, probed, _ = brief
    doubled = lambda params, logged: 2 * hp("alpha_l2r")(params, logged)  # noqa: E731
    problems = term_failures(_with(probe, terms={**TERMS["fedsr"].terms, "fedsr_l2r": doubled}), len(probed.losses))
    assert any("the weighted terms sum to" in p for p in problems)


def test_an_undeclared_name_fails(brief):
    probe, probed, _ = brief
    problems = term_failures(_with(probe, terms={"fedsr_l2r": hp("alpha_l2r")}), len(probed.losses))
    assert any("logs ['fedsr_cmi'] in round 1" in p for p in problems)


def test_every_floor_sits_3x_under_the_measured_ratios_and_every_dead_term_under_its_floor():
    """The floors in TERMS against the ratios measured on seeds 0-2 (tests/fixtures/learning_check.json, the
    table in tests/loss_terms.py): a live term's smallest ratio is at least 3x its floor, a dead term's largest
    under it."""
    measured = json.loads(FIXTURE.read_text())["term_ratios"]
    for method, terms in TERMS.items():
        for name in [*terms.terms, *terms.own]:
            ratios = [by_seed[name] for by_seed in measured.get(method, {}).values() if name in by_seed]
            floor = terms.floors.get(name, (FLOOR, ""))[0]
            assert len(ratios) >= 3, (f"{method}: {name} measured on {len(ratios)} seeds: benchmarks/learning_check.py "
                                      f"--variants {method} --seeds 0 1 2 --rerun --write-fixture")
            if name in terms.dead:
                assert max(ratios) < floor, f"{method}: {name} {ratios} is not dead under {floor}"
            else:
                assert min(ratios) >= 3 * floor, f"{method}: {name} {ratios} is not 3x over its floor {floor}"
