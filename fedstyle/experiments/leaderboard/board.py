"""A leaderboard table read from its kept CSV: rows x cells, averages, source validation, seeds, the best row and
the rows the paired rule cannot tell from it, the "not learned" rows, and the cells still missing.

Read from the CSV and the table's sweep file only (no registry, no data, no torch):

- a **cell** is a held-out target, ``dataset → target`` (tables of ``cell = "target"``), or a source domain,
  ``dataset: source →`` (single source), whose value per seed is the mean accuracy over the source's targets;
- a cell's value is the mean over its seeds (± their sample std); a row's **average** is the mean of its cell
  values, over every cell of the table (a row missing a cell has none, and is not ranked);
- **source validation** is the mean of the row's per-run source-validation accuracies on each dataset; a row
  whose mean on a dataset lies within :data:`~fedstyle.experiments.verdict.NOT_LEARNED_MARGIN` points of chance
  there did **not learn** (:func:`~fedstyle.experiments.verdict.learned`) and is not ranked;
- the **best** row is the ranked row of the highest average; every other ranked row is judged against it by
  :func:`~fedstyle.experiments.verdict.judge_paired` over the (cell, seed) pairs both have: unless "best > row"
  holds, the rule cannot tell the row from the best (**tied**);
- only lines of the sweep file's budget (its ``rounds``) count; lines of another budget are counted and left out.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from fedstyle.errors import ConfigError
from fedstyle.experiments.verdict import PairedVerdict, judge_paired, learned, source_cell, target_cell

#: (cell, seed) -> accuracy in percent
Values = dict[tuple[str, int], float]


@dataclass(frozen=True)
class Cell:
    dataset: str
    domain: str
    kind: str  # "target" or "source"

    @property
    def name(self) -> str:
        return (target_cell if self.kind == "target" else source_cell)(self.dataset, self.domain)

    @property
    def short(self) -> str:
        return self.domain if self.kind == "target" else f"{self.domain} →"


@dataclass
class BoardRow:
    variant: str
    label: str
    method: str
    values: Values = field(default_factory=dict)
    #: dataset -> the per-run source-validation accuracies
    source_val: dict[str, list[float]] = field(default_factory=dict)
    complete: bool = False
    not_learned_on: list[str] = field(default_factory=list)
    average: float | None = None
    dataset_average: dict[str, float | None] = field(default_factory=dict)
    rank: float | None = None
    #: best > this row, by the rule (None for the best row and unranked rows)
    versus_best: PairedVerdict | None = None
    #: this row > the table's reference row (FedAvg, DSGD), by the rule (None for the reference row itself)
    versus_reference: PairedVerdict | None = None

    @property
    def ranked(self) -> bool:
        return self.complete and not self.not_learned_on

    @property
    def tied(self) -> bool:
        return self.versus_best is not None and self.versus_best.status != "holds"

    def cell_seeds(self, cell: Cell) -> list[int]:
        return sorted(seed for name, seed in self.values if name == cell.name)

    def cell_mean(self, cell: Cell) -> float | None:
        vals = [v for (name, _), v in self.values.items() if name == cell.name]
        return statistics.fmean(vals) if vals else None

    def cell_std(self, cell: Cell) -> float | None:
        vals = [v for (name, _), v in self.values.items() if name == cell.name]
        return statistics.stdev(vals) if len(vals) > 1 else None

    def source_val_mean(self, dataset: str | None = None) -> float | None:
        if dataset is not None:
            vals = self.source_val.get(dataset, [])
            return statistics.fmean(vals) if vals else None
        means = [statistics.fmean(v) for v in self.source_val.values() if v]
        return statistics.fmean(means) if means else None


@dataclass
class Missing:
    """A row's runs the CSV lacks: (cell, seed) pairs, and the command that runs them."""

    variant: str
    label: str
    pairs: list[tuple[Cell, int]]
    command: str


