"""Flower processes for ``fedstyle deploy``: a SuperLink, SuperNodes, the run submitted with ``flwr run``.

:class:`Federation` starts each process in its own session (process group) with its log in
``<run dir>/flower/`` and stops every process it started — and everything those started (Flower's
SuperExec, ServerApp and ClientApp processes, found also after they left the process tree by the
``FEDSTYLE_DEPLOY`` marker in their environment) — on success, on error, on Ctrl-C / SIGTERM and at
interpreter exit; it returns only once all of them have exited. A ``fedstyle deploy`` killed outright
(SIGKILL, the OOM killer) takes every one of them with it (the supervision itself: :mod:`.processes`).
Ports are chosen free at run time on 127.0.0.1 unless given.

The run directory's lock (:class:`~fedstyle.io.DirectoryLock`) is held, shared, by the process running
the Federation and by the ServerApp, which writes the directory: no other run, resume or deployment
gets it while either lives. A Federation does not start while any process of the directory's last
one is alive.

The local sites share the machine: each gets ``cores / sites`` torch threads (``OMP_NUM_THREADS``,
unless set), and keeps its clients' persistent state in ``<run dir>/flower/state``
(:mod:`fedstyle.runtimes.site_state`), so ``fedstyle deploy --resume`` continues it.

Flower layout under ``<run dir>/flower/``::

    app/pyproject.toml    the Flower App (FAB) naming fedstyle's ServerApp and ClientApp
    home/                 FLWR_HOME: the `flwr` CLI's SuperLink connection, installed apps
    deploy.json           how the federation was started (for --resume); its presence marks a deployment
    supervisor.json       the last start's process marker and owner (a resume refuses while they live)
    serverapp.pid         the ServerApp process of the last start, once it began the run (watched while it runs)
    state/                the sites' per-client state (run-<config digest>/client-K/)
    superlink.log, site-K.log, serverapp.log, watchdog.log

Runtime dependency installation is disabled everywhere (sites may be offline): SuperLink and
SuperNodes use the Python environment they run in, which must have fedstyle[flower] installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedstyle.errors import ConfigError
from fedstyle.io import DirectoryLock, atomic_write_json, atomic_write_text
from fedstyle.runtimes.flower.node_config import SIMULATION_MARKER_ENV
from fedstyle.runtimes.flower.processes import (
    MARKER_ENV,
    DeployError,
    Supervisor,
    check_port_free,
    check_stopped,
    free_port,
    identity,
    is_process,
    wait_for_port,
)
from fedstyle.runtimes.flower.warm_site import site_command

CONNECTION = "fedstyle"

APP_PYPROJECT = """\
# The Flower App that `fedstyle deploy` submits: fedstyle's ServerApp and ClientApp from the installed
# fedstyle package (runtime dependency installation is disabled, so nothing is installed from here).
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedstyle-app"
version = "1.0.0"
description = "fedstyle algorithms on Flower"
license = "MIT"
dependencies = ["flwr>=1.41.0"]

[tool.flwr.app]
publisher = "fedstyle"

[tool.flwr.app.components]
serverapp = "fedstyle.runtimes.flower.serverapp:app"
clientapp = "fedstyle.runtimes.flower.clientapp:app"

