"""`fedstyle deploy` returns only when every process it started has exited, and when it is killed outright
(SIGKILL, the OOM killer) they die with it: the supervision code alone, on plain Python processes (no
Flower, a few seconds). The deployments themselves: test_flower_deploy.py, test_deploy_faults.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from process_waits import kill_all, signal_dispositions, wait_for

from fedstyle.runtimes.flower.processes import (
    MARKER_ENV,
    DeployError,
    _alive,
    check_stopped,
    descendants,
    marked_processes,
    stop_processes,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process discovery reads /proc (Linux)")

SLEEP = "import time; time.sleep(120)"
#: a process that runs on after its main thread has exited, deaf to SIGTERM (as Flower's SuperExec shutting down)
MAIN_THREAD_GONE = ("import ctypes, signal, threading, time\n"
                    "signal.signal(signal.SIGTERM, lambda *a: None)\n"
                    "threading.Thread(target=time.sleep, args=(120,)).start()\n"
                    "ctypes.CDLL(None).pthread_exit(None)\n")
#: the owner of a Supervisor: a child, and a child that starts a grandchild in a session of its own (as
#: Flower's SuperLink starts its SuperExec); argv: log folder, grandchild code
OWNER = """
import os, subprocess, sys, time
from pathlib import Path
from fedstyle.runtimes.flower.processes import MARKER_ENV, Supervisor
with Supervisor(Path(sys.argv[1])) as supervisor:
    env = dict(os.environ, **{MARKER_ENV: supervisor.marker})
    supervisor.launch("direct", [sys.executable, "-c", "import time; time.sleep(120)"], env)
    supervisor.launch("parent", [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen("
                      "[sys.executable, '-c', sys.argv[1]], start_new_session=True); time.sleep(120)", sys.argv[2]], env)
    print(supervisor.marker, flush=True)
    time.sleep(120)
"""


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
    # until its SIGTERM handler is installed (a fixed sleep could lose that race on a loaded machine)
    sigterm = 1 << (signal.SIGTERM - 1)
    wait_for(lambda: int(signal_dispositions(stubborn.pid).get("SigIgn", "0"), 16) & sigterm)
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


def test_a_process_that_runs_on_after_its_main_thread_exited_is_stopped_and_reaped():
    # `ps` shows it as a zombie (Z), but its other threads run: stopping must wait for it, then reap it
    marker = uuid.uuid4().hex
    proc = start(MAIN_THREAD_GONE, marker)
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 20,
                 "the main thread to exit")
        started = time.monotonic()
        assert stop_processes([proc], signal.SIGTERM, grace=1.0, marker=marker) == []
        assert time.monotonic() - started >= 1.0  # SIGTERM did nothing: it was killed after the grace period
        assert proc.returncode == -signal.SIGKILL and not Path(f"/proc/{proc.pid}").exists()  # dead and reaped
    finally:
        proc.kill()
        proc.wait()


def start_owner(log_dir: Path, grandchild: str):
    """A process running a Supervisor (as `fedstyle deploy`) with its processes started; (it, their marker)."""
    log_dir.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(log_dir), grandchild], stdout=subprocess.PIPE, text=True)
    return owner, owner.stdout.readline().strip()


def test_a_killed_owner_takes_every_process_it_started_with_it(tmp_path):
    # its children by the kernel (parent-death signal), the grandchild in a session of its own by the watchdog
    owner, marker = start_owner(tmp_path / "flower", SLEEP)
    try:
        wait_for(lambda: len(marked_processes(marker)) == 3, 20, "the children and the grandchild")
        owner.kill()  # as the OOM killer does: no handler, no atexit
        owner.wait()
        wait_for(lambda: not marked_processes(marker), 10, "every process of the killed owner to die")
    finally:
        owner.kill()
        owner.wait()
        kill_all(marked_processes(marker))


def test_the_run_directory_writers_die_with_the_owner_even_without_the_watchdog(tmp_path):
    # the grandchild watches the owner itself, as the ServerApp and the ClientApps do
    grandchild = ("import time\nfrom fedstyle.runtimes.flower.processes import die_with_owner\n"
                  "die_with_owner()\ntime.sleep(120)")
    owner, marker = start_owner(tmp_path / "flower", grandchild)
    try:
        wait_for(lambda: len(marked_processes(marker)) == 3, 20, "the children and the grandchild")
        time.sleep(0.5)  # the grandchild's watch has started
        watchdogs = [p for p in descendants(owner.pid) if b"watchdog.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(watchdogs) == 1
        kill_all([owner.pid, *watchdogs])  # as `kill -9` of both
        owner.wait()
        wait_for(lambda: not marked_processes(marker), 10, "every process of the killed owner to die")
    finally:
        owner.kill()
        owner.wait()
        kill_all(marked_processes(marker))


# -- issue 55 item 9: a resume beside a live deployment ------------------------------------------------
def test_a_live_deployment_is_named_as_running_not_as_orphans_to_kill(tmp_path):
    owner, marker = start_owner(tmp_path / "flower", SLEEP)
    try:
        wait_for(lambda: len(marked_processes(marker)) == 3, 20, "the children and the grandchild")
        with pytest.raises(DeployError) as err:
            check_stopped(tmp_path / "flower")  # as `fedstyle deploy --resume` beside it
        message = str(err.value)
        assert f"a deployment is running (pid {owner.pid})" in message and f"`kill {owner.pid}`" in message
        words = message.replace("(", " ").replace(")", " ").replace("`", " ").split()
        assert not set(map(str, marked_processes(marker))) & set(words)  # its processes are its to stop
    finally:
        owner.kill()
        owner.wait()
        kill_all(marked_processes(marker))


#: run with the marker of a federation whose owner is gone: a child (also marked) that checks for orphans
CHECK_FROM_INSIDE = ("import subprocess, sys\n"
                     "check = 'import sys; from pathlib import Path\\n"
                     "from fedstyle.runtimes.flower.processes import check_stopped\\ncheck_stopped(Path(sys.argv[1]))'\n"
                     "sys.exit(subprocess.run([sys.executable, '-c', check, sys.argv[1]]).returncode)\n")


def test_a_check_run_inside_the_federations_environment_does_not_count_itself(tmp_path):
    # a command started from a shell inside the federation (its marker inherited): neither it nor the
    # process that started it is an orphan to kill
    import json
    import socket

    marker = uuid.uuid4().hex
    (tmp_path / "supervisor.json").write_text(json.dumps({"marker": marker, "owner": "999999999:1",
                                                          "host": socket.gethostname()}))
    done = subprocess.run([sys.executable, "-c", CHECK_FROM_INSIDE, str(tmp_path)], capture_output=True, text=True,
                          env=dict(os.environ, **{MARKER_ENV: marker}), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
