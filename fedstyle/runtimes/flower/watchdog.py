"""The watchdog of a deployment: stops every process of the federation once the process that started
it has died, however it died (SIGKILL, the OOM killer), so that no orphan goes on training and writing.

:class:`~fedstyle.runtimes.flower.processes.Supervisor` starts it before anything else, as
``python -S watchdog.py OWNER_PID MARKER`` in a session of its own (a signal to the owner's process
group does not reach it). It waits for its parent, the owner, to end: the kernel then hands the
watchdog to another parent, which ``getppid()`` shows at once (also while the dead owner is an
unreaped zombie, and whatever the system does with its pid later). It then SIGKILLs every process
whose environment carries ``FEDSTYLE_DEPLOY=MARKER`` until none has been seen for a few scans, and
exits. When the owner stops the federation itself, it ends the watchdog too.

It is the layer for the processes that Flower starts below the owner's children (SuperExec, ServerApp,
ClientApp processes, in sessions of their own): the owner's children themselves die with it through the
kernel (``PR_SET_PDEATHSIG``), and the ServerApp and ClientApps also watch the owner themselves.

Standard library only and run by path without ``site``: it starts in milliseconds and needs nothing of
the environment it watches. Linux (/proc); elsewhere it finds no marked process.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

#: environment variable marking every process a Supervisor started (and their descendants)
MARKER_ENV = "FEDSTYLE_DEPLOY"
#: seconds between two looks at the parent pid
POLL_INTERVAL = 0.1
#: empty scans in a row after which the federation counts as gone (a process being forked between
#: two scans is found by the next)
QUIET_SCANS = 3


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, Z, ...); None when there is no such process or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs code. An exited process waiting to be reaped (a zombie) does not; a
    process whose main thread has exited while its other threads go on (state Z, more than one task in
    /proc/PID/task: Flower's SuperExec shutting down) does."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if process_state(pid) != "Z":
        return True
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def marked_processes(marker: str) -> list[int]:
    """Live processes (zombies excluded) started with ``FEDSTYLE_DEPLOY=marker`` in their environment:
    everything a Supervisor started and everything those started, also once reparented
    (Linux /proc; empty elsewhere)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def kill_marked(marker: str, timeout: float = 30.0) -> list[int]:
    """SIGKILL every process carrying ``marker`` until none is seen for :data:`QUIET_SCANS` scans in a
    row (or ``timeout`` s); the pids still alive at the end (none in practice)."""
    deadline, quiet, pids = time.monotonic() + timeout, 0, []
    while quiet < QUIET_SCANS and time.monotonic() < deadline:
        pids = marked_processes(marker)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        quiet = 0 if pids else quiet + 1
        time.sleep(0.05)
    return marked_processes(marker)


def main(argv: list[str]) -> int:
    owner, marker = int(argv[0]), argv[1]
    while os.getppid() == owner:
        time.sleep(POLL_INTERVAL)
    left = kill_marked(marker)  # the owner is gone: nothing else will stop its federation
    if left:
        print(f"fedstyle watchdog: processes {left} did not exit after SIGKILL", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
