"""A grid of runs — variants × seeds × held-out targets — run once each, resumable, optionally in parallel.

The benchmarks (``benchmarks/accuracy.py``, ``benchmarks/ccst_table.py``) are thin wrappers over
:func:`run_sweep`: it lays runs out as ``OUT/<variant>/seed<k>/<target>``, skips the finished ones
(``done`` marker), resumes interrupted ones from their checkpoint, and can spread independent runs
over worker processes (one GPU holds several digits-sized jobs at once).
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import CONFIG, DONE, resume_experiment, run_experiment


@dataclass(frozen=True)
class Variant:
    """One row of a table: a method with its hyperparameters, under a folder name."""

    name: str
    method: str
    hparams: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    run_dir: Path
    config: RunConfig


def plan_jobs(base: RunConfig, variants: Sequence[Variant], seeds: Sequence[int], targets: Sequence[str],
              out: str | os.PathLike) -> list[Job]:
    """Every (variant, seed, target) run not finished yet, in table order."""
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
                jobs.append(Job(run_dir, config))
    return jobs


def run_job(job: Job, threads: int = 0) -> Path:
    """Run (or resume) one job quietly; returns its run directory."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    if (job.run_dir / CONFIG).exists():
        resume_experiment(job.run_dir, quiet=True)
    else:
        run_experiment(job.config, job.run_dir, quiet=True)
    return job.run_dir


def run_sweep(jobs: Sequence[Job], *, workers: int = 1, log: Callable[[str], None] = print) -> float:
    """Run ``jobs`` (serially, or in ``workers`` spawned processes); returns the wall time in seconds.

    Workers are spawned, not forked, so CUDA can initialise in each; each gets an equal share of the
    CPU threads. A failing job stops the sweep with its error after the running ones end.
    """
    start = time.perf_counter()
    if workers <= 1:
        for i, job in enumerate(jobs, 1):
            log(f"[{i}/{len(jobs)}] {job.run_dir}")
            run_job(job)
        return time.perf_counter() - start
    threads = max(1, (os.cpu_count() or 1) // workers)
    with futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(run_job, job, threads): job for job in jobs}
        for i, done in enumerate(futures.as_completed(pending), 1):
            log(f"[{i}/{len(jobs)}] {done.result()} ({time.perf_counter() - start:.0f} s)")
    return time.perf_counter() - start
