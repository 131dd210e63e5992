"""The report's output: the table as terminal text, markdown and CSV, and :func:`write_report`,
which writes ``report.md``, ``report.csv`` and the plots for a set of run directories."""

from __future__ import annotations

import contextlib
import csv
import os
import warnings
from pathlib import Path
from typing import IO, Iterator, Sequence

from fedstyle.experiments.report.plots import plot_accuracy, plot_training
from fedstyle.experiments.report.runs import RunRecord, collect
from fedstyle.experiments.report.tabulate import Table, _setting_text, plan_rows, results_table
from fedstyle.io import atomic_open


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
