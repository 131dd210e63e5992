"""How fedstyle reads a claim "A > B" from runs: one rule, used by ``fedstyle reproduce``, sweep reports and the
benchmark table scripts, and quoted in docs/results/index.md "How a claim is read" (issue 35).

**The rule** (:data:`RULE`). A claim is judged on *cells*: a dataset and one held-out target domain (or one
LTDO split) where both rows ran. In a cell, the seeds both rows ran pair up (a seed fixes the partition, the
initial weights and the data order for every method), and each pair gives one difference
d = acc(A) - acc(B), in points. Over all the claim's paired differences:

* **holds**: the 95 % confidence interval of their mean (Student's t, n - 1 degrees of freedom) lies above 0;
* **fails**: it lies below 0 (B beats A);
* **within noise**: it contains 0;
* **not judged**: fewer than 2 paired differences (no spread to weigh a gap against).

Beside the reading: the mean difference and its interval, how many differences favour A, and the exact
two-sided sign test's p over them (it needs no normality; with 3 seeds its smallest p is 0.25, so 3 seeds
alone never reach p < 0.05: a sign test is a consistency statement there). A verdict names its cells and
seeds and says nothing about cells it was not measured on. A cell's seeds where only one row ran are left
out (and counted: ``unpaired``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

#: the rule in one paragraph, for reports and docs/results/
RULE = ("A claim A > B is judged on its cells (dataset x held-out target) and the seeds both rows ran there: each "
        "gives a paired difference acc(A) - acc(B). It **holds** when the 95 % t confidence interval of the mean "
        "difference lies above 0, **fails** when it lies below 0, and is **within noise** when it contains 0; "
        "fewer than 2 pairs: not judged. The mean difference, its interval, the differences in favour of A and "
        "the exact two-sided sign test are given beside it; a verdict names its cells and claims nothing for others.")

STATUSES = ("holds", "fails", "within noise", "not judged")

#: a row whose mean source-validation accuracy is within this many points of chance "did not learn" (issues 51, 53):
#: the leaderboard does not rank it, and a claim on it reads :data:`NOT_LEARNED_STATUS`
NOT_LEARNED_MARGIN = 10.0
NOT_LEARNED_STATUS = "not judged (a row did not learn)"


def target_cell(dataset: str, target: str) -> str:
    """The cell of one held-out target, ``"digits4 → mnistm"``: the key (with a seed) of :data:`Accuracies`."""
    return f"{dataset} → {target}"


def source_cell(dataset: str, source: str) -> str:
    """The cell of one source domain of a single-source run, ``"digits4: mnist →"``, valued at the mean over the
    source's targets."""
    return f"{dataset}: {source} →"


def learned(source_val_percent: float, n_classes: int) -> bool:
    """Whether a row's source-validation accuracy (in percent) lies more than :data:`NOT_LEARNED_MARGIN`
    points above chance (100 / n_classes)."""
    return source_val_percent > 100.0 / n_classes + NOT_LEARNED_MARGIN


def not_learned_reason(rows: Mapping[str, float | None], n_classes: int | None) -> str:
    """Why a claim between ``rows`` (name -> mean source-validation accuracy in percent, None when unknown)
    cannot be judged: the rows that did not learn (:func:`learned`), in one phrase; "" when each learned
    or nothing is known."""
    if not n_classes:
        return ""
    chance = 100.0 / n_classes
    stuck = [f"{name} {value:.1f} %" for name, value in rows.items() if value is not None and not learned(value, n_classes)]
    if not stuck:
        return ""
    return (f"source validation {', '.join(stuck)}: within {NOT_LEARNED_MARGIN:.0f} points of chance "
            f"({chance:.0f} %), so the comparison says nothing about the methods")


