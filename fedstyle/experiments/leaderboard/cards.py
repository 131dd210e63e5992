"""Each method card's standing on the leaderboard: the block ``fedstyle leaderboard show`` writes between the
markers of docs/methods/<method>.md, so a card never quotes a reading the CSVs no longer give.

The block is a table with a line per row of the method on each leaderboard table (a method can have several:
FedAvg and FedAvg + RC on the single-source table), read from the same :class:`Board` as the page, and the links
of the papers' claims that involve one of those rows, as the claims table reads them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from fedstyle.experiments.leaderboard.board import Board, BoardRow, fmt
from fedstyle.experiments.leaderboard.claims import ClaimRow
from fedstyle.experiments.leaderboard.render import against_reference, seeds_text, standing

CARD_START, CARD_END = "<!-- leaderboard-rows:start -->", "<!-- leaderboard-rows:end -->"


def _place(board: Board, row: BoardRow) -> str:
    ranked = [r for r in board.ordered_rows() if r.ranked]
    return f"{ranked.index(row) + 1} of {len(ranked)}" if row in ranked else "—"


def _runs(board: Board, row: BoardRow) -> str:
    expected = len(board.cells) * len(board.seeds)
    missing = next((len(m.pairs) for m in board.missing if m.variant == row.variant), 0)
    return f"{expected - missing} of {expected}"


def _versus_baseline(board: Board, row: BoardRow) -> str:
    """The rule on this row > the table's plain baseline, naming the baseline (tables differ: FedAvg, DSGD)."""
    if board.reference is None:
        return "—"
    if row is board.reference:
        return "the baseline"
    return f"{board.reference.label}: {against_reference(board, row)[0]}"


def card_block(method: str, boards: Mapping[str, Board], claims: Sequence[ClaimRow]) -> str:
    """What docs/methods/<method>.md holds between :data:`CARD_START` and :data:`CARD_END`."""
    mine = [(board, row) for board in boards.values() for row in board.rows if row.method == method]
    datasets = list(dict.fromkeys(d for board in boards.values() for d in board.datasets))
    out = ["Its rows on the [leaderboard](../results/leaderboard.md), over every cell and seed there. "
           "`fedstyle leaderboard show` writes them from the per-seed CSVs:", ""]
    if not mine:
        return "\n".join(out[:1] + ["", "None: no leaderboard table has a row of this method."]) + "\n"
    head = (["Table", "Row", "Place"] + [f"{d} avg" for d in datasets]
            + ["Avg", "Src-val", "Seeds", "Runs", "vs best", "vs baseline"])
    out += ["| " + " | ".join(head) + " |", "|:--|:--|" + "--:|" * (len(head) - 5) + ":--|:--|:--|"]
    for board, row in mine:
        avg = f"**{fmt(row.average)}**" if row is board.best else fmt(row.average)
        cells = [board.title, row.label, _place(board, row)]
        cells += [fmt(row.dataset_average.get(d)) if d in board.datasets else "—" for d in datasets]
        cells += [avg, fmt(row.source_val_mean()), seeds_text(board, row), _runs(board, row), standing(board, row),
                  _versus_baseline(board, row)]
        out.append("| " + " | ".join(cells) + " |")
    links: dict[tuple[str, str, str], tuple[list[str], str]] = {}  # one line per link, naming every paper it is in
    for claim in claims:
        board = boards.get(claim.table)
        variants = {r.variant for r in board.rows if r.method == method} if board is not None else set()
        for link in claim.leaderboard.links:
            if variants & {link.better, link.worse}:
                papers, _ = links.setdefault((claim.table, link.better, link.worse), ([], link.text()))
                papers.append(claim.paper)
    out += ["", "Place: among the table's ranked rows, by Avg. vs best: the mean difference, best row minus this one, "
            "over the (cell, seed) pairs both have; its 95 % interval in brackets. vs baseline: this row minus the "
            "table's plain baseline over their pairs, with the rule's position: above, tied or below."]
    out += ["", "The papers' claims that involve these rows, on the leaderboard's cells:", ""]
    out += [f"- `{better} > {worse}` ({' and '.join(papers)}): {text}"
            for (_, better, worse), (papers, text) in links.items()] or ["- none"]
    return "\n".join(out) + "\n"
