"""A :class:`~fedstyle.experiments.leaderboard.board.Board` written out: Markdown (the page, the README's table),
CSV and LaTeX; the same columns in each.

Columns: the row, its average rank, one column per cell (mean ± sample std over its seeds), the average per
dataset and over every cell, source validation, the seeds per cell, the row's standing against the best by
the paired rule, and its position against the table's plain baseline (FedAvg, DSGD) by the same rule. The best
average is in bold; a row the rule cannot tell from the best reads "tied" with the mean difference and its 95 %
interval; a row that did not learn, or misses cells, is not ranked and says why.
"""

from __future__ import annotations

import csv
import io

from fedstyle.experiments.leaderboard.board import Board, BoardRow, fmt

STANDING_HELP = ("**vs best**: the best row minus this row, the mean over the (cell, seed) pairs both have, with its "
                 "95 % t interval in brackets. *Tied*: the interval contains 0, so the rule cannot tell the row from "
                 "the best. *Below*: the interval lies above 0, so the best row leads.")


def reference_help(board: Board) -> str:
    """The legend of the "vs <plain baseline>" column, naming the table's own baseline; empty without one."""
    if board.reference is None:
        return ""
    name = board.reference.label
    return (f"**vs {name}**: the other way round, this row minus {name}, the mean and 95 % interval over their "
            f"pairs. *Above*: the interval lies above 0 (the rule's row > {name} holds). *Tied*: it contains 0. "
            "*Below*: it lies below 0.")


#: the rule's verdict on "row > baseline" in the words of the vs-baseline column
POSITION = {"holds": "above", "within noise": "tied", "fails": "below"}


def reference_header(board: Board) -> list[str]:
    """The "vs <plain baseline>" column's header; none where the table names no reference row."""
    return [] if board.reference is None else [f"vs {board.reference.label}"]


def against_reference(board: Board, row: BoardRow) -> list[str]:
    """The "vs <plain baseline>" cell: the rule's verdict on ``row`` > the reference, with its interval."""
    if board.reference is None:
        return []
    if row is board.reference:
        return ["baseline"]
    v = row.versus_reference
    if v is None or v.low is None:
        return ["not judged"]
    return [f"{POSITION[v.status]}: {v.interval()}"]


def seeds_text(board: Board, row: BoardRow) -> str:
    counts = [len(row.cell_seeds(c)) for c in board.cells]
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}–{high}"


def standing(board: Board, row: BoardRow) -> str:
    if row.not_learned_on:
        return f"not learned ({', '.join(row.not_learned_on)}): not ranked"
    if not row.complete:
        return "cells missing: not ranked"
    if row is board.best:
        return "best"
    v = row.versus_best
    if v is None or v.low is None:
        return "not judged"
    word = "tied" if row.tied else "below"
    return f"{word}: {v.interval()}"


def cell_text(board: Board, row: BoardRow, cell) -> str:
    mean, std = row.cell_mean(cell), row.cell_std(cell)
    if mean is None:
        return "—"
    return f"{mean:.1f} ± {std:.1f}" if std is not None else f"{mean:.1f}"


def header(board: Board, compact: bool = False) -> list[str]:
    """The columns; ``compact`` leaves out the per-cell ones (the README's table)."""
    cells = [] if compact else [c.short for c in board.cells]
    return (["Method", "Rank"] + cells + [f"{d} avg" for d in board.datasets]
            + ["Avg", "Src-val", "Seeds", "vs best"] + reference_header(board))


def row_cells(board: Board, row: BoardRow, bold=lambda text: f"**{text}**", compact: bool = False) -> list[str]:
    rank = board.friedman.mean_ranks.get(row.label) if board.friedman else None
    avg = fmt(row.average)
    if row is board.best:
        avg = bold(avg)
    cells = [] if compact else [cell_text(board, row, c) for c in board.cells]
    return ([row.label, fmt(rank, 2)] + cells + [fmt(row.dataset_average.get(d)) for d in board.datasets]
            + [avg, fmt(row.source_val_mean()), seeds_text(board, row), standing(board, row)]
            + against_reference(board, row))


def markdown_table(board: Board, compact: bool = False) -> str:
    """The table as Markdown (rows best first; see the module docstring); ``compact``: without the per-cell
    columns, the averages only (the README's table)."""
    head = header(board, compact)
    text_columns = 1 + len(reference_header(board))  # vs best, vs the baseline: left-aligned words
    lines = ["| " + " | ".join(head) + " |", "|:--|" + "--:|" * (len(head) - 1 - text_columns) + ":--|" * text_columns]
    for row in board.ordered_rows():
        lines.append("| " + " | ".join(row_cells(board, row, compact=compact)) + " |")
    return "\n".join(lines) + "\n"


def text_table(board: Board) -> str:
    """The README's compact table as aligned plain text, for the terminal (``fedstyle leaderboard show``)."""
    rows = [header(board, compact=True)]
    rows += [row_cells(board, row, bold=lambda text: text, compact=True) for row in board.ordered_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    words = {0} | set(range(len(widths) - 1 - len(reference_header(board)), len(widths)))  # left-aligned columns

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in words else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join(line(r) for r in rows) + "\n"


def csv_table(board: Board) -> str:
    """The table as CSV: numbers unrounded, each cell's mean, std and seeds in three columns."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    cell_cols = [f"{c.name} {part}" for c in board.cells for part in ("mean", "std", "seeds")]
    writer.writerow(["method", "label", "rank"] + cell_cols + [f"{d} avg" for d in board.datasets]
                    + ["avg", "source_val", "ranked", "standing"]
                    + (["versus_reference"] if board.reference is not None else []))
    for row in board.ordered_rows():
        rank = board.friedman.mean_ranks.get(row.label) if board.friedman else None
        cells = []
        for c in board.cells:
            cells += [_num(row.cell_mean(c)), _num(row.cell_std(c)), len(row.cell_seeds(c))]
        writer.writerow([row.method, row.label, _num(rank)] + cells
                        + [_num(row.dataset_average.get(d)) for d in board.datasets]
                        + [_num(row.average), _num(row.source_val_mean()), row.ranked, standing(board, row)]
                        + against_reference(board, row))
    return buffer.getvalue()


def _num(value) -> str:
    return "" if value is None else f"{value:.4f}"


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("→", r"$\to$"), ("—", "--"), ("–", "--")):
        text = text.replace(a, b)
    return text


def latex_table(board: Board) -> str:
    """The table as a LaTeX tabular (booktabs), the best average in bold."""
    head = header(board)
    text_columns = 1 + len(reference_header(board))
    lines = [r"\begin{tabular}{l" + "r" * (len(head) - 1 - text_columns) + "l" * text_columns + "}", r"\toprule",
             " & ".join(_tex(h) for h in head) + r" \\", r"\midrule"]
    avg_column = head.index("Avg")
    for row in board.ordered_rows():
        cells = [_tex(c) for c in row_cells(board, row, bold=lambda text: text)]
        if row is board.best:
            cells[avg_column] = r"\textbf{" + cells[avg_column] + "}"
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
