"""Paper-style results from finished run directories: a table of held-out-domain accuracy and curves.

A run directory holds ``config.json``, ``metrics.jsonl`` (one evaluation per line),
``summary.json`` (the selected and last-round target accuracies) and a ``done`` marker written
last. :func:`collect` loads runs, :func:`results_table` aggregates them into one row per method
(``summary["label"]``) and one column per held-out domain, :func:`plot_accuracy` draws target
accuracy per round, and :func:`write_report` writes ``report.md``, ``report.csv`` and
``accuracy.png``.

Aggregation rules (stated in the table caption and footnotes):

* a cell is the mean ± sample standard deviation (ddof=1) over seeds of the accuracy in percent;
  with a single seed only the mean is shown; ``—`` marks a domain the method never reached;
* leave-one-domain-out sweeps (one target per run) are merged: runs of one label and seed with
  different targets fill the columns of one row; two runs giving the same label, seed and target
  are an error rather than a silent choice;
* ``Avg`` is computed per seed (mean over that seed's domain columns), then mean ± std over seeds.
  If some seed lacks a column, its average covers only the domains it has and the cell is marked
  ``*``; a domain cell with fewer seeds than the row's ``n`` is marked ``*`` too;
* what is compared is said: the settings every run shares are listed under the table; settings
  that differ between rows become columns (with a warning when rows differ in more than the
  method), and runs of one label with different settings become separate rows (``FedProx
  (hp.mu=0.1)``); ``fedstyle run --label NAME`` (and sweep variant names) name a row;
* ``MB/run`` and ``s/run`` are the mean bytes sent (up + down) and wall seconds of a row's runs.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

from fedstyle.errors import ConfigError, DataError
from fedstyle.experiments.plots import plot_accuracy, plot_training
from fedstyle.io import atomic_open

SELECTION_RULES = {
    "source_val": "best mean source-validation accuracy",
    "heldout_val": "best accuracy on a held-out validation domain",
    "last": "last round, no selection",
    "oracle": "selected on the target — optimistic",
}
WHICH = {"selected": "model chosen by the run's selection rule", "last": "last round"}
MISSING = "—"
PARTIAL_MARK = "*"
PARTIAL_FOOTNOTE = (
    f"{PARTIAL_MARK} fewer seeds than n (domain columns), or averaged over only the held-out "
    "domains that seed has (Avg)."
)
#: config keys that do not make two runs' results different settings (where and how a run ran, its
#: name, what the table shows as columns or rows anyway)
NOT_SETTINGS = frozenset({"seed", "targets", "device", "backend", "label", "data_root", "skip_bad_images",
                          "allow_oracle", "selection", "method", "ray_address", "client_cpus", "client_gpus",
                          "state_budget"})


# ----------------------------------------------------------------------------- loading runs


@dataclass(frozen=True)
class RunRecord:
    """One run directory: its resolved config, summary, per-evaluation metrics, and completeness."""

    path: Path
    config: dict
    summary: dict
    metrics: list[dict]
    complete: bool

    @property
    def method(self) -> str:
        return self.summary["method"]

    @property
    def label(self) -> str:
        return self.summary.get("label") or self.summary["method"]

    def settings(self) -> dict[str, object]:
        """The run's comparable settings: config.json without where and how it ran, the method's
        hyperparameters as ``hp.NAME``."""
        out = {k: _plain(v) for k, v in self.config.items() if k not in NOT_SETTINGS and k != "hparams"}
        out.update({f"hp.{k}": _plain(v) for k, v in (self.config.get("hparams") or {}).items()})
        return out

    @property
    def dataset(self) -> str:
        return self.summary["dataset"]

    @property
    def seed(self) -> int:
        return self.summary["seed"]

    @property
    def selection(self) -> str:
        return self.summary["selection"]

    def target_accuracy(self, which: str) -> dict[str, float]:
        """Held-out domain -> accuracy (fraction) of the ``which`` ("selected"/"last") model."""
        return {
            domain: entry[which]
            for domain, entry in self.summary["targets"].items()
            if entry.get(which) is not None
        }

    def source_val_accuracy(self, which: str) -> float | None:
        """Mean source-validation accuracy (fraction) of the ``which`` model: the evaluation of the
        selected round ("selected") or the last evaluation ("last"); None when the metrics lack it.
        Beside the target accuracy it tells underfitting (both low) from a domain gap (only the target)."""
        rows = [r for r in self.metrics if isinstance(r.get("source_val_acc"), dict) and r["source_val_acc"]
                and "round" in r]
        if which == "selected":
            rows = [r for r in rows if r["round"] == self.summary.get("selected_round")]
        if not rows:
            return None
        values = [v for v in rows[-1]["source_val_acc"].values() if isinstance(v, (int, float))]
        return statistics.fmean(values) if values else None


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} is missing; is {path.parent} a fedstyle run directory?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error}); re-run or delete that run") from None
    if not isinstance(value, dict):
        raise DataError(f"{path} should hold a JSON object, found {type(value).__name__}")
    return value


def _read_metrics(path: Path, complete: bool) -> list[dict]:
    if not path.is_file():
        return []
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise DataError(f"{path} is not a text file (a damaged or foreign metrics.jsonl); re-run that run") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise json.JSONDecodeError("not a JSON object", line, 0)
            rows.append(row)
        except json.JSONDecodeError as error:
            # A run that stopped mid-write can leave a truncated last line; anything else is damage.
            if not complete and number == len(lines):
                break
            raise DataError(f"{path} line {number} is not valid JSON ({error}); re-run that run") from None
    return rows


def _is_accuracy(value: object) -> bool:
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
    )


def _validate_summary(summary: dict, path: Path) -> None:
    for key in ("method", "dataset", "seed", "selection", "targets"):
        if key not in summary:
            raise DataError(f"{path} lacks the key {key!r}; it was not written by this fedstyle runner")
    if not isinstance(summary["seed"], int) or isinstance(summary["seed"], bool):
        raise DataError(f"{path}: 'seed' should be an integer, found {summary['seed']!r}")
    targets = summary["targets"]
    if not isinstance(targets, dict):
        raise DataError(f"{path}: 'targets' should map each held-out domain to its accuracies")
    for domain, entry in targets.items():
        if not isinstance(entry, dict) or not all(_is_accuracy(entry.get(k)) for k in WHICH):
            raise DataError(
                f"{path}: targets[{domain!r}] should be {{'selected': acc, 'last': acc}} with "
                f"accuracies as fractions in [0, 1], found {entry!r}"
            )


def load_run(run_dir: Path) -> RunRecord:
    """Load one run directory (it must contain ``summary.json``)."""
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json")
    _validate_summary(summary, run_dir / "summary.json")
    config_path = run_dir / "config.json"
    config = _read_json(config_path) if config_path.exists() else {}
    complete = (run_dir / "done").exists()
    metrics = _read_metrics(run_dir / "metrics.jsonl", complete)
    return RunRecord(path=run_dir, config=config, summary=summary, metrics=metrics, complete=complete)


def _find_run_dirs(roots: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(dirs with summary.json, dirs with metrics.jsonl but no summary.json) under ``roots``."""
    found: dict[Path, None] = {}
    unfinished: dict[Path, None] = {}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise DataError(f"run directory {root} does not exist (or is not a directory)")
        if (root / "summary.json").is_file():
            found.setdefault(root.resolve(), None)
            continue
        for summary in sorted(root.rglob("summary.json")):
            found.setdefault(summary.parent.resolve(), None)
        for metrics in sorted(root.rglob("metrics.jsonl")):
            if not (metrics.parent / "summary.json").exists():
                unfinished.setdefault(metrics.parent.resolve(), None)
    return list(found), list(unfinished)