def parse_ordering(claim: str) -> list[str]:
    """The rows of a claim ``"A > B"``, ``"A < B"`` or a chain ``"A > B > C"``, best first, spaces around the
    signs. Refused (a ConfigError naming the fix): no ordering, a mix of > and <, a row named twice
    (``"A > A"``, ``"A > B > A"``: an ordering cannot hold)."""
    import re

    from fedstyle.errors import ConfigError

    parts = [p.strip() for p in re.split(r"\s+([<>])\s+", claim.strip())]
    names, signs = parts[0::2], parts[1::2]
    if len(names) < 2 or len(signs) != len(names) - 1 or not all(names):
        raise ConfigError(f"--claim {claim!r} is not an ordering 'A > B' (rows named as in the table, "
                          "spaces around > or <)")
    if len(set(signs)) > 1:
        raise ConfigError(f"--claim {claim!r} mixes > and <; write the chain in one direction ('A > B > C')")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"--claim {claim!r} names {repeated[0]!r} twice; an ordering compares different rows "
                          "(e.g. 'A > B > C')")
    return names if signs[0] == ">" else names[::-1]

#: (cell, seed) -> accuracy in percent
Accuracies = Mapping[tuple[str, int], float]


@dataclass
class PairedVerdict:
    """The reading of one claim A > B on paired differences (see the module docstring)."""

    status: str
    cells: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    differences: list[float] = field(default_factory=list)
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    ahead: int = 0
    sign_p: float | None = None
    unpaired: int = 0

    @property
    def n(self) -> int:
        return len(self.differences)

    def interval(self) -> str:
        """The mean difference and its 95 % interval, "+3.5 [+1.5, +5.6]" (tables and claim lines); needs one."""
        return f"{self.mean:+.1f} [{self.low:+.1f}, {self.high:+.1f}]"

    def text(self) -> str:
        """One line: the mean difference, its interval, the count in favour, the sign test, the cells."""
        where = f"{', '.join(self.cells)}" if self.cells else "no cell"
        if self.mean is None:
            return f"no paired seeds ({where})"
        if self.low is None:
            body = f"{self.mean:+.1f} points, one paired seed: no interval"
        else:
            body = f"{self.mean:+.1f} points, 95 % CI [{self.low:+.1f}, {self.high:+.1f}]"
        body += f"; {self.ahead} of {self.n} pairs favour the claim"
        if self.sign_p is not None:
            body += f", sign test p = {self.sign_p:.2g}"
        body += f"; cells: {where}; seeds {', '.join(map(str, self.seeds))}"
        if self.unpaired:
            body += f"; {self.unpaired} unpaired run{'s' if self.unpaired > 1 else ''} left out"
        return body


def t_quantile(p: float, dof: int) -> float:
    """The p-quantile of Student's t with ``dof`` degrees of freedom (scipy)."""
    from scipy import stats

    return float(stats.t.ppf(p, dof))


def sign_test(differences: Sequence[float]) -> float | None:
    """Exact two-sided sign test p over the non-zero differences (ties dropped); None without any."""
    from scipy import stats

    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return None
    positive = sum(d > 0 for d in nonzero)
    return float(stats.binomtest(positive, len(nonzero), 0.5).pvalue)


def paired_differences(better: Accuracies, worse: Accuracies) -> tuple[list[tuple[str, int, float]], int]:
    """((cell, seed, acc(better) - acc(worse)) for every (cell, seed) both have, sorted; the count of the
    (cell, seed) entries only one of them has)."""
    common = sorted(set(better) & set(worse))
    unpaired = len(set(better) ^ set(worse))
    return [(cell, seed, better[(cell, seed)] - worse[(cell, seed)]) for cell, seed in common], unpaired


