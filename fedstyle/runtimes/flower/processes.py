"""Process supervision for ``fedstyle deploy``: child processes started, waited for and stopped together.

:class:`Supervisor` starts each process in its own session (process group) with its log in one folder
and stops every process it started — and everything those started, found also after they left the
process tree by the :data:`MARKER_ENV` marker in their environment — on exit, on SIGTERM / SIGHUP and
at interpreter exit, returning only once all of them have exited and its own children are reaped (a
process whose main thread has exited while its other threads run, a ``Z`` in ``ps``, has not exited:
Flower's SuperExec shuts down so). Which processes those are (Flower's SuperLink, SuperNodes, ``flwr
run``) and their arguments are :mod:`.deployment`'s.

When the owner — the process running the Supervisor — is killed outright (SIGKILL, the OOM killer),
none of that code runs. Three layers stop the federation then (Linux), each for what the others miss:

- the owner's children die with it, by the kernel: each is started through :data:`_DIE_WITH_PARENT`,
  which sets ``PR_SET_PDEATHSIG`` (SIGKILL) and execs the real program. An exec shim rather than
  ``preexec_fn``: no Python runs in the forked child of a process with threads (torch's pools, tqdm's
  monitor), where ``preexec_fn`` can deadlock;
- the processes below them (Flower's SuperExec and ServerApp, in sessions of their own; the ClientApps
  a warm site, :mod:`.warm_site`, forks) are not the owner's children: a :mod:`.watchdog` process, started first, SIGKILLs every process
  carrying the marker once the owner is gone. Flower's own parent monitors do not suffice: measured
  here, a ServerApp wrote another metrics.jsonl row after its SuperLink and SuperExec had been killed,
  and was still alive a minute later;
- the ServerApp and the ClientApps, which write the run directory and the sites' state, also watch the
  owner themselves (:func:`die_with_owner`), in case the watchdog was killed along with it.

Each Supervisor records its marker and owner in ``<log dir>/supervisor.json``; the next one for the
same folder refuses to start while any process of the earlier one is alive (:func:`check_stopped`).

While it runs, the owner is a child subreaper (Linux): a process whose parent exits is handed to it
rather than to init, so the processes Flower starts and never waits for (its SuperExec drops the
ServerApp's ``Popen``) are reaped by :meth:`Supervisor.stop_all` before it returns, not left
``<defunct>`` until init reaps them (about 1.5 s later here).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.runtimes.flower import watchdog
from fedstyle.runtimes.flower.watchdog import MARKER_ENV, alive as _alive, marked_processes

#: environment variable naming the Supervisor's owner (``PID:START``) to the processes below it
OWNER_ENV = "FEDSTYLE_DEPLOY_OWNER"
#: the Supervisor's record in its log folder: marker, owner, host
RECORD = "supervisor.json"
_LINUX = sys.platform.startswith("linux")

#: run as ``python -S -c _DIE_WITH_PARENT PARENT_PID ARGV...``: ask the kernel for SIGKILL when the parent
#: dies (PR_SET_PDEATHSIG = 1, kept across exec), quit if it died already, then become ARGV
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class DeployError(FedstyleError):
    """A Flower process failed to start or the run failed; ``log``: the log that tells more, whose last
    ``lines`` lines are kept from the moment of the error (the log itself may be removed with a run
    directory that failed before its first checkpoint: :meth:`without_log` then says so)."""

    def __init__(self, message: str, log: Path | None = None, lines: int = 20):
        self.message, self.log = message, log
        self.log_tail = tail(log, lines) if log is not None else ""
        super().__init__(f"{message}; see {log}" + (f":\n{self.log_tail}" if self.log_tail else "")
                         if log is not None else message)

    def without_log(self) -> str:
        """The error for when its log has been removed: the log's end quoted, its path not named."""
        if self.log is None or not self.log_tail:
            return self.message
        return f"{self.message}; the end of {self.log.name} (removed with the rest):\n{self.log_tail}"


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise DeployError(f"process exited with code {proc.returncode} before listening on {host}:{port}", log)
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise DeployError(f"nothing listens on {host}:{port} after {timeout:.0f} s", log)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Refuse (one line) a ``--port`` that another program listens on: the SuperLink could not listen there,
    or, beside a server that allows sharing the port, would share it (gRPC's servers do)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the SuperLink: closed connections do not count
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ConfigError(f"cannot listen on {host}:{port} ({err.strerror or err}); choose another --port "
                              "(or --host)") from None


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


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (/proc/PID/stat), also of a zombie; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def reap(pids, keep=()) -> None:
    """Reap those of ``pids`` that have exited and are this process's children, except ``keep`` (the
    ones a ``Popen`` of ours waits for). They came to us as orphans, this process being a child
    subreaper (:func:`set_subreaper`): a process Flower started and never waited for (the ServerApp,
    whose SuperExec was stopped) stays a ``<defunct>`` entry until its new parent reaps it."""
    own = os.getpid()
    for pid in set(pids) - set(keep):
        if parent_of(pid) == own and watchdog.process_state(pid) == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), or stop it being one: the
    orphans of the processes below it become its children, not init's, so that it reaps them (:func:`reap`)
    before it returns, instead of leaving them ``<defunct>`` until init gets round to it (about 1.5 s
    here). Returns whether it was one before; False where the call is unavailable."""
    if not _LINUX:
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    before = ctypes.c_int(0)
    libc.prctl(37, ctypes.byref(before), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    libc.prctl(36, int(on), 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    return bool(before.value)


def stop_processes(procs: list[subprocess.Popen], sig: int = signal.SIGTERM, grace: float = 10.0,
                   marker: str | None = None) -> list[int]:
    """Stop ``procs`` together: each one's process group and descendants (and, with ``marker``, every
    process carrying it) get ``sig``; whatever is alive after ``grace`` s gets SIGKILL. Returns once
    all of them have exited, and those of them that became this process's children are reaped; the
    pids still alive 5 s after SIGKILL (none in practice)."""
    groups = {p.pid for p in procs}  # started with start_new_session: a pgid is its leader's pid
    pids = {pid for p in procs for pid in (p.pid, *descendants(p.pid))}  # exited ones too: reaped at the end
    if marker is not None:
        pids.update(marked_processes(marker))
    seen = set(pids)
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
            seen |= pids
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
    reap(seen, keep=groups)
    return sorted(pids)


def stop_tree(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Stop ``proc``, its process group and every descendant (SIGTERM, then SIGKILL after ``grace`` s)."""
    stop_processes([proc], sig, grace)


