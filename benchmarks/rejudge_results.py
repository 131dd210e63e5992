"""Re-read the verdicts of the results pages (docs/results/) whose per-seed target accuracies are written there, by the
rule of :mod:`fedstyle.experiments.verdict` (issue 35 §2), so the re-reading is one command:

    python benchmarks/rejudge_results.py            # every claim, one block each
    python benchmarks/rejudge_results.py --json     # the same as JSON (claim, cell, status, interval, ...)

Most run directories behind the results pages are gone, so the figures recorded there are the data: each
:class:`Recorded` row below holds one table row's per-seed accuracies (percent, seeds 0, 1, 2, as printed:
rounded to 0.1, so a difference may be 0.1 off the unrounded runs'), with the results page section and row
label it comes from. Before judging, the script checks that each row's per-seed figures are still printed on
that row of the results pages, and refuses (one line naming the row) when they are not: the file and this script
cannot drift apart silently.

A claim is judged per cell, each cell on its own seeds, and, where it spans several cells, over all of them
together ("all cells"): a verdict names the cells it was read on and says nothing for others. Verdicts whose
rows have only mean ± std in the results pages are not here (no pairs can be formed from a mean): by the rule they are
not judged, and the results pages marks each with "not judged by the rule: per-seed values not recorded (means only)".

Checked against the run directories where they survived (2026-11-26): every recorded figure
equals its run's ``summary.json`` to the printed 0.1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedstyle, not an installed one
from fedstyle.experiments.verdict import RULE, PairedVerdict, judge_paired  # noqa: E402

#: the results pages (docs/results/*.md, read as one text), or one Markdown file given with --results
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
SEEDS = (0, 1, 2)

STABLEFDG_34 = "### Φ from training batches, and the mended reference mode"
PARDON_34 = "### The reference mode's client style"


@dataclass(frozen=True)
class Recorded:
    """One the results pages table row's per-seed target accuracies: cell "dataset → target" -> seeds 0, 1, 2."""

    section: str  # the heading the table sits under
    label: str  # text that starts the row's first column (what the check looks for)
    cells: dict[str, tuple[float, ...]]

    def accuracies(self, cell: str | None = None) -> dict[tuple[str, int], float]:
        """(cell, seed) -> accuracy, for :func:`judge_paired`; one cell or all of them."""
        return {(name, seed): acc for name, values in self.cells.items() if cell in (None, name)
                for seed, acc in zip(SEEDS, values)}


ROWS = {
    "stablefdg-paper": Recorded(STABLEFDG_34, "**StableFDG, Φ from training batches**",
                                {"digits4 → mnistm": (30.8, 38.3, 34.0), "fashion4 → sketch": (19.1, 28.5, 25.3)}),
    "stablefdg-ref-before": Recorded(STABLEFDG_34, "StableFDG reference code, before the mend",
                                     {"digits4 → mnistm": (29.9, 38.8, 31.8), "fashion4 → sketch": (27.5, 31.0, 31.4)}),
    "stablefdg-ref": Recorded(STABLEFDG_34, "**StableFDG reference code, mended**",
                              {"digits4 → mnistm": (29.4, 37.3, 31.0), "fashion4 → sketch": (30.9, 37.1, 33.6)}),
    "pardon-ref": Recorded(PARDON_34, "PARDON reference code, pooled client style",
                           {"digits4 → mnistm": (22.8, 32.6, 28.2)}),
    "pardon-ref-mean": Recorded(PARDON_34, "PARDON reference code, mean of cluster styles (`client_style=mean`)",
                                {"digits4 → mnistm": (22.7, 32.1, 28.8)}),
}


@dataclass(frozen=True)
class Claim:
    """"better > worse" as the results pages states it (``where``: the bullet that states it)."""

    key: str
    text: str
    better: str
    worse: str
    where: str


