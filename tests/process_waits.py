"""Waiting for and killing processes in the deployment tests (shared by test_deploy_faults and
test_deploy_processes)."""

from __future__ import annotations

import os
import signal
import time


def wait_for(predicate, timeout: float = 20.0, what: str = "it") -> None:
    """Poll ``predicate`` every 50 ms until it is true; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kill_all(pids) -> None:
    """SIGKILL every pid, ignoring those already gone (test cleanup)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
