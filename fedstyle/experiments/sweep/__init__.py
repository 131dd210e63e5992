"""A grid of runs, run once each: planned by fedstyle, executed by local worker processes or by Ray.

Two ways in:

- a sweep file (``fedstyle sweep FILE.toml``, ``fedstyle reproduce PAPER``): :func:`load_grid` and
  :func:`plan_grid` (:mod:`fedstyle.experiments.grid`) expand and validate it, :func:`run_plan`
  runs what is not finished and writes the report;
- Python (the benchmark scripts): :class:`Variant`, :func:`plan_jobs` (``OUT/<variant>/seed<k>/<target>``)
  and :func:`run_sweep`.

Either way finished runs (``done`` marker) are skipped, interrupted ones resumed from their
checkpoint, a failing run is reported with its error (one line; the traceback goes to
``OUT/sweep.log``) and does not stop the others, and a run directory another process holds
(:class:`~fedstyle.io.DirectoryLock`) is reported as in use, not retried.

Launchers: :class:`LocalLauncher` runs the jobs in this process (``workers=1``) or in ``workers``
spawned processes (several per GPU for small models; each gets an equal share of the CPU threads,
and with several GPUs worker *i* uses GPU *i* mod count). :class:`RayLauncher` submits each run as a
Ray task (``num_cpus``/``num_gpus`` per run) to a local Ray instance it starts, or to a running
cluster (``address="auto"`` or ``HOST:PORT``); the run directories must then lie on a filesystem
every node sees at the same path (a shared filesystem: NFS, Lustre, a cloud file share), and every
node needs fedstyle installed. Ray schedules; fedstyle only plans and collects.

The package: :mod:`~fedstyle.experiments.sweep.jobs` (a job and one attempt at it),
:mod:`~fedstyle.experiments.sweep.launchers` (where the jobs run: worker processes or Ray),
:mod:`~fedstyle.experiments.sweep.execute` (running them all with progress, a plan end to end),
:mod:`~fedstyle.experiments.sweep.reports` (the report of a sweep's finished runs).
"""

from fedstyle.experiments.grid import (  # re-exported: one module to import
    Grid,
    Plan,
    PlannedRun,
    load_grid,
    parse_grid,
    parse_override,
    plan_grid,
)
from fedstyle.experiments.sweep.execute import (
    SweepOutcome,
    dry_run,
    execute,
    run_plan,
    run_sweep,
)
from fedstyle.experiments.sweep.jobs import (
    Job,
    RunResult,
    Variant,
    attempt,
    plan_jobs,
    run_job,
    select,
)
from fedstyle.experiments.sweep.launchers import LocalLauncher, RayLauncher
from fedstyle.experiments.sweep.reports import write_sweep_report

__all__ = ["Variant", "Job", "plan_jobs", "run_sweep", "run_job", "attempt", "RunResult", "LocalLauncher",
           "RayLauncher", "execute", "SweepOutcome", "dry_run", "run_plan", "write_sweep_report", "Grid", "Plan",
           "PlannedRun", "select", "load_grid", "parse_grid", "parse_override", "plan_grid"]
