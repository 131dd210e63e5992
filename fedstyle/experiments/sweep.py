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
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import csv
import json
import multiprocessing
import os
import socket
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.grid import (  # re-exported: one module to import
    Grid,
    Plan,
    PlannedRun,
    group_folder,
    group_title,
    load_grid,
    parse_grid,
    parse_override,
    plan_grid,
)
from fedstyle.experiments.runner import CONFIG, DONE, resume_experiment, run_experiment
from fedstyle.io import DirectoryLock, LockedError, atomic_open, atomic_write_text

__all__ = ["Variant", "Job", "plan_jobs", "run_sweep", "run_job", "attempt", "RunResult", "LocalLauncher",
           "RayLauncher", "execute", "SweepOutcome", "dry_run", "run_plan", "write_sweep_report", "Grid", "Plan",
           "PlannedRun", "select", "load_grid", "parse_grid", "parse_override", "plan_grid"]

RAY_HINT = "pip install -c constraints.txt 'fedstyle[flower-sim]'"
LOG_NAME = "sweep.log"
MARKER_NAME = ".fedstyle-sweep"


# ----------------------------------------------------------------------------- the Python API


@dataclass(frozen=True)
class Variant:
    """One row of a table: a method with its hyperparameters, under a folder name (``label``: the
    row's name in reports; default: the method's own label)."""

    name: str
    method: str
    hparams: dict[str, Any] = field(default_factory=dict)
    label: str | None = None


@dataclass(frozen=True)
class Job:
    run_dir: Path
    config: RunConfig
    name: str = ""

    @property
    def title(self) -> str:
        return self.name or str(self.run_dir)


def select(available: Sequence[str], wanted: Sequence[str] | None, what: str) -> list[str]:
    """``wanted`` (in ``available``'s order), or all of ``available`` when None; an unknown name is an
    error that lists the choices — a table script's ``--rows`` / ``--targets``."""
    if wanted is None:
        return list(available)
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(available)}")
    return [name for name in available if name in wanted]


def plan_jobs(base: RunConfig, variants: Sequence[Variant], seeds: Sequence[int], targets: Sequence[str],
              out: str | os.PathLike) -> list[Job]:
    """Every (variant, seed, target) run not finished yet, in table order, as ``OUT/<variant>/seed<k>/<target>``."""
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique folder names, got {names}")
    jobs = []
    for variant in variants:
        for seed in seeds:
            for target in targets:
                run_dir = Path(out) / variant.name / f"seed{seed}" / target
                if (run_dir / DONE).exists():
                    continue
                config = base.updated(method=variant.method, hparams=dict(variant.hparams), seed=seed, targets=[target])
                if variant.label is not None:
                    config = config.updated(label=variant.label)
                jobs.append(Job(run_dir, config, f"{variant.name}/seed{seed}/{target}"))
    return jobs


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


# ----------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class RunResult:
    """What became of one job: ``done`` (ran or resumed to the end), ``skipped`` (already finished),
    ``failed`` (``error``: one line; ``detail``: the traceback) or ``locked`` (another process holds it)."""

    run_dir: Path
    name: str
    status: str
    error: str = ""
    detail: str = ""
    seconds: float = 0.0
    host: str = ""


def one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    if not isinstance(err, FedstyleError):
        text = f"{type(err).__name__}: {text}"
    lines = text.splitlines()
    return lines[0] + (" (...)" if len(lines) > 1 else "")


