"""A site whose ClientApp processes start warm: forked from one process that imported torch and fedstyle once.

    python -m fedstyle.runtimes.flower.warm_site flower-supernode --superlink HOST:PORT --port P [...]

Flower runs every message a site answers in a fresh ``flwr-clientapp`` process (Flower 1.41: one task token
per app execution), started by the SuperNode's SuperExec. Before it trains, each one imports torch, fedstyle
and — at the optimizer's first step, through torch.optim's ``_disable_dynamo`` wrappers — torch._dynamo:
~4-5 CPU s per message on the 2-core CPU, on every site, every round, more than a small model's local training.
Measured (``python benchmarks/warm_site.py``: 3 sites, FedAvg, 3 rounds, 12 messages): 129.8 CPU s and 77 s for
the whole deployment with Flower's processes, 63.3 CPU s and 47 s with this, the same metrics.

This process is the site instead: it starts the SuperNode given on its command line as its child with
``--isolation process`` (the SuperNode then starts no SuperExec of its own), imports what a ClientApp
process imports, and runs Flower's own SuperExec loop (``run_superexec``: it asks the SuperNode's Runtime
API for tasks) with :class:`ForkExecutor`, which forks a child per ClientApp task where Flower's executor
starts ``flwr-clientapp``. The child runs what ``flwr-clientapp`` runs, Flower's ``run_clientapp`` with the
task's token (pull the message, load the ClientApp, answer, push the reply), and exits: still one process
per message, with nothing kept between messages (fedstyle's site rebuilds its run per process as before),
only the imports already done. Fork, not a pool of live interpreters: each child starts from the same
untouched state, as a fresh ``flwr-clientapp`` does.

Processes, for the deployment's supervision (:mod:`.processes`): the SuperNode and the forked ClientApps
stay in this process's process group, which the Supervisor stops together; the SuperNode gets the kernel's
parent-death signal (it dies with this process, as Flower's SuperExec dies with its SuperNode); each
ClientApp watches this process (Flower's parent monitor, the task's ``parent_pid``) and the deployment's
owner (:func:`~.processes.die_with_owner`); this process exits when its SuperNode has exited (a thread waits
for it). Nothing here
runs a torch operation before a fork (no intra-op thread pool to inherit half-made).

What it relies on in Flower 1.41 (pinned in pyproject.toml): ``run_superexec`` takes its executor from the
module's ``get_executor`` (replaced here for this process only), the executor protocol of
``flwr.supercore.superexec.executor.types`` and ``run_clientapp``'s signature. Linux (fork); elsewhere,
and with ``FEDSTYLE_COLD_SITES=1``, :func:`site_command` keeps Flower's own ``flower-supernode``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import traceback

#: environment variable: ``1`` runs sites as plain ``flower-supernode`` processes (Flower's own per-message
#: ``flwr-clientapp`` processes), e.g. to compare, or where fork is not wanted
COLD_ENV = "FEDSTYLE_COLD_SITES"


def warm_sites_available() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(COLD_ENV, "") != "1"


def site_command(supernode_argv: list[str]) -> list[str]:
    """The command that runs a site whose SuperNode is ``supernode_argv`` (``flower-supernode ...``): this
    module around it where warm sites are available, else ``supernode_argv`` itself."""
    if not warm_sites_available():
        return list(supernode_argv)
    return [sys.executable, "-m", __name__, *supernode_argv]


def runtime_port(supernode_argv: list[str]) -> int:
    """The port of the SuperNode's Runtime API (``--port``; Flower's default where it is not given)."""
    for i, arg in enumerate(supernode_argv):
        if arg == "--port" and i + 1 < len(supernode_argv):
            return int(supernode_argv[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT

    return int(SUPERNODE_UVICORN_DEFAULT_PORT)


def runtime_host(supernode_argv: list[str]) -> str:
    for i, arg in enumerate(supernode_argv):
        if arg == "--host" and i + 1 < len(supernode_argv):
            host = supernode_argv[i + 1]
            return "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return "127.0.0.1"  # Flower's default host for the Runtime API


class ForkExecutor:
    """Flower's SuperExec executor protocol (``flwr.supercore.superexec.executor.types.Executor``) with a
    forked child per ClientApp task; :meth:`reconcile` reaps the children (the SuperNode's end is watched by
    a thread of :func:`main`'s, :func:`_exit_with`)."""

    def __init__(self):
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types, *, insecure: bool = False,
                              root_certificates_path: str | None = None):
        from flwr.supercore.constant import TaskType

        # only ClientApps: a site runs no ServerApp (nor any other of Flower's app types)
        return {t for t in supported_task_types if t == TaskType.CLIENT_APP}, set()

    def wait_for_capacity(self, task_type=None, *, fab_hash=None, insecure: bool = False,
                          root_certificates_path: str | None = None) -> None:
        return None

    def launch(self, spec):
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor.types import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            return LaunchResult.failed(f"a fedstyle site runs ClientApps only, not {spec.task_type}")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # the child must not write this process's buffered output a second time
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _run_clientapp_and_exit(spec)
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        return None


