"""The README's "leading here" line under each method family: the family's ranked row of the best average on the
leaderboard table tables.toml names for it, and that row against the table's reference row (FedAvg, DSGD) by the
paired rule. ``fedstyle leaderboard show --readme README.md`` writes each line between its family's markers, so
the README never quotes a leader the CSVs no longer give.

A family is the registry's (``Algorithm.family``); which method has which is passed in (the command line reads it
from its catalog, a test from the registry), so rendering needs neither torch nor the registry.
"""

from __future__ import annotations

from typing import Mapping

from fedstyle.errors import ConfigError
from fedstyle.experiments.leaderboard.board import Board, BoardRow
from fedstyle.experiments.verdict import judge_paired


def markers(family: str) -> tuple[str, str]:
    """The README's markers around ``family``'s line."""
    return f"<!-- leading:{family}:start -->", f"<!-- leading:{family}:end -->"


def family_tables(meta: Mapping[str, Mapping]) -> dict[str, str]:
    """family -> the table its line reads (tables.toml's ``families`` per table); a family named twice is refused."""
    out: dict[str, str] = {}
    for key, entry in meta.items():
        for family in entry.get("families", []):
            if family in out:
                raise ConfigError(f"tables.toml: family {family!r} is in both [{out[family]}] and [{key}]; "
                                  "give it one table")
            out[family] = key
    return out


def _reference(board: Board, variant: str) -> BoardRow | None:
    return next((r for r in board.rows if r.variant == variant), None)


def leading_line(board: Board, methods: set[str], reference: str) -> str:
    """The line for the family of ``methods`` on ``board``; ``reference``: the variant every leader is read
    against."""
    ranked = [r for r in board.rows if r.method in methods and r.ranked]
    if not ranked:
        return f"No row of this family is ranked on the leaderboard's {board.title.lower()} table yet."
    leader = max(ranked, key=lambda r: r.average)
    text = f"Leading here on the leaderboard ({board.title.lower()}): {leader.label}, average {leader.average:.1f}."
    ref = _reference(board, reference)
    if ref is None or ref is leader or not ref.values:
        return text
    v = judge_paired(leader.values, ref.values)
    if v.low is None:
        return text + f" Against {ref.label}: not judged ({v.n} pairs)."
    return (text + f" Its gain over {ref.label}: {v.status}, {v.mean:+.1f} points, CI [{v.low:+.1f}, "
            f"{v.high:+.1f}], {v.n} pairs.")


def readme_lines(boards: Mapping[str, Board], meta: Mapping[str, Mapping], family_of: Mapping[str, str]
                 ) -> dict[str, str]:
    """family -> its line, for every family tables.toml gives a table (``family_of``: method -> family)."""
    out = {}
    for family, key in family_tables(meta).items():
        board = boards[key]
        methods = {m for m, f in family_of.items() if f == family}
        reference = str(meta[key].get("reference", "fedavg"))
        out[family] = leading_line(board, methods, reference)
    return out
