"""Process supervision for ``fedstyle deploy``: child processes started, waited for and stopped together.

:class:`Supervisor` starts each process in its own session (process group) with its log in one folder
and stops every process it started — and everything those started, found also after they left the
process tree by the :data:`MARKER_ENV` marker in their environment — on exit, on SIGTERM / SIGHUP and
at interpreter exit, returning only once all of them have exited. Which processes those are (Flower's
SuperLink, SuperNodes, ``flwr run``) and their arguments are :mod:`.deployment`'s.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from fedstyle.errors import FedstyleError

#: environment variable marking every process a Supervisor started (and their descendants)
MARKER_ENV = "FEDSTYLE_DEPLOY"


class DeployError(FedstyleError):
    """A Flower process failed to start or the run failed."""


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise DeployError(f"process exited with code {proc.returncode} before listening on {host}:{port}"
                              + (f"; see {log}:\n{tail(log)}" if log else ""))
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise DeployError(f"nothing listens on {host}:{port} after {timeout:.0f} s" + (f"; see {log}" if log else ""))


def tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (Linux); empty elsewhere."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, stack = _children(), [], [pid]
    while stack:
        for child in tree.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _signal_all(groups, pids, sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def marked_processes(marker: str) -> list[int]:
    """Live processes (zombies excluded) started with ``FEDSTYLE_DEPLOY=marker`` in their environment:
    everything a :class:`Supervisor` started and everything those started, also once reparented
    (Linux /proc; empty elsewhere)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and _alive(int(entry.name)):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def stop_processes(procs: list[subprocess.Popen], sig: int = signal.SIGTERM, grace: float = 10.0,
                   marker: str | None = None) -> list[int]:
    """Stop ``procs`` together: each one's process group and descendants (and, with ``marker``, every
    process carrying it) get ``sig``; whatever is alive after ``grace`` s gets SIGKILL. Returns once
    all of them have exited; the pids still alive 5 s after SIGKILL (none in practice)."""
    groups = {p.pid for p in procs}  # started with start_new_session: a pgid is its leader's pid
    pids = {pid for p in procs for pid in (p.pid, *descendants(p.pid))}
    if marker is not None:
        pids.update(marked_processes(marker))
    for s in (sig, signal.SIGKILL):
        _signal_all(groups, pids, s)
        signalled = set(pids)  # each process gets each signal once (a second SIGTERM cuts Flower's clean exit short)
        deadline = time.monotonic() + (grace if s != signal.SIGKILL else 5.0)
        while True:
            for proc in procs:
                proc.poll()  # reap our own children (a zombie counts as gone)
            # children started meanwhile, and orphans handed to init, are found again
            pids = {p for p in pids if _alive(p)}
            pids.update(d for p in list(pids) for d in descendants(p))
            if marker is not None:
                pids.update(marked_processes(marker))
            if not pids or time.monotonic() > deadline:
                break
            _signal_all((), pids - signalled, s)  # the late ones
            signalled |= pids
            time.sleep(0.05)
        if not pids:
            break
    for proc in procs:
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    return sorted(pids)


def stop_tree(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Stop ``proc``, its process group and every descendant (SIGTERM, then SIGKILL after ``grace`` s)."""
    stop_processes([proc], sig, grace)


class Supervisor:
    """Named child processes with their logs in ``log_dir``; a context manager that stops them all on exit.

    ``stopped_last`` names the processes :meth:`stop_all` stops after all the others, together with
    the sweep for the marker.
    """

    stopped_last: tuple[str, ...] = ()

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self._previous_handlers: dict[int, Any] = {}
        self.marker = uuid.uuid4().hex  # in the environment of every process started for this supervisor

    def __enter__(self):
        atexit.register(self.stop_all)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller handles signals
                pass
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        atexit.unregister(self.stop_all)

    def _on_signal(self, signum, frame) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def launch(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start ``argv`` as ``name`` in a session of its own, its output appended to ``<log_dir>/<name>.log``.

        ``env`` should carry ``MARKER_ENV=self.marker`` so that :meth:`stop_all` finds what it starts.
        """
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as handle:
            proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=self.log_dir, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_tree(proc, sig)

    def stop_all(self) -> None:
        """Stop every process this supervisor started and everything they started; return when all have exited.

        All but :attr:`stopped_last` first (together), then those with whatever is left; processes
        that left their parent's tree are found by the marker in their environment.
        """
        first = [self.procs.pop(n) for n in sorted(self.procs) if n not in self.stopped_last]
        last = [self.procs.pop(n) for n in list(self.procs)]
        stop_processes(first)
        left = stop_processes(last, marker=self.marker)
        if left:
            print(f"fedstyle deploy: processes {left} did not exit after SIGKILL", file=sys.stderr)