def _run_clientapp_and_exit(spec) -> None:
    """In a forked child: run one ClientApp task as ``flwr-clientapp --token`` would, then ``os._exit`` (no
    exit handler or atexit hook of the parent's may run here)."""
    code = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)  # the parent's handlers would shut the parent's client down
        from flwr.supercore.exit import exit_handler
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        exit_handler.registered_exit_handlers.clear()  # the SuperExec's (its Runtime API client, the executor)
        from fedstyle.runtimes.flower.processes import die_with_owner

        die_with_owner()  # threads do not survive a fork: the owner watch the module started is the parent's
        print(f"fedstyle site: ClientApp task {spec.task_id} in process {os.getpid()} (forked from {os.getppid()})",
              file=sys.stderr, flush=True)
        certificates = None
        if not spec.insecure and spec.root_certificates_path:
            with open(spec.root_certificates_path, "rb") as handle:
                certificates = handle.read()
        run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token, insecure=spec.insecure,
                      certificates=certificates, parent_pid=spec.parent_pid,
                      runtime_dependency_install=spec.runtime_dependency_install)
        code = 0
    except SystemExit as stop:  # Flower's flwr_exit ends run_clientapp with sys.exit
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported, then this child ends
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _exit_with(supernode: subprocess.Popen) -> None:
    """Wait for the SuperNode and end this process with it (its forked ClientApps watch this process and stop)."""
    code = supernode.wait()
    print(f"fedstyle site: the SuperNode exited (code {code}); stopping", file=sys.stderr, flush=True)
    os._exit(code if code > 0 else int(code != 0))  # killed by a signal: 1


def _warm_up() -> None:
    """Import what every ClientApp process imports (no torch operation runs: nothing to inherit half-made)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim's first step imports it)
    import torch.optim  # noqa: F401
    from flwr.supernode.runtime import run_clientapp  # noqa: F401

    import fedstyle.runtimes.flower.clientapp  # noqa: F401  (the ClientApp the task loads)
    import fedstyle.runtimes.flower.site  # noqa: F401  (what its handlers import)


def main(argv: list[str] | None = None) -> None:
    supernode_argv = list(sys.argv[1:] if argv is None else argv)
    if not supernode_argv:
        raise SystemExit("usage: python -m fedstyle.runtimes.flower.warm_site flower-supernode [ARGS...]")
    from fedstyle.runtimes.flower.processes import _DIE_WITH_PARENT, DeployError, wait_for_port

    host, port = runtime_host(supernode_argv), runtime_port(supernode_argv)
    # the SuperNode, our child, dies with us (the kernel's parent-death signal, set by the exec shim)
    supernode = subprocess.Popen([sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *supernode_argv,
                                  "--isolation", "process"], stdin=subprocess.DEVNULL)
    # this process ends when its SuperNode does, whatever its main thread is doing then (the SuperExec loop can
    # sit in its Runtime API client's retries once the SuperNode is gone, never reaching ForkExecutor.reconcile)
    threading.Thread(target=_exit_with, args=(supernode,), name="fedstyle-supernode-watch", daemon=True).start()
    _warm_up()  # while the SuperNode starts
    try:
        wait_for_port(host, port, 120.0, supernode)
    except DeployError as err:
        supernode.kill()
        raise SystemExit(f"fedstyle site: the SuperNode did not start: {err}") from None

    print(f"fedstyle site: warm (torch and fedstyle imported); SuperNode {supernode.pid}, its Runtime API "
          f"{host}:{port}; each ClientApp task runs in a process forked from this one ({os.getpid()})",
          file=sys.stderr, flush=True)
    from flwr.supercore.superexec import run_superexec as flower_superexec

    executor = ForkExecutor()
    # Flower 1.41 builds the executor from a type name; this process's loop takes ours
    flower_superexec.get_executor = lambda *args, **kwargs: executor
    try:
        flower_superexec.run_superexec(runtime_api_address=f"{host}:{port}", insecure=True)
    finally:
        if supernode.poll() is None:
            supernode.terminate()
            try:
                supernode.wait(timeout=10)
            except subprocess.TimeoutExpired:
                supernode.kill()
                supernode.wait()


if __name__ == "__main__":
    main()
