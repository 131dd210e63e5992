"""Waiting for and killing processes in the deployment tests (shared by test_deploy_faults,
test_deploy_processes and test_flower_deploy)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def wait_for(predicate, timeout: float = 20.0, what: str = "it", poll: float = 0.05) -> None:
    """Poll ``predicate`` every ``poll`` s until it is true; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kill_all(pids) -> None:
    """SIGKILL every pid, ignoring those already gone (test cleanup)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def signal_dispositions(pid: int) -> dict[str, str]:
    """The blocked / ignored / caught signal masks of ``pid`` (/proc/PID/status; hex strings), empty when it is
    gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines) if k in ("SigBlk", "SigIgn", "SigCgt")}
