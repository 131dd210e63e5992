"""The report's output: the table as terminal text, markdown, CSV and LaTeX, and :func:`write_report`,
which writes ``report.md``, ``report.csv``, ``report.tex`` and the figures (PNG and PDF) for a set of run
directories."""

from __future__ import annotations

import contextlib
import csv
import os
import warnings
from pathlib import Path
from typing import IO, Iterator, Sequence

from fedstyle.experiments.report.plots import plot_accuracy, plot_training
from fedstyle.experiments.report.runs import RunRecord, collect, environment_note
from fedstyle.experiments.rundir import evaluation_rows
from fedstyle.experiments.report.tabulate import (MISSING, Cell, Table, _setting_text, plan_rows,
                                                  results_table)
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


#: LaTeX's special characters and how to write them as text
_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$",
                  MISSING: "--", "★": r"$\star$"}
#: columns a one-column table holds at \small without scaling; wider ones are scaled to \columnwidth
ONE_COLUMN_WIDTH = 7


def latex_escape(text: str) -> str:
    r"""``text`` with LaTeX's special characters escaped (``_`` -> ``\_``, ``±`` -> ``$\pm$``)."""
    return "".join(_LATEX_ESCAPES.get(char, char) for char in str(text))


def _latex_cell(cell: Cell, best: float | None) -> str:
    """``mean`` with a small ``± std`` below the baseline of the text; the column's best mean in bold."""
    if cell.mean is None:
        return "--"
    mean = f"{cell.mean:.1f}"
    if best is not None and round(cell.mean, 1) == round(best, 1):
        mean = rf"\textbf{{{mean}}}"
    std = "" if cell.std is None else rf"{{\scriptsize\,$\pm${cell.std:.1f}}}"
    return mean + std + (r"$^{*}$" if cell.partial else "")


def to_latex(table: Table) -> str:
    """A booktabs table for a paper's single column: the method, the settings that differ, one column per
    held-out domain, Avg and the number of seeds, each column's best mean in bold. The costs (MB/run, s/run)
    and the source-validation column stay in report.md and report.csv: a column of a paper has room for the
    result. Needs ``\\usepackage{booktabs}`` (and ``graphicx`` when the table is scaled to the column)."""
    columns = ["Method", *table.setting_columns, *table.domains, "Avg", "n"]
    results = [*(lambda row, d=d: row.cells[d] for d in table.domains), lambda row: row.average]
    best = [max((m for m in (cell(row).mean for row in table.rows) if m is not None), default=None)
            for cell in results]
    body = []
    for row in table.rows:
        label = row.display_label if table.which == "selected" else row.label
        settings = (latex_escape(_setting_text(row.settings.get(k))) for k in table.setting_columns)
        cells = [latex_escape(label), *settings, *(_latex_cell(cell(row), top) for cell, top in zip(results, best)),
                 str(row.n)]
        body.append(" & ".join(cells) + r" \\")
    spec = "l" * (1 + len(table.setting_columns)) + "r" * (len(table.domains) + 2)
    tabular = [rf"\begin{{tabular}}{{@{{}}{spec}@{{}}}}", r"\toprule",
               " & ".join(latex_escape(c) for c in columns) + r" \\", r"\midrule", *body, r"\bottomrule",
               r"\end{tabular}"]
    if len(columns) > ONE_COLUMN_WIDTH:
        tabular = [r"\resizebox{\columnwidth}{!}{%", *tabular, "}"]
    notes = [latex_escape(note) for note in table.footnotes]
    if table.warning:
        notes.append(r"\textbf{Warning:} " + latex_escape(table.warning))
    # the caption less its clause on the source-validation column, which this table leaves out
    caption = "; ".join(part for part in table.caption.split("; ") if not part.startswith("Src-val"))
    caption = latex_escape(caption) + r" Bold: the best mean of a column."
    label = "tab:" + "".join(ch for ch in table.dataset.lower() if ch.isalnum())
    lines = ["% fedstyle report: \\usepackage{booktabs} (and graphicx for \\resizebox)",
             r"\begin{table}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             rf"\caption{{{caption}}}", rf"\label{{{label}}}", *tabular]
    if notes:
        lines += [r"\par\smallskip", r"\parbox{\columnwidth}{\footnotesize " + r" \\ ".join(notes) + "}"]
    return "\n".join([*lines, r"\end{table}"]) + "\n"


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
    """Write ``report.md``, ``report.csv``, ``report.tex`` (a booktabs table) and the figures
    ``accuracy.png`` and ``training.png`` (each with its PDF beside it) into ``out_dir``.

    Returns the table (for the CLI to print) and the written paths by kind ("markdown", "csv", "latex",
    "plot", "training"; the figures' PNGs); the figures are left out, with a warning, when no run logged
    per-round target accuracy.
    """
    out_dir = Path(out_dir)
    records = collect(run_dirs, include_incomplete=include_incomplete)
    table = results_table(records, which, order=order, dataset=dataset)
    records = [r for r in records if r.dataset == table.dataset]
    if table.warning:
        warnings.warn(table.warning, stacklevel=2)
    row_of = plan_rows(records).row_of
    environments = environment_note(records)
    if environments:
        warnings.warn(environments, stacklevel=2)
    paths = {"csv": to_csv(table, out_dir / "report.csv")}
    with _atomic_open(out_dir / "report.tex", "w") as file:
        file.write(to_latex(table))
    paths["latex"] = out_dir / "report.tex"
    # a run made with --target-eval end measured its targets at the end only: no curve, and a band over the
    # others' seeds would jump where it joined them at the last round
    curve_runs = [r for r in records if evaluation_rows(r.metrics)
                  and all("target_acc" in row for row in evaluation_rows(r.metrics))]
    end_only = [r for r in records if r not in curve_runs and r.config.get("target_eval") == "end"]
    no_rows = [r for r in records if r not in curve_runs and r not in end_only]
    left_out = "the figures leave them out" if curve_runs else "accuracy.png not written"
    if end_only:
        warnings.warn(f"{len(end_only)} of {len(records)} runs measured their targets at the end only "
                      f"(--target-eval end): {left_out}", stacklevel=2)
    if no_rows:  # their metrics.jsonl is empty or lacks the per-round accuracies: damaged, or cut short
        warnings.warn(f"{len(no_rows)} of {len(records)} runs have no per-round target accuracy in their "
                      f"metrics.jsonl (empty or damaged; first: {no_rows[0].path}): {left_out}", stacklevel=2)
    if any("target_acc" in row for r in curve_runs for row in r.metrics):
        paths["plot"] = plot_accuracy(curve_runs, out_dir / "accuracy.png", lambda run: row_of[run.path])
        paths["training"] = plot_training(curve_runs, out_dir / "training.png", lambda run: row_of[run.path])
    elif curve_runs:
        warnings.warn("no run logged per-round target_acc in metrics.jsonl; accuracy.png not written", stacklevel=2)

    sections = [f"# Results: {table.dataset}", "", to_markdown(table)]
    if environments:
        sections += [f"**Note:** {environments}.", ""]
    if "plot" in paths:
        sections += ["![Target accuracy per round (mean ± std over seeds)](accuracy.png)", "",
                     "![Training: target accuracy (★ selected round, dotted: chance), source-validation accuracy, "
                     "loss, accuracy against traffic](training.png)", ""]
    sections += [*_runs_section(records, out_dir), ""]
    with _atomic_open(out_dir / "report.md", "w") as file:
        file.write("\n".join(sections))
    paths["markdown"] = out_dir / "report.md"
    return table, paths