def judge_paired(better: Accuracies, worse: Accuracies, level: float = 0.95) -> PairedVerdict:
    """The rule (module docstring) applied to two rows' accuracies per (cell, seed)."""
    pairs, unpaired = paired_differences(better, worse)
    verdict = PairedVerdict("not judged", unpaired=unpaired)
    if not pairs:
        return verdict
    diffs = [d for _, _, d in pairs]
    verdict.cells = sorted({cell for cell, _, _ in pairs})
    verdict.seeds = sorted({seed for _, seed, _ in pairs})
    verdict.differences = diffs
    verdict.mean = statistics.fmean(diffs)
    verdict.ahead = sum(d > 0 for d in diffs)
    verdict.sign_p = sign_test(diffs)
    if len(diffs) < 2:
        return verdict
    half = t_quantile(0.5 + level / 2, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    verdict.low, verdict.high = verdict.mean - half, verdict.mean + half
    if verdict.low > 0:
        verdict.status = "holds"
    elif verdict.high < 0:
        verdict.status = "fails"
    else:
        verdict.status = "within noise"
    return verdict


def judge_chain(rows: Sequence[str], accuracies: Mapping[str, Accuracies]) -> list[tuple[str, str, PairedVerdict]]:
    """A chain claim "a > b > c" as its links (a, b), (b, c), each judged by :func:`judge_paired`."""
    return [(a, b, judge_paired(accuracies[a], accuracies[b])) for a, b in zip(rows, rows[1:])]


def claim_rows(table, claims: Sequence[str], resolve: Callable[[str], str] | None = None) -> list[list[str]]:
    """Each claim's rows as table labels, best first (:func:`parse_ordering`), every name turned into a row
    label by ``resolve`` (default: the label itself). Raises a ConfigError, before anything is judged or written,
    for a malformed claim, a name no row has (with "did you mean"), or a chain that names a row twice."""
    from fedstyle.errors import ConfigError
    from fedstyle.registry import did_you_mean

    labels = {label for row in table.rows for label in (row.label, row.display_label)}
    resolve = resolve or (lambda name: name)
    out = []
    for claim in claims:
        rows = []
        for name in parse_ordering(claim):
            label = resolve(name)
            if label not in labels:
                raise ConfigError(f"--claim {claim!r}: no row {name!r} in the table; {did_you_mean(name, labels)}"
                                  "its rows are " + ", ".join(repr(r.label) for r in table.rows))
            rows.append(label)
        if len(set(rows)) < len(rows):
            raise ConfigError(f"--claim {claim!r} names one row twice (as {', '.join(map(repr, rows))}); an "
                              "ordering compares different rows")
        out.append(rows)
    return out


def judge_labelled_claims(table, claims: Sequence[str], out: Path | None = None,
                          resolve: Callable[[str], str] | None = None) -> list[str]:
    """``fedstyle report --claim 'A > B'``: each claim (a chain allowed; rows named as :func:`claim_rows`
    resolves them) judged on ``table``'s rows (a :class:`~fedstyle.experiments.report.tabulate.Table`), one line
    per link; the verdicts also go to ``out`` as JSON. A link on a row that did not learn (:func:`learned`, when
    the table knows its class count) reads :data:`NOT_LEARNED_STATUS`."""
    import json

    from fedstyle.io import atomic_write_text

    by_label = {}
    for row in table.rows:
        by_label[row.label] = by_label[row.display_label] = row
    n_classes = getattr(table, "num_classes", None)
    lines, records = [], []
    for rows in claim_rows(table, claims, resolve):
        for better, worse in zip(rows, rows[1:]):
            verdict = judge_paired(by_label[better].cell_accuracies(table.dataset),
                                   by_label[worse].cell_accuracies(table.dataset))
            reason = not_learned_reason({name: by_label[name].source_val.mean for name in (better, worse)}, n_classes)
            if reason:
                verdict.status = NOT_LEARNED_STATUS
            text = f"{reason}; {verdict.text()}" if reason else verdict.text()
            lines.append(f"claim {better} > {worse}: {verdict.status} ({text})")
            records.append({"claim": f"{better} > {worse}", "status": verdict.status, "mean": verdict.mean,
                            "low": verdict.low, "high": verdict.high, "ahead": verdict.ahead, "pairs": verdict.n,
                            "sign_p": verdict.sign_p, "cells": verdict.cells, "seeds": verdict.seeds,
                            "differences": verdict.differences, "rule": RULE})
    if out is not None:
        atomic_write_text(out, json.dumps(records, indent=2) + "\n")
    return lines