def collect(run_dirs: Sequence[str | os.PathLike], *, include_incomplete: bool = False) -> list[RunRecord]:
    """Load the runs in ``run_dirs``: run directories, or folders searched recursively for them.

    Runs without the ``done`` marker are skipped with a warning that lists them, unless
    ``include_incomplete``. Folders holding metrics but no ``summary.json`` yet (still running or
    crashed) cannot be tabulated and are only listed in a warning.
    """
    if not run_dirs:
        raise ConfigError("no run directories given; pass run directories or a folder containing them")
    found, unfinished = _find_run_dirs(Path(d) for d in run_dirs)
    if unfinished:
        listing = "\n  ".join(str(d) for d in unfinished)
        warnings.warn(
            f"{len(unfinished)} run(s) have no summary.json yet (still running or crashed) and are "
            f"not reported:\n  {listing}",
            stacklevel=2,
        )
    if not found:
        roots = ", ".join(str(d) for d in run_dirs)
        raise DataError(f"no run directories (with summary.json) under {roots}; check the path")
    records = [load_run(d) for d in found]
    incomplete = [r for r in records if not r.complete]
    if incomplete and not include_incomplete:
        listing = "\n  ".join(str(r.path) for r in incomplete)
        warnings.warn(
            f"skipping {len(incomplete)} incomplete run(s) without a 'done' marker "
            f"(include them with include_incomplete=True / --include-incomplete):\n  {listing}",
            stacklevel=2,
        )
        records = [r for r in records if r.complete]
    return records


# ----------------------------------------------------------------------------- the table


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

    @property
    def n(self) -> int:
        return len(self.seeds)

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