def attempt(job: Job, threads: int = 0, marker: str | None = None) -> RunResult:
    """Run or resume ``job`` quietly, never raising (except KeyboardInterrupt): the outcome says what happened.

    ``marker``: a file the sweep wrote into its output folder; a process that cannot see it (a Ray
    node without the shared filesystem) fails the run instead of writing it where nobody looks.
    """
    start = time.perf_counter()
    host = socket.gethostname()

    def result(status: str, error: str = "", detail: str = "") -> RunResult:
        return RunResult(job.run_dir, job.title, status, error, detail, time.perf_counter() - start, host)

    if marker is not None and not Path(marker).exists():
        return result("failed", f"{Path(marker).parent} is not visible on {host}: put --out on a filesystem every "
                      "node sees at the same path (a shared filesystem)")
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        if (job.run_dir / DONE).exists():
            return result("skipped")
        if (job.run_dir / CONFIG).exists():
            resume_experiment(job.run_dir, quiet=True, device=job.config.device, data_root=job.config.data_root)
        else:
            run_experiment(job.config, job.run_dir, quiet=True)
        return result("done")
    except LockedError as err:
        return result("locked", one_line(err))
    except Exception as err:  # noqa: BLE001 — any run's failure is reported, the others go on
        return result("failed", one_line(err), traceback.format_exc())