CLAIMS = (
    Claim("stablefdg-mend", "StableFDG reference code: mended > before the mend", "stablefdg-ref",
          "stablefdg-ref-before", f'{STABLEFDG_34}, bullet "What the mended reference mode changed"'),
    Claim("stablefdg-code-vs-paper", "StableFDG: the authors' code (reference mode, mended) > the paper's reading "
          "(paper mode, Φ from training batches)", "stablefdg-ref", "stablefdg-paper",
          f'{STABLEFDG_34}, bullet "The authors\' choices against the paper\'s reading"'),
    Claim("pardon-client-style", "PARDON reference code: pooled client style > mean of cluster styles "
          "(client_style=mean)", "pardon-ref", "pardon-ref-mean", f'{PARDON_34}, bullet "The pooled client style '
          'changes nothing measurable here"'),
)


def results_text(path: Path) -> str:
    """The results as one text: a folder's Markdown pages in name order, or one file."""
    if path.is_dir():
        return "\n".join(page.read_text(encoding="utf-8") for page in sorted(path.glob("*.md")))
    return path.read_text(encoding="utf-8")


def row_line(text: str, row: Recorded) -> str | None:
    """The table line of ``row`` under its section in the results pages's ``text`` (None when either is missing)."""
    _, found, rest = text.partition("\n" + row.section + "\n")
    if not found:
        return None
    section = rest.split("\n## ")[0].split("\n### ")[0]
    return next((line for line in section.splitlines() if line.startswith(f"| {row.label} |")), None)


def check_recorded(text: str) -> list[str]:
    """One message per recorded row whose per-seed figures the results pages no longer prints on that row."""
    problems = []
    for key, row in ROWS.items():
        line = row_line(text, row)
        if line is None:
            problems.append(f"{key}: no row starting '| {row.label} |' under '{row.section}'")
            continue
        for cell, values in row.cells.items():
            printed = "(" + ", ".join(f"{v:.1f}" for v in values) + ")"
            if printed not in line:
                problems.append(f"{key}: {cell} {printed} is not on its row any more: {line.strip()}")
    return problems


def readings(claim: Claim) -> list[tuple[str, PairedVerdict]]:
    """(where, verdict): each cell of the claim on its own, then all its cells together if several."""
    better, worse = ROWS[claim.better], ROWS[claim.worse]
    cells = [c for c in better.cells if c in worse.cells]
    out = [(cell, judge_paired(better.accuracies(cell), worse.accuracies(cell))) for cell in cells]
    if len(cells) > 1:
        out.append(("all cells", judge_paired(better.accuracies(), worse.accuracies())))
    return out


def record(claim: Claim, where: str, verdict: PairedVerdict) -> dict:
    return {"claim": claim.key, "text": claim.text, "read_on": where, "status": verdict.status,
            "mean": verdict.mean, "low": verdict.low, "high": verdict.high, "ahead": verdict.ahead,
            "pairs": verdict.n, "sign_p": verdict.sign_p, "cells": verdict.cells, "seeds": verdict.seeds,
            "differences": [round(d, 2) for d in verdict.differences], "source": claim.where}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default docs/results) or page to check the figures against")
    parser.add_argument("--json", action="store_true", help="print the readings as JSON")
    args = parser.parse_args(argv)
    if not args.results.exists():
        parser.error(f"{args.results} does not exist; give --results docs/results (the folder) or one page")
    problems = check_recorded(results_text(args.results))
    if problems:
        print(f"rejudge_results: {len(problems)} recorded figure(s) no longer match {args.results} ("
              + "; ".join(problems) + "): update ROWS in benchmarks/rejudge_results.py", file=sys.stderr)
        return 2
    out = [record(c, where, v) for c in CLAIMS for where, v in readings(c)]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"The rule: {RULE}\n")
    for claim in CLAIMS:
        print(f"{claim.key}: {claim.text}\n  from docs/results {claim.where}")
        for where, verdict in readings(claim):
            diffs = ", ".join(f"{d:+.1f}" for d in verdict.differences)
            print(f"  {where}: {verdict.status} ({verdict.text()}; differences {diffs})")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