def _plain(value: object) -> object:
    """A setting as a hashable, printable value (lists become comma-joined strings)."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return value


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
                        source_val=Cell(tuple(statistics.fmean(v) for _, v in sorted(source_val.get(label, {}).items())))))

    caption = (
        f"{dataset}: accuracy (%) on each held-out target domain, mean ± sample std over n seeds; "
        f"Src-val: the same models' mean accuracy on the source domains' validation split; "
        f"{_selection_caption(rows, which)}."
    )
    has_partial = any(c.partial for row in rows for c in (*row.cells.values(), row.average))
    footnotes = (PARTIAL_FOOTNOTE,) if has_partial else ()
    if plan.shared:
        footnotes += ("Settings all rows share: " + ", ".join(f"{k} {v}" for k, v in plan.shared.items()) + ".",)
    return Table(dataset, which, tuple(columns), tuple(rows), caption, footnotes,
                 setting_columns=tuple(plan.differing), warning=plan.warning)


# ----------------------------------------------------------------------------- rendering


def to_text(table: Table) -> str:
    """Plain-text table for the terminal: caption, aligned columns, footnotes."""
    lines = [table.header, *table.text_rows()]
    widths = [max(len(line[i]) for line in lines) for i in range(len(table.header))]

    def render(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(line[1:], widths[1:]))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    warning = [f"warning: {table.warning}"] if table.warning else []
    return "\n".join([table.caption, "", render(table.header), rule, *map(render, lines[1:]), *table.footnotes,
                      *warning])


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown: caption paragraph, table, footnotes."""

    def escape(text: str) -> str:  # "*" would start emphasis or a bullet list
        return text.replace("|", r"\|").replace("*", r"\*")

    def render(line: list[str]) -> str:
        return "| " + " | ".join(map(escape, line)) + " |"

    alignment = "|:--" + "|--:" * (len(table.header) - 1) + "|"
    body = [render(table.header), alignment, *map(render, table.text_rows())]
    notes = ["", *map(escape, table.footnotes)] if table.footnotes else []
    if table.warning:
        notes += ["", f"**Warning:** {escape(table.warning)}"]
    return "\n".join([f"**Table.** {table.caption}", "", *body, *notes]) + "\n"


@contextlib.contextmanager
def _atomic_open(path: Path, mode: str) -> Iterator[IO]:
    """Open a temporary file beside ``path``; it replaces ``path`` only if the block succeeds."""
    with atomic_open(path, mode) as file:
        yield file


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def to_csv(table: Table, path: str | os.PathLike) -> Path:
    """CSV with ``<domain>_mean`` / ``<domain>_std`` columns (percent; empty when undefined)."""
    path = Path(path)
    header = ["method", "selection", *table.setting_columns]
    for name in (*table.domains, "avg", "source_val"):
        header += [f"{name}_mean", f"{name}_std"]
    header += ["n", "mb_per_run", "seconds_per_run"]
    with _atomic_open(path, "w") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for row in table.rows:
            line = [row.label, "+".join(row.selections), *(_setting_text(row.settings.get(k)) for k in
                                                            table.setting_columns)]
            for cell in (*(row.cells[d] for d in table.domains), row.average, row.source_val):
                line += [_number(cell.mean), _number(cell.std)]
            writer.writerow([*line, row.n, _number(row.megabytes.mean), _number(row.seconds.mean)])
    return path


# ----------------------------------------------------------------------------- the report


def _runs_section(records: Sequence[RunRecord], out_dir: Path) -> list[str]:
    lines = ["## Runs", ""]
    for record in sorted(records, key=lambda r: (r.label, r.seed, tuple(r.summary["targets"]))):
        targets = ", ".join(record.summary["targets"])
        where = os.path.relpath(record.path, out_dir.resolve())
        status = "" if record.complete else " (incomplete)"
        lines.append(
            f"- {record.label}, seed {record.seed}, target {targets}, selection {record.selection}, "
            f"round {record.summary.get('selected_round', '?')}{status}: `{where}`"
        )
    return lines


def write_report(
    run_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    which: str = "selected",
    include_incomplete: bool = False,
    order: Sequence[str] | None = None,
    dataset: str | None = None,
) -> tuple[Table, dict[str, Path]]:
    """Write ``report.md``, ``report.csv`` and ``accuracy.png`` into ``out_dir``.

    Returns the table (for the CLI to print) and the written paths by kind ("markdown", "csv",
    "plot"); the plot is left out, with a warning, when no run logged per-round target accuracy.
    """
    out_dir = Path(out_dir)
    records = collect(run_dirs, include_incomplete=include_incomplete)
    table = results_table(records, which, order=order, dataset=dataset)
    records = [r for r in records if r.dataset == table.dataset]
    if table.warning:
        warnings.warn(table.warning, stacklevel=2)
    row_of = plan_rows(records).row_of
    paths = {"csv": to_csv(table, out_dir / "report.csv")}
    if any("target_acc" in row for r in records for row in r.metrics):
        paths["plot"] = plot_accuracy(records, out_dir / "accuracy.png", lambda run: row_of[run.path])
        paths["training"] = plot_training(records, out_dir / "training.png", lambda run: row_of[run.path])
    else:
        warnings.warn("no run logged per-round target_acc in metrics.jsonl; accuracy.png not written", stacklevel=2)

    sections = [f"# Results: {table.dataset}", "", to_markdown(table)]
    if "plot" in paths:
        sections += ["![Target accuracy per round (mean ± std over seeds)](accuracy.png)", "",
                     "![Training: target accuracy (★ selected round, dotted: chance), source-validation accuracy, "
                     "loss, accuracy against traffic](training.png)", ""]
    sections += [*_runs_section(records, out_dir), ""]
    with _atomic_open(out_dir / "report.md", "w") as file:
        file.write("\n".join(sections))
    paths["markdown"] = out_dir / "report.md"
    return table, paths