def start_time(pid: int) -> str:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat field 22): with the pid, it names one
    process even after the pid is reused; "" where unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def identity(pid: int | None = None) -> str:
    """``PID:START`` of ``pid`` (this process by default): it names one process even after the pid is reused
    (see :func:`start_time`, :func:`is_process`)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid)}"


def is_process(identity: str) -> bool:
    """Whether the process ``PID:START`` (see :func:`start_time`) is alive."""
    pid, _, started = identity.partition(":")
    return pid.isdigit() and _alive(int(pid)) and (not started or start_time(int(pid)) in ("", started))


def die_with_owner() -> None:
    """In a process below a Supervisor (the ServerApp, a ClientApp): SIGKILL this process as soon as the
    Supervisor's owner has ended, polled every 0.2 s from a daemon thread. Its writes are atomic, so it
    stops as if killed with the owner. Nothing happens in a process not started under a Supervisor."""
    owner = os.environ.get(OWNER_ENV, "")
    if not owner:
        return

    def watch() -> None:
        while is_process(owner):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="fedstyle-owner-watch", daemon=True).start()


def ancestors(pid: int) -> list[int]:
    """The parent of ``pid``, its parent, and so on up to init (Linux /proc; empty elsewhere)."""
    found: list[int] = []
    while pid > 1:
        parent = parent_of(pid)
        if not parent or parent in found:
            break
        found.append(pid := parent)
    return found


def check_stopped(log_dir: Path) -> None:
    """Refuse (one line) while a process of the last Supervisor that used ``log_dir`` is alive, its owner
    included: a second federation must never run beside the orphans of a killed one.

    A live owner is a deployment running (``fedstyle deploy``): named as such, with the one pid to stop
    (it stops its federation itself), not as orphans. This process and its ancestors never count: a
    command started from inside the federation's environment (its marker inherited) is not its orphan."""
    try:
        record = json.loads((Path(log_dir) / RECORD).read_text())
        marker, owner, host = str(record["marker"]), str(record["owner"]), record.get("host")
    except (OSError, ValueError, KeyError, TypeError):
        return  # no Supervisor ran here (or its record is unreadable: nothing to look for)
    if host not in (None, socket.gethostname()):
        return  # its processes ran on another machine, out of this one's sight
    ourselves = {os.getpid(), *ancestors(os.getpid())}
    live = set(marked_processes(marker)) - ourselves
    owner_pid = int(owner.split(":")[0]) if owner.split(":")[0].isdigit() else 0
    if is_process(owner) and owner_pid not in ourselves:
        raise DeployError(f"{Path(log_dir).parent}: a deployment is running (pid {owner_pid}); wait for it to end, "
                          f"or stop it with `kill {owner_pid}` (it stops its own Flower processes), then start it again")
    if live:
        pids = " ".join(map(str, sorted(live)))
        raise DeployError(f"{Path(log_dir).parent}: processes {pids} of its earlier deployment are still running; "
                          f"stop them (kill {pids}), then start it again")


