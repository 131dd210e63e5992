"""The report of a sweep's finished runs: one per report group (its table, plots and, when the grid
names a paper, the paper's numbers and a verdict per claim), and with several groups an index joining them."""

from __future__ import annotations

import csv
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.grid import Plan, PlannedRun, group_folder, group_title
from fedstyle.experiments.rundir import DONE
from fedstyle.experiments.sweep.jobs import one_line
from fedstyle.io import atomic_open, atomic_write_text


@dataclass
class GroupReport:
    group: tuple[tuple[str, str], ...]
    folder: Path
    table: Any = None
    paths: dict[str, Path] = field(default_factory=dict)
    verdicts: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    finished: int = 0
    planned: int = 0


def _row_order(runs: Sequence[PlannedRun]) -> list[str]:
    order: list[str] = []
    for run in runs:
        try:
            label = json.loads((run.run_dir / "summary.json").read_text()).get("label")
        except (OSError, ValueError):
            continue
        if isinstance(label, str) and label not in order:
            order.append(label)
    return order


def write_sweep_report(plan: Plan, *, which: str = "selected") -> list[GroupReport]:
    """The report of each group of finished runs (one group: ``OUT/report.md``, ``.csv``, plots;
    several: ``OUT/reports/<group>/`` each, with ``OUT/report.md`` and ``OUT/report.csv`` joining them),
    and, when the grid names a paper, its numbers beside fedstyle's and a verdict per claim."""
    from fedstyle.experiments.paper import paper_section, row_stats, verdicts_json
    from fedstyle.experiments.report import to_markdown, write_report

    groups = plan.groups()
    single = len(groups) == 1
    reports: list[GroupReport] = []
    for group, runs in groups.items():
        folder = plan.out if single else plan.out / "reports" / group_folder(group)
        finished = [r for r in runs if (r.run_dir / DONE).exists()]
        report = GroupReport(group, folder, finished=len(finished), planned=len(runs))
        reports.append(report)
        if not finished:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                try:
                    report.table, report.paths = write_report([r.run_dir for r in finished], folder, which=which,
                                                              order=_row_order(finished))
                except ConfigError:  # the report split rows further than the sweep did: its own order
                    report.table, report.paths = write_report([r.run_dir for r in finished], folder, which=which)
            except FedstyleError as err:  # a damaged run directory: say so, report the other groups
                report.warnings.append(f"no report for {group_title(group)}: {one_line(err)}")
                continue
        report.warnings += [str(w.message).splitlines()[0] for w in caught]
        section, report.verdicts = paper_section(plan.grid.paper, plan.grid.claims, row_stats(runs, which),
                                                 plan.rows, runs[0].config.dataset, plan.grid.labels)
        grid = plan.grid
        about = ["## The sweep", "", f"{grid.where}" + (f", scale {grid.scale}" if grid.scale else "")
                 + (f" — {group_title(group)}" if not single else "") + f": {len(finished)} of {len(runs)} runs "
                 "finished." + (f" {grid.description}" if grid.description else ""), ""]
        markdown = report.paths["markdown"]
        atomic_write_text(markdown, markdown.read_text().rstrip("\n") + "\n\n" + "\n".join(about + section))
        if section:
            atomic_write_text(folder / "claims.json", json.dumps(verdicts_json(report.verdicts), indent=2) + "\n")
            report.paths["claims"] = folder / "claims.json"
    if not single:
        _write_index(plan, reports, to_markdown)
    return reports


def _write_index(plan: Plan, reports: Sequence[GroupReport], to_markdown) -> None:
    """OUT/report.md (every group's table and claims) and OUT/report.csv (every group's rows)."""
    grid = plan.grid
    lines = [f"# Sweep: {grid.title or grid.name or grid.where}", ""]
    if grid.description:
        lines += [grid.description, ""]
    for report in reports:
        lines += [f"## {group_title(report.group)}", ""]
        if report.table is None:
            lines += [f"No finished run yet ({report.planned} planned).", ""]
            continue
        rel = os.path.relpath(report.paths["markdown"], plan.out)
        lines += [to_markdown(report.table), f"Plots, runs and the paper comparison: [{rel}]({rel})", ""]
        if report.verdicts:
            held = sum(v.status == "holds" for v in report.verdicts)
            lines += [f"Claims: {held} of {sum(v.status != 'not run' for v in report.verdicts)} hold here:", ""]
            lines += [f"- {v.claim}: **{v.status}** ({v.text})" for v in report.verdicts] + [""]
    atomic_write_text(plan.out / "report.md", "\n".join(lines))
    header: list[str] = []
    rows: list[dict[str, str]] = []
    keys = list(dict.fromkeys(k for r in reports for k, _ in r.group))
    for report in reports:
        if "csv" not in report.paths:
            continue
        with open(report.paths["csv"], newline="") as file:
            reader = csv.DictReader(file)
            for name in reader.fieldnames or []:
                if name not in header:
                    header.append(name)
            for row in reader:
                rows.append({**dict(report.group), **row})
    with atomic_open(plan.out / "report.csv", "w") as file:
        writer = csv.DictWriter(file, fieldnames=keys + header, restval="")
        writer.writeheader()
        writer.writerows(rows)
