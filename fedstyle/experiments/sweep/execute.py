"""Running jobs on a launcher with a progress bar and a log (:func:`execute`), the Python API's
:func:`run_sweep`, and a planned sweep file end to end (:func:`dry_run`, :func:`run_plan`)."""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.grid import Plan
from fedstyle.experiments.sweep.jobs import Job, RunResult
from fedstyle.experiments.sweep.launchers import LocalLauncher, RayLauncher
from fedstyle.experiments.sweep.reports import GroupReport, write_sweep_report
from fedstyle.io import DirectoryLock, LockedError, atomic_write_text

LOG_NAME = "sweep.log"
MARKER_NAME = ".fedstyle-sweep"


# ----------------------------------------------------------------------------- running jobs


@dataclass
class SweepOutcome:
    finished: list[RunResult] = field(default_factory=list)
    skipped: list[RunResult] = field(default_factory=list)
    failed: list[RunResult] = field(default_factory=list)
    locked: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.locked


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


def execute(jobs: Sequence[Job], launcher: LocalLauncher | RayLauncher | None = None, *, quiet: bool = False,
            log_file: Path | None = None, marker: Path | None = None,
            echo: Callable[[str], None] = _stderr) -> SweepOutcome:
    """Run ``jobs`` on ``launcher`` with a progress bar over runs (done / running / failed, elapsed,
    estimated time left); failures and runs in use elsewhere are reported one line each as they come."""
    from tqdm.auto import tqdm

    launcher = launcher or LocalLauncher()
    outcome = SweepOutcome()
    start = time.perf_counter()
    if not jobs:
        return outcome
    bar = tqdm(total=len(jobs), desc="runs", unit="run", disable=quiet, file=sys.stderr, smoothing=0,
               dynamic_ncols=True)

    def say(text: str) -> None:
        if quiet:
            echo(text)
        else:
            bar.write(text, file=sys.stderr)

    def status() -> None:
        left = len(jobs) - bar.n
        parts = [f"done {len(outcome.finished) + len(outcome.skipped)}", f"running {min(launcher.slots, left)}",
                 f"failed {len(outcome.failed)}"]
        if outcome.locked:
            parts.append(f"in use {len(outcome.locked)}")
        bar.set_postfix_str(", ".join(parts), refresh=True)

    status()
    try:
        for result in launcher.results(list(jobs), str(marker) if marker else None):
            {"done": outcome.finished, "skipped": outcome.skipped, "failed": outcome.failed,
             "locked": outcome.locked}[result.status].append(result)
            if result.status == "failed":
                say(f"failed: {result.name}: {result.error}")
            elif result.status == "locked":
                say(f"in use: {result.name}: {result.error} (not retried)")
            if log_file is not None:
                _log(log_file, result)
            bar.update(1)
            status()
    finally:
        bar.close()
        outcome.seconds = time.perf_counter() - start
    return outcome


def _log(path: Path, result: RunResult) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    lines = [f"{stamp} {result.status} {result.name} ({result.seconds:.0f} s on {result.host})"
             + (f": {result.error}" if result.error else "")]
    if result.detail:
        lines += ["    " + line for line in result.detail.rstrip().splitlines()]
    try:
        with open(path, "a") as file:
            file.write("\n".join(lines) + "\n")
    except OSError:
        pass


# ----------------------------------------------------------------------------- the Python API's jobs, run


def run_sweep(jobs: Sequence[Job], *, workers: int = 1, log: Callable[[str], None] = print,
              quiet: bool = False) -> float:
    """Run ``jobs`` (serially, or in ``workers`` spawned processes); returns the wall time in seconds.

    A failing job does not stop the others; when some failed (or were in use by another process),
    a FedstyleError naming them is raised after all have run.
    """
    outcome = execute(jobs, LocalLauncher(workers), quiet=quiet, echo=log)
    if outcome.failed or outcome.locked:
        first = (outcome.failed or outcome.locked)[0]
        raise FedstyleError(f"{len(outcome.failed)} run(s) failed and {len(outcome.locked)} were in use by another "
                            f"process; first: {first.name}: {first.error}")
    return outcome.seconds


# ----------------------------------------------------------------------------- a sweep file, end to end


def probe_lock(run_dir: Path) -> str | None:
    """The holder of ``run_dir``'s lock when another process runs it now, else None."""
    if not run_dir.is_dir():
        return None
    try:
        with DirectoryLock(run_dir):
            return None
    except LockedError as err:
        return str(err)
    except OSError:
        return None


def describe_plan(plan: Plan) -> str:
    counts = plan.counts()
    scale = f" (scale {plan.grid.scale})" if plan.grid.scale else ""
    return (f"{plan.grid.where}{scale}: {len(plan.runs)} runs in {plan.out} — {counts['done']} done, "
            f"{counts['resume']} to resume, {counts['new']} new")


def dry_run(plan: Plan, echo: Callable[[str], None] = print) -> None:
    """The runs, one line each (status, folder, row, and ``data missing`` for a run whose images are not
    there: a plan made without data), and how many are done."""
    echo(describe_plan(plan))
    for dataset, reason in {r.config.dataset: r.data_missing for r in plan.runs if r.data_missing}.items():
        echo(f"data missing: {dataset}: {reason}")
    width = max(len(r.rel) for r in plan.runs)
    for run in plan.runs:
        status = run.status
        if status != "done" and probe_lock(run.run_dir):
            status = "running"  # held by another process now
        echo(f"  {status:<8} {run.rel:<{width}}  {run.row_label}" + ("  (data missing)" if run.data_missing else ""))


def run_plan(plan: Plan, launcher: LocalLauncher | RayLauncher | None = None, *, quiet: bool = False,
             report_only: bool = False, echo: Callable[[str], None] = print) -> tuple[SweepOutcome, list[GroupReport]]:
    """Run the plan's unfinished runs, then write the report. Returns the outcome and the group reports."""
    launcher = launcher or LocalLauncher()
    jobs = [Job(r.run_dir, r.config, r.rel) for r in plan.runs if r.status != "done"]
    outcome = SweepOutcome()
    if jobs and not report_only:
        if isinstance(launcher, RayLauncher):
            launcher.check()
        try:
            plan.out.mkdir(parents=True, exist_ok=True)
            marker = plan.out / MARKER_NAME
            atomic_write_text(marker, f"{socket.gethostname()} {os.getpid()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        except OSError as err:
            raise ConfigError(f"cannot write to --out {plan.out}: {err.strerror or err}") from None
        if not quiet:
            _stderr(f"{describe_plan(plan)}; running {len(jobs)} on {launcher.describe()}")
        outcome = execute(jobs, launcher, quiet=quiet, log_file=plan.out / LOG_NAME,
                          marker=marker if isinstance(launcher, RayLauncher) else None)
    reports = write_sweep_report(plan)
    return outcome, reports
