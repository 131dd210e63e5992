"""The papers' claims at a glance: one headline claim per paper (benchmarks/leaderboard/claims.toml), judged by
:func:`~fedstyle.experiments.verdict.judge_paired` on the leaderboard's cells, on the pretrained track's per-seed
files and on the paper's preset run from scratch; a chain "A > B > C" is judged link by link. A row whose source
validation lies within 10 points of chance on a dataset did not learn: a link with it reads
:data:`~fedstyle.experiments.verdict.NOT_LEARNED_STATUS`; no per-seed values: "not judged" and why.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedstyle.errors import ConfigError
from fedstyle.experiments.leaderboard.tables import read_toml
from fedstyle.experiments.verdict import NOT_LEARNED_STATUS, PairedVerdict, judge_paired, learned

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
CLAIMS_FILE = "claims.toml"


@dataclass
class Link:
    better: str
    worse: str
    status: str
    verdict: PairedVerdict | None = None

    def text(self) -> str:
        v = self.verdict
        if v is None or v.low is None:
            return self.status
        return f"{self.status} ({v.interval()}, {v.n} pairs)"


@dataclass
class Judgement:
    """One claim on one set of per-seed results."""

    says: str
    links: list[Link] = field(default_factory=list)
    note: str = ""
    sources: list[str] = field(default_factory=list)

    def text(self) -> str:
        if self.note:
            return self.note
        if len(self.links) == 1:
            return self.links[0].text()
        return "; ".join(f"{l.better} > {l.worse}: {l.text()}" for l in self.links)

    def statuses(self) -> list[str]:
        return [l.status for l in self.links]


@dataclass
class ClaimRow:
    paper: str
    headline: str
    source: str
    leaderboard: Judgement
    pretrained: Judgement
    preset_runs: Judgement
    #: the leaderboard table the claim is judged on (its links name that table's variants)
    table: str = ""

    def evidence(self) -> str:
        files = self.leaderboard.sources + self.pretrained.sources + self.preset_runs.sources
        return ", ".join(f"`{f}`" for f in dict.fromkeys(files)) or "—"


def chain(says: str) -> list[tuple[str, str]]:
    names = [n.strip() for n in says.split(" > ")]
    if len(names) < 2 or not all(names):
        raise ConfigError(f"claim {says!r} is not 'A > B' or 'A > B > C' (spaces around >)")
    return list(zip(names, names[1:]))


#: name -> ((cell, seed) -> accuracy, dataset -> mean source validation) of one row, or None when absent
Lookup = Mapping[str, tuple[dict, dict[str, float]] | None]


def judge(says: str, lookup, classes: Mapping[str, int], sources: list[str],
          absent_word: str = "its files have no row of") -> Judgement:
    out = Judgement(says, sources=sources)
    for better, worse in chain(says):
        rows = {name: lookup(name) for name in (better, worse)}
        absent = [name for name, row in rows.items() if row is None]
        if absent:
            out.links.append(Link(better, worse, f"not judged ({absent_word} {', '.join(absent)})"))
            continue
        unlearned = [name for name, (_, sv) in rows.items()
                     if any(not learned(v, classes.get(d, 10)) for d, v in sv.items())]
        if unlearned:
            out.links.append(Link(better, worse, f"{NOT_LEARNED_STATUS}: {', '.join(unlearned)}"))
            continue
        verdict = judge_paired(rows[better][0], rows[worse][0])
        out.links.append(Link(better, worse, verdict.status, verdict))
    return out


def csv_lookup(lines: Sequence[Mapping[str, str]]):
    """Rows of per-seed CSV lines by label (cells as :func:`~fedstyle.experiments.report.per_seed.accuracies`
    pairs them)."""
    from fedstyle.experiments.report.per_seed import accuracies

    def lookup(label: str):
        mine = [l for l in lines if l["label"] == label]
        if not mine:
            return None
        values = accuracies(mine, label)
        sv: dict[str, list[float]] = {}
        for l in mine:
            if l.get("source_val"):
                sv.setdefault(l["dataset"], []).append(float(l["source_val"]))
        return values, {d: statistics.fmean(v) for d, v in sv.items()}
    return lookup


def board_lookup(board):
    """Rows of a leaderboard table by variant name."""
    by_variant = {r.variant: r for r in board.rows}

    def lookup(variant: str):
        if variant not in by_variant:
            raise ConfigError(f"claims.toml: the {board.key} table has no row {variant!r}; its rows: "
                              f"{', '.join(by_variant)}")
        row = by_variant[variant]
        if not row.values:
            return None
        return row.values, {d: row.source_val_mean(d) for d in row.source_val}
    return lookup


def _preset_claim(preset: str, says: str) -> Mapping[str, Any]:
    path = PRESETS_DIR / f"{preset}.toml"
    data = read_toml(path)
    for claim in data.get("claim", []):
        if claim.get("says") == says:
            return claim
    raise ConfigError(f"claims.toml: preset {preset} has no claim {says!r}; its claims: "
                      + "; ".join(c.get("says", "") for c in data.get("claim", [])))


def claim_rows(boards: Mapping[str, Any], grid_dir: Path, csv_dir: Path, classes: Mapping[str, int]
               ) -> list[ClaimRow]:
    """The table's rows from claims.toml, the boards (table key -> Board) and the per-seed CSVs."""
    from fedstyle.experiments.report.per_seed import COLUMNS as PER_SEED_COLUMNS, read_rows

    data = read_toml(Path(grid_dir) / CLAIMS_FILE)
    rows = []
    for paper in data.get("paper", []):
        claim = _preset_claim(paper["preset"], paper["preset_claim"])
        lb = paper["leaderboard"]
        board = boards[lb["table"]]
        leaderboard = judge(lb["says"], board_lookup(board), classes, [f"benchmarks/per_seed/{board.csv}.csv"],
                            absent_word="no leaderboard run yet of")
        judged = []
        for key in ("pretrained", "preset_runs"):
            entry = paper[key]
            if not entry.get("csv"):
                why = entry.get("why", "no per-seed values")
                judged.append(Judgement(entry.get("says", ""), note=f"not judged ({why})"))
                continue
            lines = [line for name in entry["csv"]
                     for line in read_rows(Path(csv_dir) / f"{name}.csv", PER_SEED_COLUMNS)]
            judged.append(judge(entry["says"], csv_lookup(lines), classes,
                                [f"benchmarks/per_seed/{name}.csv" for name in entry["csv"]]))
        rows.append(ClaimRow(paper["name"], claim["says"], str(claim.get("source", "")), leaderboard, *judged,
                             table=lb["table"]))
    return rows


def claims_markdown(rows: Sequence[ClaimRow]) -> str:
    lines = ["| Paper | Headline claim (its preset's) | Leaderboard | Pretrained track | Preset, from scratch | "
             "Evidence |", "|:--|:--|:--|:--|:--|:--|"]
    for row in rows:
        lines.append(f"| {row.paper} | `{row.headline}` ({row.source}) | {row.leaderboard.text()} | "
                     f"{row.pretrained.text()} | {row.preset_runs.text()} | {row.evidence()} |")
    return "\n".join(lines) + "\n"