[tool.flwr.app.config]
run-dir = ""
min-sites = 1
wait-timeout = 600.0
round-timeout = 1800.0
"""


#: in flower/: ``PID:START`` of the ServerApp process, written when fedstyle's ServerApp begins the run, so
#: that `fedstyle deploy` notices at once when that process ends (Flower's SuperLink notices only after two
#: missed heartbeats, 51 s measured). Flower relaunches a ServerApp that died before it got there.
SERVERAPP_RECORD = "serverapp.pid"
#: seconds `flwr run --stream` gets, once the ServerApp has ended without finishing the run, to end by
#: itself with the ServerApp's last log lines (a ServerApp that raised reports it, and the stream ends
#: within about LOG_STREAM_INTERVAL, 1 s); a killed one never reports
SERVERAPP_GRACE = 2.0
#: Flower's SuperExec task polling interval (its default is 1 s per ServerApp / ClientApp process start)
POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPEREXEC_POLL_INTERVAL = 0.25
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def fedstyle_path(pythonpath: str | None) -> str:
    """PYTHONPATH with the folder of the running fedstyle first: Flower's processes (ServerApp, ClientApps)
    import the same fedstyle as the process that starts them, also from a source checkout or a git
    worktree that the environment's installed (or editable) fedstyle does not point to."""
    import fedstyle

    root = str(Path(fedstyle.__file__).resolve().parent.parent)
    rest = [p for p in (pythonpath or "").split(os.pathsep) if p and p != root]
    return os.pathsep.join([root, *rest])


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def flower_bin(name: str) -> str:
    """A Flower executable from the running interpreter's environment (falls back to PATH)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"{name} not found; install Flower with: pip install -c constraints.txt 'fedstyle[flower]'")
    return found


@dataclass
class DeploySettings:
    """How a federation is started; saved in flower/deploy.json so --resume starts the same one."""

    sites: int
    insecure: bool = False
    certs: str | None = None
    node_auth: bool = False
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    min_sites: int = 1
    wait_timeout: float = 600.0
    round_timeout: float = 1800.0
    site_data_roots: list[str] = field(default_factory=list)

    def validate(self, resume: Path | None = None) -> None:
        """Refuse (one line) settings that cannot start; ``resume``: the run directory being resumed."""
        if self.sites < 1:
            raise ConfigError("--sites must be at least 1")
        if not 1 <= self.min_sites <= self.sites:
            raise ConfigError(f"--min-sites must be between 1 and --sites ({self.sites})")
        if self.insecure and (self.certs or self.node_auth):
            raise ConfigError("--insecure turns TLS off; it cannot be combined with --certs or --node-auth")
        if self.port:
            check_port_free(self.host, self.port)
        if not self.insecure and not self.certs:
            raise ConfigError("TLS is on by default: give --certs DIR (make one with `fedstyle deploy certs --out DIR`) "
                              "or pass --insecure to run without encryption")
        if self.certs:
            from fedstyle.runtimes.flower.certs import CA_CERT, SERVER_CERT, SERVER_KEY, check_certificates

            missing = [n for n in (CA_CERT, SERVER_CERT, SERVER_KEY) if not (Path(self.certs) / n).exists()]
            if missing:
                raise ConfigError(f"--certs {self.certs} lacks {', '.join(missing)}; make them with "
                                  f"`fedstyle deploy certs --out {self.certs} --sites {self.sites}`")
            check_certificates(self.certs, resume)
        if self.node_auth:
            from fedstyle.runtimes.flower.certs import site_key_paths

            missing = [str(p) for s in range(self.sites) for p in site_key_paths(Path(self.certs), s) if not p.exists()]
            if missing:
                raise ConfigError(f"--node-auth needs a key pair per site; missing {missing[0]}; make them with "
                                  f"`fedstyle deploy certs --out DIR --sites {self.sites}`")

    def run_config(self, run_dir: Path) -> str:
        return (f'run-dir="{run_dir}" min-sites={self.min_sites} wait-timeout={float(self.wait_timeout)} '
                f"round-timeout={float(self.round_timeout)}")


class Federation(Supervisor):
    """A SuperLink and SuperNodes on this machine, for one run directory; a context manager.

    Entering takes the run directory's lock — or holds the caller's ``lock``, already acquired — shared
    from then on (the ServerApp joins it); it refuses while a process of the directory's last
    Federation lives. :meth:`stop_all` stops the sites and the run first (together), then the SuperLink
    with whatever is left; processes that left their parent's tree (Flower's SuperExec, ServerApp and
    ClientApp processes) are found by the marker in their environment.
    """

    stopped_last = ("superlink",)

    def __init__(self, run_dir: str | Path, settings: DeploySettings, *, quiet: bool = False,
                 lock: DirectoryLock | None = None):
        settings.validate()
        self.lock, self._own_lock = lock, None
        self.run_dir = Path(run_dir).resolve()
        self.settings = settings
        self.quiet = quiet
        self.flower_dir = self.run_dir / "flower"
        super().__init__(self.flower_dir)  # logs and working folder: flower/
        self.state_dir = self.flower_dir / "state"  # the local sites' per-client state (see .site)
        self.home = self.flower_dir / "home"
        self.app_dir = self.flower_dir / "app"
        self.port = settings.port or free_port(settings.host)
        self.site_ports: dict[int, int] = {}
        self.certs = Path(settings.certs).resolve() if settings.certs else None

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self):
        check_stopped(self.flower_dir)  # before the lock: an orphaned ServerApp holds it, this names them all
        if self.lock is None:
            self.lock = self._own_lock = DirectoryLock(self.run_dir).acquire()
        self.lock.share()  # the ServerApp takes it too, shared: other writers stay refused while either lives
        try:
            return super().__enter__()
        except BaseException:
            self._release_own_lock()
            raise

    def __exit__(self, *exc) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._release_own_lock()

    def _release_own_lock(self) -> None:
        if self._own_lock is not None:
            self._own_lock.release()
            self.lock = self._own_lock = None

    def env(self, site: bool = False) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(self.home)
        # Flower starts its helpers (flower-superexec, flwr-serverapp, flwr-clientapp) by name from PATH
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["PYTHONPATH"] = fedstyle_path(env.get("PYTHONPATH"))
        env[MARKER_ENV] = self.marker  # inherited by every process Flower starts below ours
        env.pop(SIMULATION_MARKER_ENV, None)  # a deployment's sites are never the simulation engine's
        # Flower's SuperExec looks for tasks (a ServerApp or ClientApp process to start) every 1 s by default
        env.setdefault(POLL_ENV, str(SUPEREXEC_POLL_INTERVAL))
        if site:
            # the sites share this machine's cores: one torch thread pool each of cores / sites threads
            # (torch's default, one thread per core in every site, oversubscribes the machine)
            threads = str(max(1, _cpu_count() // max(1, self.settings.sites)))
            for name in THREAD_VARIABLES:
                env.setdefault(name, threads)
        return env

    def _start(self, name: str, argv: list[str], site: bool = False) -> subprocess.Popen:
        return self.launch(name, argv, self.env(site))

    # -- setup --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Write the Flower App, FLWR_HOME's connection and deploy.json."""
        self.flower_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.app_dir / "pyproject.toml", APP_PYPROJECT)
        connection = [f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]',
                      f'address = "{self.client_host()}:{self.port}"']
        if self.settings.insecure:
            connection.append("insecure = true")
        else:
            connection.append(f'root-certificates = "{self.certs / "ca.crt"}"')
        atomic_write_text(self.home / "config.toml", "\n".join(connection) + "\n")
        save_settings(self.run_dir, self.settings)

    def client_host(self) -> str:
        return "127.0.0.1" if self.settings.host in ("0.0.0.0", "::") else self.settings.host

    def tls_args_server(self) -> list[str]:
        if self.settings.insecure:
            return ["--insecure"]
        return ["--ssl-certfile", str(self.certs / "server.crt"), "--ssl-keyfile", str(self.certs / "server.key"),
                "--ssl-ca-certfile", str(self.certs / "ca.crt")]

    def start_superlink(self, timeout: float = 120.0) -> None:
        argv = [flower_bin("flower-superlink"), *self.tls_args_server(), "--host", self.settings.host,
                "--port", str(self.port), "--disable-runtime-dependency-installation"]
        if self.settings.node_auth:
            argv.append("--enable-supernode-auth")
        proc = self._start("superlink", argv)
        wait_for_port(self.client_host(), self.port, timeout, proc, self.flower_dir / "superlink.log")
        if self.settings.node_auth:
            self.register_sites()

    def register_sites(self) -> None:
        from fedstyle.runtimes.flower.certs import site_key_paths

        for site in range(self.settings.sites):
            _, public = site_key_paths(self.certs, site)
            self.flwr(["supernode", "register", str(public), CONNECTION], f"register site {site}")

    def flwr(self, args: list[str], what: str, timeout: float = 120.0) -> str:
        result = subprocess.run([flower_bin("flwr"), *args], env=self.env(), capture_output=True, text=True,
                                timeout=timeout, cwd=self.flower_dir, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise DeployError(f"{what} failed (flwr {' '.join(args)}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        return result.stdout

    def site_argv(self, site: int) -> list[str]:
        port = self.site_ports.setdefault(site, free_port())
        from fedstyle.runtimes.flower.node_config import node_config as make_node_config

        roots = self.settings.site_data_roots
        node_config = make_node_config(site, self.state_dir, roots[site] if site < len(roots) and roots[site] else None)
        argv = [flower_bin("flower-supernode"), "--superlink", f"{self.client_host()}:{self.port}",
                "--port", str(port), "--node-config", node_config]
        if self.settings.insecure:
            argv.append("--insecure")
        else:
            argv += ["--root-certificates", str(self.certs / "ca.crt")]
        if self.settings.node_auth:
            from fedstyle.runtimes.flower.certs import site_key_paths

            argv += ["--auth-supernode-private-key", str(site_key_paths(self.certs, site)[0])]
        return argv

    def start_site(self, site: int) -> subprocess.Popen:
        # a warm site (.warm_site): its ClientApp processes fork from one that imported torch and fedstyle
        return self._start(f"site-{site}", site_command(self.site_argv(site)), site=True)

    def start(self) -> None:
        self.prepare()
        self.start_superlink()
        for site in range(self.settings.sites):
            self.start_site(site)

    # -- the run ------------------------------------------------------------------------
    def submit(self) -> subprocess.Popen:
        """Submit the run (``flwr run --stream``); the returned process ends when the run ends."""
        argv = [flower_bin("flwr"), "run", str(self.app_dir), CONNECTION, "--run-config",
                self.settings.run_config(self.run_dir), "--stream"]
        (self.flower_dir / SERVERAPP_RECORD).unlink(missing_ok=True)  # an earlier start's: not this run's ServerApp
        return self._start("serverapp", argv)

    def wait(self, submitted: subprocess.Popen, rounds: int) -> None:
        """Wait for the run to end, showing progress from metrics.jsonl; raise if it failed."""
        from fedstyle.experiments.runner import DONE, METRICS

        bar = None
        if not self.quiet:
            from tqdm.auto import tqdm

            bar = tqdm(total=rounds, desc=f"deploy {self.settings.sites} sites", unit="round", file=sys.stderr)
        shown, seen_events = 0, 0
        server, server_ended = None, None  # the ServerApp process once it began the run; when it was seen gone
        try:
            while True:
                # before `done` is read: a ServerApp writes it, then exits
                if server is None:
                    server = read_serverapp_record(self.flower_dir)
                elif server_ended is None and not is_process(server):
                    server_ended = time.monotonic()
                # `done` is the run directory's last write: the run is complete even while Flower is still
                # winding down (`flwr run --stream` notices the end of the run a few seconds later)
                finished = submitted.poll() is not None or (self.run_dir / DONE).exists()
                records = _read_lines(self.run_dir / METRICS)
                evals = [r for r in records if "event" not in r and "round" in r]
                events = [r for r in records if r.get("event") in ("dropout", "rejoin")]
                if bar is not None:
                    for event in events[seen_events:]:
                        bar.write(f"{event['event']}: round {event['round']}, clients {event['clients']}", file=sys.stderr)
                    seen_events = len(events)
                    done_rounds = evals[-1]["round"] if evals else 0
                    if done_rounds == 0:  # start-up takes a minute: say which local sites are up
                        joined = sites_joined(self.flower_dir, self.settings.sites)
                        if joined is not None:
                            bar.set_postfix_str(f"sites joined {joined[0]}/{self.settings.sites}, "
                                                f"identified {joined[1]}/{self.settings.sites}", refresh=True)
                    if done_rounds > shown:
                        bar.update(done_rounds - shown)
                        shown = done_rounds
                        # --target-eval end: the targets only at the end, source validation before (and always
                        # under --protocol all, which has no target)
                        key, name = ("target_acc", "tgt") if evals[-1].get("target_acc") else ("source_val_acc", "src")
                        acc = evals[-1].get(key, {})
                        bar.set_postfix({name: f"{sum(acc.values()) / max(1, len(acc)):.3f}"}, refresh=True)
                if finished:
                    break
                if server_ended is not None and time.monotonic() - server_ended >= SERVERAPP_GRACE:
                    raise DeployError(f"the ServerApp (pid {server.split(':')[0]}) ended before the run finished "
                                      "(killed, or it crashed before it could say why)",
                                      self.flower_dir / "serverapp.log", lines=30)
                if "superlink" in self.procs and self.procs["superlink"].poll() is not None:
                    raise DeployError(f"the SuperLink exited (code {self.procs['superlink'].returncode})",
                                      self.flower_dir / "superlink.log")
                time.sleep(0.2)
        finally:
            if bar is not None:
                bar.close()
        if submitted.poll() is not None:
            self.procs.pop("serverapp", None)  # ended by itself; otherwise stop_all stops it with the sites
        if not (self.run_dir / DONE).exists():  # what to do next is the caller's to say (fedstyle deploy: resume)
            raise DeployError("the run did not finish", self.flower_dir / "serverapp.log", lines=30)


def record_serverapp(run_dir: Path) -> None:
    """In the ServerApp, once it has begun the run: write :data:`SERVERAPP_RECORD` for `fedstyle deploy`."""
    flower_dir = Path(run_dir) / "flower"
    if flower_dir.is_dir():  # a deployment's run directory (see save_settings)
        atomic_write_text(flower_dir / SERVERAPP_RECORD, identity())


def read_serverapp_record(flower_dir: Path) -> str | None:
    """The ServerApp's ``PID:START`` from :data:`SERVERAPP_RECORD`; None before it has begun the run."""
    try:
        text = (Path(flower_dir) / SERVERAPP_RECORD).read_text().strip()
    except OSError:
        return None
    return text if text.partition(":")[0].isdigit() else None


def sites_joined(flower_dir: Path, sites: int) -> tuple[int, int] | None:
    """(SuperNodes registered with the SuperLink, sites that answered the identify query), read from
    the local sites' logs; None when no site of this deployment logs here (remote sites)."""
    joined = identified = 0
    logs = [Path(flower_dir) / f"site-{i}.log" for i in range(sites)]
    if not any(log.exists() for log in logs):
        return None
    for log in logs:
        text = log.read_text(errors="replace") if log.exists() else ""
        joined += "SuperNode ID:" in text
        identified += "Sending: query.identify" in text
    return joined, identified


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def save_settings(run_dir: Path, settings: DeploySettings) -> None:
    """flower/deploy.json: how the federation is started; it also marks the directory as a deployment's
    (written before config.json, so that no deployment's run directory is ever resumed on the simulator)."""
    from fedstyle.experiments.rundir import DEPLOYMENT

    atomic_write_json(Path(run_dir) / DEPLOYMENT, asdict(settings))


def load_settings(run_dir: Path) -> DeploySettings:
    from fedstyle.experiments.rundir import DEPLOYMENT

    path = run_dir / DEPLOYMENT
    if not path.exists():
        raise ConfigError(f"{run_dir} was not started by `fedstyle deploy` (no {path}); "
                          f"use `fedstyle run --resume {run_dir}` for simulator runs")
    return DeploySettings(**json.loads(path.read_text()))


def deploy_run(run_dir: str | Path, settings: DeploySettings, *, quiet: bool = False, rounds: int,
               lock: DirectoryLock | None = None) -> dict[str, Any]:
    """Start the federation, run the run directory's config on it, stop every process; the summary.
    ``lock``: the run directory's lock when the caller holds it (see :class:`Federation`)."""
    from fedstyle.experiments.runner import SUMMARY

    with Federation(run_dir, settings, quiet=quiet, lock=lock) as federation:
        federation.start()
        federation.wait(federation.submit(), rounds)
        return json.loads((federation.run_dir / SUMMARY).read_text())
