"""Where a sweep's jobs run: :class:`LocalLauncher` (this process, or a pool of spawned worker
processes that stop when the sweep process is gone) and :class:`RayLauncher` (a Ray task per run)."""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import multiprocessing
import os
import time
from typing import Any, Iterator, Sequence

from fedstyle.errors import ConfigError
from fedstyle.experiments.sweep.jobs import Job, RunResult, attempt, one_line

RAY_HINT = "pip install -c constraints.txt 'fedstyle[flower-sim]'"


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


#: a worker's state: whether a run is under way, and whether a signal has told the worker to stop
_WORKER = {"running": False, "stopping": False}


def _stop_run_on_signal(signum, frame) -> None:
    """A worker's SIGINT and SIGTERM. The first one stops the run under way as Ctrl-C would (KeyboardInterrupt:
    it unwinds, its checkpoint kept and its lock released), and every run handed to the worker after it: the pool
    may have queued one already. Later signals are ignored, so that Ctrl-C (the terminal's SIGINT) and the
    sweep's SIGTERM together interrupt a run once."""
    first = not _WORKER["stopping"]
    _WORKER["stopping"] = True
    if first and _WORKER["running"]:
        raise KeyboardInterrupt


def _attempt_in_worker(job: Job, marker: str | None, sweep_pid: int) -> RunResult:
    """``attempt`` in a worker; interrupted because its sweep process is gone, the worker exits once
    the run has unwound (checkpoint kept, lock released) rather than wait for jobs no one will send.
    A worker told to stop starts no run."""
    _WORKER["running"] = True  # before the check: a signal from here on interrupts this job
    try:
        if _WORKER["stopping"]:
            raise KeyboardInterrupt
        return attempt(job, 0, marker)
    except KeyboardInterrupt:
        if os.getppid() != sweep_pid:
            os._exit(130)
        raise
    finally:
        _WORKER["running"] = False


def _interrupt_workers(pool: futures.ProcessPoolExecutor) -> None:
    """SIGTERM to the pool's worker processes: each stops its run and starts no other (see
    :func:`_stop_run_on_signal`). The sweep calls it when it is interrupted itself: its workers get no signal
    of their own from ``kill PID`` or a scheduler, and the pool's shutdown would otherwise wait for every run
    under way or queued to end."""
    import signal

    # the executor keeps its processes by pid in a private mapping (stable since Python 3.2); without it, this
    # process's multiprocessing children, which in a sweep process are the pool's
    processes = getattr(pool, "_processes", None)
    pids = list(processes) if processes else [child.pid for child in multiprocessing.active_children()]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def _init_worker(threads: int, counter) -> None:
    """A spawned worker: its share of the CPU threads, and with several GPUs one of them in turn; it
    stops when the sweep process goes away."""
    import signal

    import torch

    _watch_parent(os.getppid())
    # installed whatever the worker inherited: under nohup or `&` it would ignore SIGINT (_watch_parent's interrupt
    # would wait out its grace), and SIGTERM's default would end a run without unwinding it
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop_run_on_signal)

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
        except (KeyboardInterrupt, GeneratorExit):
            # Ctrl-C or SIGTERM (stop_on_sigterm) here, or in the caller's loop, which then drops this generator
            # (GeneratorExit): the runs under way stop too, resumable
            _interrupt_workers(pool)
            raise
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