class Supervisor:
    """Named child processes with their logs in ``log_dir``; a context manager that stops them all on exit.

    ``stopped_last`` names the processes :meth:`stop_all` stops after all the others, together with
    the sweep for the marker. Entering refuses while the processes of the folder's last Supervisor
    live (:func:`check_stopped`), records this one, and starts the :mod:`.watchdog`. Use it from one
    thread that outlives its processes: the kernel's parent-death signal follows the thread that
    started a process, not the whole owner.
    """

    stopped_last: tuple[str, ...] = ()

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self._previous_handlers: dict[int, Any] = {}
        self.marker = uuid.uuid4().hex  # in the environment of every process started for this supervisor
        self.owner = identity()
        self.watchdog: subprocess.Popen | None = None
        self._was_subreaper: bool | None = None

    def __enter__(self):
        check_stopped(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        from fedstyle.io import atomic_write_json

        atomic_write_json(self.log_dir / RECORD, {"marker": self.marker, "owner": self.owner,
                                                  "host": socket.gethostname()})
        atexit.register(self.stop_all)
        self._was_subreaper = set_subreaper(True)  # the orphans below come to us, and stop_all reaps them
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller handles signals
                pass
        if _LINUX:  # the watchdog's environment lacks the marker: it never finds itself
            env = {k: v for k, v in os.environ.items() if k not in (MARKER_ENV, OWNER_ENV)}
            with open(self.log_dir / "watchdog.log", "ab") as log:
                self.watchdog = subprocess.Popen([sys.executable, "-S", watchdog.__file__, str(os.getpid()),
                                                  self.marker], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                 env=env, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        atexit.unregister(self.stop_all)
        if self._was_subreaper is False:
            set_subreaper(False)

    def _on_signal(self, signum, frame) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def launch(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start ``argv`` as ``name`` in a session of its own, its output appended to ``<log_dir>/<name>.log``;
        on Linux it dies with this process (see the module docstring). Its environment is ``env`` with
        :data:`MARKER_ENV` and :data:`OWNER_ENV`, inherited by everything it starts."""
        log = self.log_dir / f"{name}.log"
        env = {**env, MARKER_ENV: self.marker, OWNER_ENV: self.owner}
        if _LINUX:
            argv = [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
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
        """Stop every process this supervisor started and everything they started; return when all have
        exited and this process's children are reaped.

        All but :attr:`stopped_last` first (together), then those with whatever is left; processes
        that left their parent's tree are found by the marker in their environment. The watchdog last.
        """
        first = [self.procs.pop(n) for n in sorted(self.procs) if n not in self.stopped_last]
        last = [self.procs.pop(n) for n in list(self.procs)]
        stop_processes(first)
        left = stop_processes(last, marker=self.marker)
        if left:
            print(f"fedstyle deploy: processes {left} did not exit after SIGKILL", file=sys.stderr)
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
            self.watchdog = None
