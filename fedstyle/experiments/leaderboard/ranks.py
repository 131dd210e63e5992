"""Ranks across a table's cells: the average rank of each ranked row, the Friedman test, and the Nemenyi critical
difference (Demšar, "Statistical comparisons of classifiers over multiple data sets", JMLR 7, 2006), computed by
``autorank`` (Herbold 2020, the package made for this; forced to its non-parametric path, Friedman + Nemenyi, which
is Demšar's procedure); the diagram is drawn in :mod:`~fedstyle.experiments.leaderboard.cdplot`.

The blocks are the table's cells (a held-out target, or a source), each row's value there the mean over its seeds,
as Demšar ranks methods over data sets; the rows are the ranked ones (complete and learned). Rank 1 is the best.
The critical difference is CD = q_alpha sqrt(k (k + 1) / (6 N)) for k rows and N cells (Demšar's Eq. 5).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

#: the Friedman test's and Nemenyi's level
ALPHA = 0.05
#: autorank's smallest number of blocks
MIN_BLOCKS = 5
#: Friedman and Nemenyi compare at least 3 rows; with 2, autorank switches to a paired test and gives no critical
#: difference (the table's "vs best" column already pairs two rows by the rule)
MIN_ROWS = 3


@dataclass
class RankResult:
    #: label -> average rank (1 = best), best first
    mean_ranks: dict[str, float] = field(default_factory=dict)
    pvalue: float | None = None
    cd: float | None = None
    blocks: int = 0
    note: str = ""

    @property
    def significant(self) -> bool:
        return self.pvalue is not None and self.pvalue < ALPHA

    def text(self) -> str:
        if self.pvalue is None:
            return self.note
        return (f"Friedman test over {self.blocks} cells and {len(self.mean_ranks)} rows: p = {self.pvalue:.2g}"
                f" ({'the rows differ' if self.significant else 'no difference shown'} at {ALPHA}); Nemenyi's "
                f"critical difference CD = {self.cd:.2f} ranks")


def rank_rows(board) -> RankResult:
    """The ranks of ``board``'s ranked rows over its cells (see the module docstring)."""
    rows = [r for r in board.rows if r.ranked]
    blocks = len(board.cells)
    if len(rows) < MIN_ROWS or blocks < MIN_BLOCKS:
        return RankResult(blocks=blocks, note=f"ranks need {MIN_ROWS} ranked rows and {MIN_BLOCKS} cells "
                          f"(this table: {len(rows)} ranked rows, {blocks} cells)")
    import pandas as pd
    from autorank import autorank

    frame = pd.DataFrame({r.label: [r.cell_mean(c) for c in board.cells] for r in rows},
                         index=[c.name for c in board.cells])
    with contextlib.redirect_stdout(io.StringIO()):  # autorank prints its choice of test
        result = autorank(frame, alpha=ALPHA, verbose=False, force_mode="nonparametric", order="descending")
    ranks = result.rankdf["meanrank"].sort_values()
    return RankResult(mean_ranks={str(k): float(v) for k, v in ranks.items()}, pvalue=float(result.pvalue),
                      cd=float(result.cd), blocks=blocks)
