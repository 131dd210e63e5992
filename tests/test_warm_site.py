"""Warm sites (fedstyle/runtimes/flower/warm_site.py): a site process around its SuperNode forks each ClientApp.

That the forked ClientApps answer exactly as Flower's own ``flwr-clientapp`` processes would is the deployment
tests' (tests/test_flower_deploy.py: bitwise equal to the simulator, a killed site, Ctrl-C, a SIGKILLed
deploy); here: the command, and that the site and its SuperNode stop together.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("flwr", reason="warm sites run Flower's SuperNode (fedstyle[flower])")

from process_waits import wait_for  # noqa: E402

from fedstyle.runtimes.flower.deployment import flower_bin  # noqa: E402
from fedstyle.runtimes.flower.processes import _alive, descendants, free_port  # noqa: E402
from fedstyle.runtimes.flower.warm_site import COLD_ENV, runtime_host, runtime_port, site_command  # noqa: E402

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm sites fork (Linux)")


def test_the_runtime_api_address_is_read_from_the_supernode_command():
    argv = ["flower-supernode", "--superlink", "coord:9092", "--port", "4711", "--insecure"]
    assert (runtime_host(argv), runtime_port(argv)) == ("127.0.0.1", 4711)
    assert runtime_port(["flower-supernode", "--port=4712"]) == 4712
    assert runtime_host(["flower-supernode", "--host", "0.0.0.0", "--port", "1"]) == "127.0.0.1"
    assert runtime_host(["flower-supernode", "--host", "10.0.0.5", "--port", "1"]) == "10.0.0.5"


@linux
def test_a_site_is_the_warm_runner_around_its_supernode_unless_cold_sites_are_asked_for(monkeypatch):
    argv = ["flower-supernode", "--superlink", "coord:9092", "--port", "4711"]
    assert site_command(argv) == [sys.executable, "-m", "fedstyle.runtimes.flower.warm_site", *argv]
    monkeypatch.setenv(COLD_ENV, "1")
    assert site_command(argv) == argv


def _start_site(tmp_path) -> tuple[subprocess.Popen, int]:
    """A warm site whose SuperNode has no SuperLink to reach (it keeps retrying): its Runtime API listens."""
    argv = [flower_bin("flower-supernode"), "--superlink", f"127.0.0.1:{free_port()}", "--insecure",
            "--port", str(free_port()), "--max-retries", "1000"]
    log = open(tmp_path / "site.log", "wb")  # noqa: SIM115 - closed by the test's process end
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "home")}
    site = subprocess.Popen(site_command(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    wait_for(lambda: "fedstyle site: warm" in (tmp_path / "site.log").read_text(errors="replace"), 120,
             "the site to import and find its SuperNode's Runtime API")
    assert _listening(runtime_port(argv))
    supernode = next(p for p in descendants(site.pid) if "flower-supernode" in _cmdline(p)
                     and "warm_site" not in _cmdline(p))
    return site, supernode


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@linux
def test_the_site_ends_when_its_supernode_does(tmp_path):
    site, supernode = _start_site(tmp_path)
    try:
        time.sleep(1.0)  # the SuperExec loop polls the Runtime API
        assert site.poll() is None, (tmp_path / "site.log").read_text()[-2000:]
        os.kill(supernode, signal.SIGKILL)
        assert site.wait(timeout=30) == 1, (tmp_path / "site.log").read_text()[-2000:]
        assert "the SuperNode exited" in (tmp_path / "site.log").read_text()
    finally:
        if site.poll() is None:
            os.killpg(site.pid, signal.SIGKILL)


@linux
def test_the_supernode_dies_with_its_site(tmp_path):
    site, supernode = _start_site(tmp_path)
    try:
        os.kill(site.pid, signal.SIGKILL)  # no handler runs: the kernel's parent-death signal stops the SuperNode
        site.wait(timeout=30)
        wait_for(lambda: not _alive(supernode), 30, "the SuperNode to die with its site")
    finally:
        try:
            os.killpg(site.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
