"""`fedstyle deploy` returns only when every process it started has exited: the stopping code alone, on
plain Python processes (no Flower, a few seconds). The deployments themselves: test_flower_deploy.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from fedstyle.runtimes.flower.processes import MARKER_ENV, _alive, descendants, marked_processes, stop_processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process discovery reads /proc (Linux)")

SLEEP = "import time; time.sleep(120)"


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def start(code: str, marker: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, **{MARKER_ENV: marker}),
                            start_new_session=True)


def test_orphans_outside_the_process_tree_are_stopped_too():
    marker = uuid.uuid4().hex
    # a parent that starts a child in a session of its own, as Flower's SuperExec starts ClientApp processes
    parent = start("import subprocess, sys, time; "
                   f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}], start_new_session=True); time.sleep(120)", marker)
    wait_for(lambda: len(marked_processes(marker)) == 2)
    (orphan,) = [p for p in marked_processes(marker) if p != parent.pid]
    parent.kill()
    parent.wait()
    wait_for(lambda: orphan not in descendants(os.getpid()))  # handed to init: not in our tree any more
    assert _alive(orphan)
    leader = start(SLEEP, marker)
    started = time.monotonic()
    assert stop_processes([leader], marker=marker) == []
    assert not _alive(orphan) and not _alive(leader.pid) and marked_processes(marker) == []
    assert time.monotonic() - started < 5  # SIGTERM suffices: no grace period waited out


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    marker = uuid.uuid4().hex
    stubborn = start(f"import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); {SLEEP}", marker)
    wait_for(lambda: marked_processes(marker) == [stubborn.pid])
    time.sleep(0.5)  # let it install its handler
    started = time.monotonic()
    assert stop_processes([stubborn], signal.SIGTERM, grace=1.0, marker=marker) == []
    assert 1.0 <= time.monotonic() - started < 6
    assert stubborn.returncode == -signal.SIGKILL and marked_processes(marker) == []


def test_children_of_several_processes_stop_together():
    marker = uuid.uuid4().hex
    parents = [start("import subprocess, sys, time; "
                     f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); time.sleep(120)", marker) for _ in range(3)]
    wait_for(lambda: len(marked_processes(marker)) == 6)
    started = time.monotonic()
    assert stop_processes(parents, grace=10.0) == []  # the process trees alone, no marker sweep
    assert time.monotonic() - started < 5 and marked_processes(marker) == []
