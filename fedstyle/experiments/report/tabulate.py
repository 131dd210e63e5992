"""Aggregating runs into the paper-style table: :func:`results_table`, with :class:`Table` of :class:`Row` of :class:`Cell`.

:func:`plan_rows` decides which row each run fills and which settings the rows share or differ in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from fedstyle.errors import ConfigError, DataError
from fedstyle.experiments.report.runs import WHICH, RunRecord
from fedstyle.experiments.verdict import target_cell

SELECTION_RULES = {
    "source_val": "best mean source-validation accuracy",
    "heldout_val": "best accuracy on a held-out validation domain",
    "last": "last round, no selection",
    "oracle": "selected on the target — optimistic",
}
MISSING = "—"
PARTIAL_MARK = "*"
PARTIAL_FOOTNOTE = (
    f"{PARTIAL_MARK} fewer seeds than n (domain columns), or averaged over only the held-out "
    "domains that seed has (Avg)."
)


@dataclass(frozen=True)
class Cell:
    """Per-seed accuracies in percent; shown as mean ± sample std (ddof=1) over seeds."""

    values: tuple[float, ...] = ()
    partial: bool = False

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) >= 2 else None

    def text(self) -> str:
        if not self.values:
            return MISSING
        body = f"{self.mean:.1f}" if self.std is None else f"{self.mean:.1f} ± {self.std:.1f}"
        return body + (PARTIAL_MARK if self.partial else "")


@dataclass(frozen=True)
class Row:
    label: str
    seeds: tuple[int, ...]
    selections: tuple[str, ...]
    cells: dict[str, Cell]
    average: Cell
    settings: dict[str, object] = field(default_factory=dict)
    megabytes: Cell = field(default_factory=Cell)
    seconds: Cell = field(default_factory=Cell)
    #: mean source-validation accuracy (percent) of the same models, per seed (mean over its runs)
    source_val: Cell = field(default_factory=Cell)
    #: seed -> target domain -> accuracy (percent): what claims are judged on (fedstyle.experiments.verdict)
    by_seed: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.seeds)

    def cell_accuracies(self, dataset: str) -> dict[tuple[str, int], float]:
        """(cell "dataset → target", seed) -> accuracy, for :func:`fedstyle.experiments.verdict.judge_paired`."""
        return {(target_cell(dataset, domain), seed): acc for seed, domains in self.by_seed.items()
                for domain, acc in domains.items()}

    @property
    def display_label(self) -> str:
        if len(self.selections) > 1:
            return f"{self.label} (mixed selection: {', '.join(self.selections)})"
        return self.label


@dataclass(frozen=True)
class Table:
    """Rows = methods, columns = held-out domains + Avg + n (number of seeds)."""

    dataset: str
    which: str
    domains: tuple[str, ...]
    rows: tuple[Row, ...]
    caption: str
    footnotes: tuple[str, ...] = field(default=())
    #: settings that differ between rows, shown as columns after the method
    setting_columns: tuple[str, ...] = field(default=())
    #: said when rows differ in more than the method
    warning: str = ""
    #: the dataset's class count (chance = 100 / num_classes %), None when the runs do not say
    num_classes: int | None = None

    @property
    def header(self) -> list[str]:
        return ["Method", *self.setting_columns, *self.domains, "Avg", "Src-val", "n", "MB/run", "s/run"]

    def text_rows(self) -> list[list[str]]:
        # Selection rules do not matter for last-round accuracy, so only "selected" flags mixtures.
        return [
            [
                row.display_label if self.which == "selected" else row.label,
                *(_setting_text(row.settings.get(k)) for k in self.setting_columns),
                *(row.cells[d].text() for d in self.domains),
                row.average.text(),
                row.source_val.text(),
                str(row.n),
                _cost_text(row.megabytes, "{:.1f}"),
                _cost_text(row.seconds, "{:.0f}"),
            ]
            for row in self.rows
        ]


def _cost_text(cell: Cell, fmt: str) -> str:
    return MISSING if cell.mean is None else fmt.format(cell.mean)


def _setting_text(value: object) -> str:
    return MISSING if value is None else str(value)


@dataclass(frozen=True)
class RowPlan:
    """Which row each run fills, the settings all runs share, and those that differ between rows."""

    row_of: dict[Path, str]
    shared: dict[str, object]
    differing: list[str]
    row_settings: dict[str, dict[str, object]]
    warning: str


def plan_rows(records: Sequence[RunRecord]) -> RowPlan:
    """Rows are labels; runs of one label with different settings become rows of their own, named by
    the settings that tell them apart. Settings that differ between rows (other than the method's own
    hyperparameters) become columns, with a warning: the rows then compare more than methods."""
    settings = {r.path: r.settings() for r in records}
    unset = object()
    by_label: dict[str, list[RunRecord]] = {}
    for record in records:
        by_label.setdefault(record.label, []).append(record)
    row_of: dict[Path, str] = {}
    for label, group in by_label.items():
        keys = sorted({k for r in group for k in settings[r.path]})
        varying = [k for k in keys if len({repr(settings[r.path].get(k, unset)) for r in group}) > 1]
        for record in group:
            suffix = ", ".join(f"{k}={settings[record.path].get(k, MISSING)}" for k in varying)
            row_of[record.path] = f"{label} ({suffix})" if suffix else label
    keys = sorted({k for s in settings.values() for k in s if not k.startswith("hp.")})
    shared, differing = {}, []
    for key in keys:
        values = {repr(s.get(key, unset)) for s in settings.values()}
        if len(values) == 1:
            value = next(iter(settings.values())).get(key, unset)
            if value is not unset and value is not None:
                shared[key] = value
        else:
            differing.append(key)
    row_settings = {}
    for record in records:
        row_settings.setdefault(row_of[record.path], {k: settings[record.path].get(k) for k in differing})
    warning = (f"the rows differ in more than the method: {', '.join(differing)} (shown as columns); "
               "compare them with care" if differing and len(row_settings) > 1 else "")
    return RowPlan(row_of, shared, differing, row_settings, warning)


def _ordered(seen: Iterable[str], given: Sequence[str] | None, what: str) -> list[str]:
    """``given`` first (each must exist), then the rest in order of first appearance."""
    seen = list(dict.fromkeys(seen))
    given = list(given or [])
    unknown = [name for name in given if name not in seen]
    if unknown:
        raise ConfigError(f"unknown {what} {unknown} in the requested order; the runs have: {seen}")
    return given + [name for name in seen if name not in given]


def _select_dataset(records: Sequence[RunRecord], dataset: str | None) -> tuple[str, list[RunRecord]]:
    datasets = list(dict.fromkeys(r.dataset for r in records))
    if dataset is None:
        if len(datasets) > 1:
            raise ConfigError(f"the runs span datasets {datasets}; report one at a time (pass dataset=...)")
        if not datasets:
            raise DataError("no runs to report (were they all incomplete?)")
        dataset = datasets[0]
    chosen = [r for r in records if r.dataset == dataset]
    if not chosen:
        raise DataError(f"no runs on dataset {dataset!r}; the runs have {datasets}")
    return dataset, chosen


def _selection_caption(rows: Sequence[Row], which: str) -> str:
    if which == "last":
        return "model: last round (no model selection)"
    by_rule: dict[str, list[str]] = {}
    for row in rows:
        for rule in row.selections:
            by_rule.setdefault(rule, []).append(row.label)
    parts = [f"{rule} ({SELECTION_RULES.get(rule, 'unknown rule')})" for rule in by_rule]
    if len(by_rule) == 1:
        return f"model selection: {parts[0]}"
    return "model selection: " + "; ".join(
        f"{part} for {', '.join(labels)}" for part, labels in zip(parts, by_rule.values())
    )


def results_table(
    records: Sequence[RunRecord],
    which: str = "selected",
    *,
    order: Sequence[str] | None = None,
    domains: Sequence[str] | None = None,
    dataset: str | None = None,
) -> Table:
    """Aggregate runs into one row per method label and one column per held-out domain.

    ``which`` picks the selected-round ("selected") or last-round ("last") accuracy; ``order``
    and ``domains`` put the listed rows/columns first (the rest follow in order of appearance);
    ``dataset`` is required only when the runs span several datasets.
    """
    if which not in WHICH:
        raise ConfigError(f"which must be one of {sorted(WHICH)}, got {which!r}")
    dataset, records = _select_dataset(records, dataset)

    plan = plan_rows(records)
    # row -> seed -> domain -> accuracy (percent); source paths to report duplicates.
    grouped: dict[str, dict[int, dict[str, float]]] = {}
    sources: dict[tuple[str, int, str], Path] = {}
    selections: dict[str, dict[str, None]] = {}
    costs: dict[str, tuple[list[float], list[float]]] = {}
    source_val: dict[str, dict[int, list[float]]] = {}  # row -> seed -> its runs' source-val accuracy (%)
    for record in records:
        row_key = plan.row_of[record.path]
        selections.setdefault(row_key, {})[record.selection] = None
        per_seed = grouped.setdefault(row_key, {}).setdefault(record.seed, {})
        megabytes, seconds = costs.setdefault(row_key, ([], []))
        if isinstance(record.summary.get("bytes_up"), (int, float)):
            megabytes.append((record.summary["bytes_up"] + record.summary.get("bytes_down", 0)) / 1e6)
        if isinstance(record.summary.get("seconds"), (int, float)):
            seconds.append(float(record.summary["seconds"]))
        fitted = record.source_val_accuracy(which)
        if fitted is not None:
            source_val.setdefault(row_key, {}).setdefault(record.seed, []).append(100.0 * fitted)
        for domain, accuracy in record.target_accuracy(which).items():
            key = (row_key, record.seed, domain)
            if key in sources:
                raise DataError(
                    f"two runs report {row_key!r} seed {record.seed} on target {domain!r} with the same settings: "
                    f"{sources[key]} and {record.path}; pass only one of them, or name them apart "
                    "with `fedstyle run --label`"
                )
            sources[key] = record.path
            per_seed[domain] = 100.0 * accuracy

    columns = _ordered((d for r in records for d in r.target_accuracy(which)), domains, "domains")
    rows = []
    for label in _ordered(grouped, order, "methods"):
        per_seed = grouped[label]
        seeds = tuple(sorted(per_seed))
        cells = {}
        for domain in columns:
            values = tuple(per_seed[s][domain] for s in seeds if domain in per_seed[s])
            cells[domain] = Cell(values, partial=0 < len(values) < len(seeds))
        averages = tuple(statistics.fmean(per_seed[s].values()) for s in seeds if per_seed[s])
        every_column = all(set(columns) <= set(per_seed[s]) for s in seeds)
        megabytes, seconds = costs[label]
        rows.append(Row(label, seeds, tuple(selections[label]), cells, Cell(averages, not every_column),
                        settings=plan.row_settings[label], megabytes=Cell(tuple(megabytes)),
                        seconds=Cell(tuple(seconds)),
                        source_val=Cell(tuple(statistics.fmean(v) for _, v in sorted(source_val.get(label, {}).items()))),
                        by_seed={s: dict(per_seed[s]) for s in seeds}))

    caption = (
        f"{dataset}: accuracy (%) on each held-out target domain, mean ± sample std over n seeds; "
        f"Src-val: the same models' mean accuracy on the source domains' validation split; "
        f"{_selection_caption(rows, which)}."
    )
    has_partial = any(c.partial for row in rows for c in (*row.cells.values(), row.average))
    footnotes = (PARTIAL_FOOTNOTE,) if has_partial else ()
    if plan.shared:
        footnotes += ("Settings all rows share: " + ", ".join(f"{k} {v}" for k, v in plan.shared.items()) + ".",)
    classes = {r.summary.get("num_classes") for r in records} - {None}
    return Table(dataset, which, tuple(columns), tuple(rows), caption, footnotes,
                 setting_columns=tuple(plan.differing), warning=plan.warning,
                 num_classes=classes.pop() if len(classes) == 1 else None)
