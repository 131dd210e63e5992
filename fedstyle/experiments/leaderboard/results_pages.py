"""Each results page's reading of its papers' headline claims on the leaderboard: the line ``fedstyle leaderboard
show`` writes between a page's markers for a paper (:func:`markers`), so a page never quotes a reading the CSVs
no longer give. (Hand-written, docs/results/pardon.md still read PARDON > CCST on 12 pairs when the grid had 16.)

A page (docs/results/ccst.md, newer-methods.md, ...) opens with its own runs' reading; the block beside it gives
the leaderboard's, in the words of the claims at a glance (:mod:`~fedstyle.experiments.leaderboard.claims`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from fedstyle.experiments.leaderboard.board import Board
from fedstyle.experiments.leaderboard.claims import ClaimRow, Judgement


def markers(paper: str) -> tuple[str, str]:
    """The markers a results page puts around ``paper``'s line (the paper's name as claims.toml spells it)."""
    return f"<!-- leaderboard-claim:{paper}:start -->", f"<!-- leaderboard-claim:{paper}:end -->"


def labelled_reading(judgement: Judgement, label: Mapping[str, str]) -> tuple[str, str]:
    """(the claim with the table's row labels, its reading by the rule): one link's reading alone, a chain's link
    by link, or why nothing was judged."""
    names = " > ".join(label.get(n, n) for n in judgement.says.split(" > ")) if judgement.says else ""
    if len(judgement.links) == 1:
        return names, judgement.links[0].text()
    return names, link_by_link(judgement, label) or judgement.text()


def link_by_link(judgement: Judgement, label: Mapping[str, str]) -> str:
    """Each link of the claim with its reading, "A > B: holds (...); B > C: ..." (empty without links)."""
    return "; ".join(f"{label.get(l.better, l.better)} > {label.get(l.worse, l.worse)}: {l.text()}"
                     for l in judgement.links)


def bold_verdict(text: str) -> str:
    """A reading with its verdicts that decide (holds, fails) in bold, as the results pages write them."""
    for word in ("holds", "fails"):
        text = text.replace(f"{word} (", f"**{word}** (")
    return text


def claim_line(claim: ClaimRow, boards: Mapping[str, Board]) -> str:
    """What a results page holds between ``claim.paper``'s markers: the claim on the leaderboard, each link with
    its reading ("On the leaderboard (multi-source star): CCST > FedAvg: **holds** (+4.4 [+1.2, +7.6], 12
    pairs).")."""
    board = boards.get(claim.table)
    label = {r.variant: r.label for r in board.rows} if board is not None else {}
    where = board.title.lower() if board is not None else claim.table
    names, _ = labelled_reading(claim.leaderboard, label)
    reading = link_by_link(claim.leaderboard, label) or f"{names}: {claim.leaderboard.text()}"
    return (f"On the [leaderboard](leaderboard.md) ({where}), {claim.paper}'s claim: {bold_verdict(reading)} "
            f"([every paper's](index.md#claims-at-a-glance)).")