def run_job(job: Job, threads: int = 0) -> Path:
    """Run (or resume) one job quietly, raising its error; returns its run directory."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    if (job.run_dir / CONFIG).exists():
        resume_experiment(job.run_dir, quiet=True)
    else:
        run_experiment(job.config, job.run_dir, quiet=True)
    return job.run_dir


# ----------------------------------------------------------------------------- launchers


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _watch_parent(parent: int, poll: float = 1.0, grace: float = 10.0) -> None:
    """Interrupt this worker as Ctrl-C would once the sweep process that started it is gone (killed,
    or ended by a SIGTERM it did not pass on): its run stops — resumable from its last checkpoint,
    its lock released — instead of running on, unseen, beside the next sweep.

    A run unwinds from the interrupt in well under a second (it writes nothing on the way out), but
    Python can swallow the KeyboardInterrupt — raised inside a weakref callback such as the import
    machinery's module-lock cleanup it is only printed as "Exception ignored" — and the run trains
    on. So a worker still alive ``grace`` seconds after the interrupt exits outright: the kernel
    releases its run directory's flock, and the last checkpoint (written atomically) stays resumable.
    """
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(grace)
        os._exit(130)

    threading.Thread(target=watch, name="fedstyle-parent-watch", daemon=True).start()


def _attempt_in_worker(job: Job, marker: str | None, sweep_pid: int) -> RunResult:
    """``attempt`` in a worker; interrupted because its sweep process is gone, the worker exits once
    the run has unwound (checkpoint kept, lock released) rather than wait for jobs no one will send."""
    try:
        return attempt(job, 0, marker)
    except KeyboardInterrupt:
        if os.getppid() != sweep_pid:
            os._exit(130)
        raise


def _init_worker(threads: int, counter) -> None:
    """A spawned worker: its share of the CPU threads, and with several GPUs one of them in turn; it
    stops when the sweep process goes away."""
    import torch

    _watch_parent(os.getppid())

    torch.set_num_threads(threads)
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(index % torch.cuda.device_count())


class LocalLauncher:
    """Runs in this process (``workers=1``) or in ``workers`` spawned processes on this machine.

    ``threads``: torch threads per run (0: this process's setting when serial, an equal share of
    the CPU cores per worker otherwise).
    """

    def __init__(self, workers: int = 1, threads: int = 0):
        if workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {workers}")
        self.workers = workers
        self.threads = threads
        self.slots = workers

    def describe(self) -> str:
        return "in this process" if self.workers == 1 else f"on {self.workers} worker processes"

    def results(self, jobs: Sequence[Job], marker: str | None = None) -> Iterator[RunResult]:
        if self.workers <= 1:
            import torch

            saved = torch.get_num_threads()
            try:
                for job in jobs:
                    yield attempt(job, self.threads, marker)
            finally:
                torch.set_num_threads(saved)
            return
        threads = self.threads or max(1, _cpu_count() // self.workers)
        context = multiprocessing.get_context("spawn")
        counter = context.Value("i", 0)
        pool = futures.ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                           initargs=(threads, counter))
        finished = False
        try:
            pending = {pool.submit(_attempt_in_worker, job, marker, os.getpid()): job for job in jobs}
            for future in futures.as_completed(pending):
                job = pending[future]
                try:
                    yield future.result()
                except Exception as err:  # noqa: BLE001 — the worker process died (killed, out of memory)
                    yield RunResult(job.run_dir, job.title, "failed",
                                    f"its worker process died ({type(err).__name__}; out of memory?)")
            finished = True
        finally:
            pool.shutdown(wait=True, cancel_futures=not finished)


def require_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--launcher ray needs Ray; install it with: {RAY_HINT}") from None
    return ray


class RayLauncher:
    """Each run a Ray task with ``cpus_per_run`` CPUs and ``gpus_per_run`` GPUs (fractions share a GPU).

    ``address``: ``None`` starts a local Ray instance (``init`` holds extra ``ray.init`` arguments,
    e.g. ``num_cpus=2``) and stops it at the end; ``"auto"`` joins the cluster this machine belongs
    to (``ray start --head`` / ``ray start --address ...``); ``"HOST:PORT"`` joins that head node.
    When this process is already connected to Ray, that connection is used and kept.
    """

    def __init__(self, address: str | None = None, cpus_per_run: float = 1.0, gpus_per_run: float = 0.0,
                 init: dict[str, Any] | None = None):
        if cpus_per_run <= 0:
            raise ConfigError(f"--cpus-per-run must be positive, got {cpus_per_run}")
        if gpus_per_run < 0:
            raise ConfigError(f"--gpus-per-run must be >= 0, got {gpus_per_run}")
        self.address = address
        self.cpus = cpus_per_run
        self.gpus = gpus_per_run
        self.init = dict(init or {})
        self.slots = 1

    def describe(self) -> str:
        where = "on a local Ray instance" if self.address is None else f"on the Ray cluster at {self.address}"
        return f"{where}, {self.cpus:g} CPU and {self.gpus:g} GPU per run"

    def check(self) -> None:
        require_ray()

    def _connect(self, ray) -> bool:
        if ray.is_initialized():
            return False
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # keep Ray's GPU visibility, quietly
        kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False,
                                  **self.init}
        if self.address is not None:
            kwargs["address"] = self.address
        try:
            ray.init(**kwargs)
        except ConnectionError as err:
            raise ConfigError(f"cannot join the Ray cluster at --address {self.address}: {one_line(err)}; start one "
                              "with `ray start --head` (and `ray start --address HEAD:6379` on the other nodes)"
                              ) from None
        return True

    def results(self, jobs: Sequence[Job], marker: str | None = None) -> Iterator[RunResult]:
        ray = require_ray()
        started = self._connect(ray)
        pending: list = []
        try:
            nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
            if not any(r.get("CPU", 0) >= self.cpus and r.get("GPU", 0) >= self.gpus for r in nodes):
                raise ConfigError(f"no node of the Ray cluster has {self.cpus:g} CPUs and {self.gpus:g} GPUs for one "
                                  f"run; lower --cpus-per-run / --gpus-per-run (nodes: {nodes})")
            total = ray.cluster_resources()
            slots = total.get("CPU", 1) // self.cpus
            if self.gpus:
                slots = min(slots, total.get("GPU", 0) // self.gpus)
            self.slots = max(1, int(slots))
            task = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus)(attempt)
            threads = max(1, int(self.cpus))
            refs = {task.remote(job, threads, marker): job for job in jobs}
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    job = refs[ref]
                    try:
                        yield ray.get(ref)
                    except Exception as err:  # noqa: BLE001 — the task's worker or node died
                        yield RunResult(job.run_dir, job.title, "failed", f"Ray: {one_line(err)}")
        finally:
            for ref in pending:  # interrupted: stop what still runs (its run directory stays resumable)
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            if started:
                ray.shutdown()


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
    """The runs, one line each (status, folder, row), and how many are done."""
    echo(describe_plan(plan))
    width = max(len(r.rel) for r in plan.runs)
    for run in plan.runs:
        status = run.status
        if status != "done" and probe_lock(run.run_dir):
            status = "running"  # held by another process now
        echo(f"  {status:<8} {run.rel:<{width}}  {run.row_label}")


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
