"""A job (a run directory and its config) and one attempt at running it: the Python API's
:class:`Variant` and :func:`plan_jobs` that make jobs, and :func:`attempt` that runs one and says
what became of it (:class:`RunResult`)."""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from fedstyle.errors import FedstyleError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.rundir import CONFIG, DONE
from fedstyle.experiments.runner import resume_experiment, run_experiment
from fedstyle.io import LockedError

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