@dataclass
class Board:
    key: str
    title: str
    description: str
    cells: list[Cell]
    seeds: list[int]
    rounds: int
    rows: list[BoardRow]
    missing: list[Missing] = field(default_factory=list)
    other_budget_lines: int = 0
    best: BoardRow | None = None
    friedman: Any = None  # fedstyle.experiments.leaderboard.ranks.RankResult
    csv: str = ""
    #: device -> (runs, seconds of run time) of the lines that count
    run_time: dict[str, list[float]] = field(default_factory=dict)
    #: row label -> the settings and hyperparameters its variant sets beside the table's base ("lr 0.0167")
    row_settings: dict[str, str] = field(default_factory=dict)
    #: the row every other is read against in the "vs" column (its plain baseline: FedAvg, DSGD); None: no column
    reference: BoardRow | None = None

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(c.dataset for c in self.cells))

    def ordered_rows(self) -> list[BoardRow]:
        """Ranked rows by average (best first), then the others by method."""
        ranked = sorted((r for r in self.rows if r.ranked), key=lambda r: -r.average)
        return ranked + [r for r in self.rows if not r.ranked]

    def runs_expected(self) -> int:
        return len(self.rows) * len(self.cells) * len(self.seeds)

    def runs_missing(self) -> int:
        return sum(len(m.pairs) for m in self.missing)


def table_spec(table_text: str, where: str) -> dict[str, Any]:
    """The sweep file's TOML as data (its rows, budget, datasets or sources)."""
    try:
        return tomllib.loads(table_text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where} is not valid TOML: {err}") from None


def expected_cells(spec: Mapping[str, Any], kind: str, datasets: Mapping[str, Mapping[str, Any]],
                   where: str) -> list[Cell]:
    """The table's cells, in the order of its datasets' domains (or of its source bundles)."""
    if kind == "source":
        return [Cell(b["dataset"], b["source"], "source") for b in spec.get("source_domain", [])]
    names = spec.get("dataset", spec.get("base", {}).get("dataset"))
    names = names if isinstance(names, list) else [names]
    cells = []
    for name in names:
        if name not in datasets:
            raise ConfigError(f"{where}: dataset {name!r} has no [datasets.{name}] in tables.toml (its domains)")
        cells += [Cell(name, domain, "target") for domain in datasets[name]["domains"]]
    return cells


