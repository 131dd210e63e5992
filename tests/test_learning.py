"""The learning check: every registered method, with its defaults, fits its source domains.

A method whose training loss stays at a uniform guess's, or whose source-validation accuracy lags
FedAvg's by far on the same budget, is broken for its users whatever its paper claims (StableFDG's
compounding exploration and StyleDDG's Eq. 19 operand were such bugs, issue 21). Each method
trains on ``digits3x`` (tests/learning.py: three source domains, one client each, all sampled
every round; the fourth domain held out) with the same budget as FedAvg, and must

* bring its training loss down: the last round's mean loss below ``LOSS_FALL`` times the first
  round's that has every loss term of the last (the method's whole loss, regularisers included, so
  no absolute ceiling: FedSR's starts near 5; FPL's prototype terms join in round 2, once the
  server has prototypes, so FPL is compared from there);
* reach a best source-validation accuracy within ``MARGIN`` of FedAvg's (peer-to-peer methods:
  of DSGD's, their FedAvg).

The budget is short (90 steps per client), so it measures how fast a method starts to fit, and
methods that regularise or augment heavily are legitimately slower there: measured on seed 0
(one torch thread), FedAvg 0.527 and DSGD 0.564, the slowest sound methods FedSR 0.350 (its
KL/L2 terms), StyleDDG 0.409, StableFDG 0.380, MOON 0.394, MixStyle 0.409. The broken ones were
far further behind: StableFDG before issue 21 at 0.12 (chance), StyleDDG with the old Eq. 19
operand at 0.30. ``MARGIN`` sits between the two groups; the benchmark tables (benchmarks/RESULTS.md)
give the full-budget source-validation accuracy beside the target's.

Cost knobs only: CCST and PARDON restyle with the ``fft`` backend (the default ``lite`` decodes
through a CNN, ~10x the setup time on a CPU), FedGCA trains on J = 1 augmented view instead of 3
(every loss term still runs; four views cost 4x the steps); everything else runs with its
defaults. One torch thread per run: the results do not depend on the machine's core count, and two
pytest-xdist workers do not oversubscribe two cores.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import run_experiment

from learning import BUDGET, SIZE, TARGET, write_digits3x  # tests/learning.py

#: the last round's loss must be below this fraction of the first round's
LOSS_FALL = 0.8
#: best source-validation accuracy may lag the reference (FedAvg; DSGD peer-to-peer) by at most this
MARGIN = 0.2
#: the reference must itself have learned, or the check compares nothing
REFERENCE_FLOOR = 0.4

COST_KNOBS = {"ccst": {"style_backend": "fft"}, "pardon": {"style_backend": "fft"}, "fedgca": {"augment_views": 1}}
REFERENCE = {"star": "fedavg", "complete": "dsgd"}


@pytest.fixture(scope="session")
def digits3x(tmp_path_factory):
    return write_digits3x(tmp_path_factory.mktemp("digits3x"))


def _train(root, out, method: str, topology: str) -> dict:
    config = RunConfig(dataset="folder", data_root=str(root), resolution=SIZE, targets=[TARGET], method=method,
                       topology=topology, hparams=COST_KNOBS.get(method, {}), device="cpu", seed=0, **BUDGET)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_experiment(config, out, quiet=True)
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train_loss" in r]
    accuracies = [sum(r["source_val_acc"].values()) / len(r["source_val_acc"]) for r in rows]
    return {"losses": [r["train_loss"] for r in rows], "best_source_val": max(accuracies),
            "first_full_loss": _first_full_loss(rows)}


def _first_full_loss(rows: list[dict]) -> float:
    """The loss of the first round whose logged terms include every term of the last round's (a loss
    that gains terms after round 1 is compared from where it is whole; the first round otherwise)."""
    last_terms = set(rows[-1].get("train_metrics", {}))
    for row in rows[:-1]:
        if last_terms <= set(row.get("train_metrics", {})):
            return row["train_loss"]
    return rows[0]["train_loss"]


@pytest.fixture(scope="session")
def references(digits3x, tmp_path_factory):
    cache: dict[str, dict] = {}

    def get(topology: str) -> dict:
        method = REFERENCE[topology]
        if method not in cache:
            cache[method] = _train(digits3x, tmp_path_factory.mktemp(method) / "run", method, topology)
            assert cache[method]["best_source_val"] >= REFERENCE_FLOOR, (
                f"the reference {method} reached only {cache[method]['best_source_val']:.3f}: the check's budget "
                "is too small to compare methods")
        return cache[method]

    return get


def _cases():
    for name, cls in sorted(METHODS.items()):
        yield name, ("star" if "star" in cls.topologies else "complete")


@pytest.mark.parametrize("method,topology", list(_cases()))
def test_every_method_fits_its_sources(digits3x, references, tmp_path, method, topology):
    reference = references(topology)
    # the reference checks itself through the fixture (loss fall below, accuracy floor there)
    run = reference if method == REFERENCE[topology] else _train(digits3x, tmp_path / "run", method, topology)
    first, last = run["first_full_loss"], run["losses"][-1]
    assert math.isfinite(last) and last < LOSS_FALL * first, (
        f"{method}: training loss {first:.3f} -> {last:.3f} (per round {[round(v, 3) for v in run['losses']]}); "
        f"a uniform guess has {math.log(10):.3f}")
    assert run["best_source_val"] >= reference["best_source_val"] - MARGIN, (
        f"{method}: best source-validation accuracy {run['best_source_val']:.3f} vs the reference's "
        f"{reference['best_source_val']:.3f} on the same budget")


def test_the_loss_is_compared_from_the_first_round_with_every_term():
    ce, both = {"ce": 1.0}, {"ce": 1.0, "cpcl": 1.0}
    rows = [{"train_loss": 2.0, "train_metrics": ce}, {"train_loss": 4.0, "train_metrics": both},
            {"train_loss": 3.0, "train_metrics": both}]
    assert _first_full_loss(rows) == 4.0  # round 1 lacked a term: 3.0 is compared with 4.0
    assert _first_full_loss([rows[0], {"train_loss": 1.0, "train_metrics": ce}]) == 2.0
    assert _first_full_loss([{"train_loss": 2.0}, {"train_loss": 1.0}]) == 2.0  # nothing logged: round 1