def own_settings(variant: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """The run settings a table's row sets other than the table's base ("lr 0.0167"): what `fedstyle run --method
    NAME` with the table's settings would not do. A method's own options (``hparams``) are left to the sweep file:
    telling a pinned default from a change needs the method registry, which imports torch, and the page renders
    without it."""
    return [f"{k} {v}" for k, v in variant.items()
            if k not in ("name", "label", "method", "hparams") and base.get(k) != v]


def build_board(key: str, title: str, kind: str, table_text: str, lines: Sequence[Mapping[str, str]],
                datasets: Mapping[str, Mapping[str, Any]], *, where: str = "", rank: bool = True,
                reference: str | None = None) -> Board:
    """A :class:`Board` from a table's sweep file text and its CSV lines (see the module docstring); ``reference``:
    the variant every row is also judged against (tables.toml's ``reference``)."""
    spec = table_spec(table_text, where or key)
    cells = expected_cells(spec, kind, datasets, where or key)
    seeds = list(spec.get("seeds", [0]))
    rounds = int(spec["base"]["rounds"])
    rows = [BoardRow(v["name"], str(v.get("label", v["name"])), v["method"]) for v in spec.get("variant", [])]
    rows.sort(key=lambda row: row.method)  # by method (the registry's order), a method's rows in the file's order
    by_variant = {row.variant: row for row in rows}
    board = Board(key, title, str(spec.get("description", "")), cells, seeds, rounds, rows)
    for variant in spec.get("variant", []):
        own = own_settings(variant, spec.get("base", {}))
        if own:
            board.row_settings[str(variant.get("label", variant["name"]))] = ", ".join(own)
    by_name = {c.name: c for c in cells}
    per_source: dict[tuple[str, str, int], list[float]] = {}
    run_source_val: dict[tuple[str, str, str, int], float] = {}  # one value per run (a run has a line per target)
    seen_runs: set[tuple] = set()
    for line in lines:
        if int(line["rounds"]) != rounds:
            board.other_budget_lines += 1
            continue
        row = by_variant.get(line["variant"])
        if row is None:
            continue  # a row the table no longer has
        seed = int(line["seed"])
        run_id = (line["variant"], line["dataset"], line.get("source", ""), line["target"] if kind == "target" else "",
                  seed)
        if line.get("seconds") and run_id not in seen_runs:
            seen_runs.add(run_id)
            spent = board.run_time.setdefault(line.get("device") or "?", [0, 0.0])
            spent[0] += 1
            spent[1] += float(line["seconds"])
        if kind == "source":
            cell = Cell(line["dataset"], line["source"], "source")
            per_source.setdefault((row.variant, cell.name, seed), []).append(float(line["target_acc"]))
        else:
            cell = Cell(line["dataset"], line["target"], "target")
            if cell.name in by_name:
                row.values[(cell.name, seed)] = float(line["target_acc"])
        if line.get("source_val") and cell.name in by_name:
            run_source_val[(row.variant, line["dataset"], cell.name, seed)] = float(line["source_val"])
    for (variant, name, seed), accs in per_source.items():
        if name in by_name:
            by_variant[variant].values[(name, seed)] = statistics.fmean(accs)
    for (variant, dataset, _, _), value in sorted(run_source_val.items()):
        by_variant[variant].source_val.setdefault(dataset, []).append(value)
    if reference is not None:
        board.reference = by_variant.get(reference)
        if board.reference is None:
            raise ConfigError(f"{where or key}: its reference row {reference!r} (tables.toml) is not a row of the "
                              "table")
    _summarise(board, datasets)
    if rank:
        from fedstyle.experiments.leaderboard.ranks import rank_rows

        board.friedman = rank_rows(board)
    return board


def _summarise(board: Board, datasets: Mapping[str, Mapping[str, Any]]) -> None:
    for row in board.rows:
        means = {c.name: row.cell_mean(c) for c in board.cells}
        row.complete = all(m is not None for m in means.values())
        if row.complete:
            row.average = statistics.fmean(means.values())
        for dataset in board.datasets:
            mine = [means[c.name] for c in board.cells if c.dataset == dataset]
            row.dataset_average[dataset] = statistics.fmean(mine) if all(m is not None for m in mine) else None
            sv = row.source_val_mean(dataset)
            if sv is not None and not learned(sv, int(datasets[dataset]["classes"])):
                row.not_learned_on.append(dataset)
        missing = [(c, s) for c in board.cells for s in board.seeds if (c.name, s) not in row.values]
        if missing:
            command = f"fedstyle leaderboard run --only {board.key} --only variant={row.variant}"
            board.missing.append(Missing(row.variant, row.label, missing, command))
    ref = board.reference
    if ref is not None and ref.values:
        for row in board.rows:
            if row is not ref and row.values:
                row.versus_reference = judge_paired(row.values, ref.values)
    ranked = [r for r in board.rows if r.ranked]
    if ranked:
        board.best = max(ranked, key=lambda r: r.average)
        for row in ranked:
            if row is not board.best:
                row.versus_best = judge_paired(board.best.values, row.values)


def dataset_leaders(board: Board, dataset: str) -> tuple[BoardRow | None, list[BoardRow]]:
    """The ranked row of the best average on ``dataset``'s cells, and the ranked rows the rule cannot tell from it
    there (paired over that dataset's (cell, seed) pairs)."""
    ranked = [r for r in board.rows if r.ranked and r.dataset_average.get(dataset) is not None]
    if not ranked:
        return None, []
    best = max(ranked, key=lambda r: r.dataset_average[dataset])
    tied = [r for r in ranked if r is not best and dataset_gap(board, dataset, best, r).status != "holds"]
    return best, sorted(tied, key=lambda r: -r.dataset_average[dataset])


def dataset_gap(board: Board, dataset: str, better: BoardRow, worse: BoardRow):
    """The rule's paired verdict on ``better`` > ``worse`` over ``dataset``'s (cell, seed) pairs."""
    names = {c.name for c in board.cells if c.dataset == dataset}

    def only(row: BoardRow) -> Values:
        return {k: v for k, v in row.values.items() if k[0] in names}

    return judge_paired(only(better), only(worse))


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"
