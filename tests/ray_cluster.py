"""One Ray head node per test process, for the tests that run a method on Flower's simulation engine.

A private Ray instance takes 10-15 s to start on the 2-core CPU. The method test on Ray (StableFDG's query phase,
test_stablefdg.py) joins this head through the same ``--ray-address HOST:PORT`` path a cluster user takes (tested
against the simulator in test_flower_cluster.py); the default private instance keeps its own test
(test_flower_sim.py). The other methods' "under Flower" tests run Flower's ServerApp and ClientApp on an
in-process grid (tests/flower_grid.py: every message over Flower's wire format), which checks the same queries,
payloads and state in seconds where Ray's actors took 15-25 s each. The head runs with ``--block`` in a session
of its own and is stopped by terminating that one process (``ray stop`` would stop every Ray on the machine).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

_HEAD: dict[str, object] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(cpus: int = 2, resources: dict[str, float] | None = None, timeout: float = 180.0):
    """Start a Ray head node (``ray start --head --block``); (its process, its address, its temp folder)."""
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths live under it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [str(ray_cli), "start", "--head", "--num-cpus", str(cpus), "--num-gpus", "0", "--port", str(free_port()),
            "--temp-dir", str(temp), "--include-dashboard", "false", "--block"]
    if resources:
        argv += ["--resources", json.dumps(resources)]
    with open(temp / "head.log", "w") as log:
        head = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address_file = temp / "ray_current_cluster"
    deadline = time.monotonic() + timeout
    while not (address_file.exists() and address_file.read_text().strip()):
        if head.poll() is not None or time.monotonic() > deadline:
            stop_head(head, temp)
            pytest.fail("the Ray head node did not start:\n" + (temp / "head.log").read_text()[-3000:])
        time.sleep(0.5)
    return head, address_file.read_text().strip(), temp


def stop_head(head: subprocess.Popen, temp: Path) -> None:
    head.terminate()  # `ray start --block` stops the processes it started when it is terminated
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    shutil.rmtree(temp, ignore_errors=True)


def shared_ray_address() -> str:
    """The address of this test process's shared head node, started on first use, stopped at exit."""
    if "address" not in _HEAD:
        head, address, temp = start_head()
        _HEAD.update(head=head, address=address, temp=temp)
        atexit.register(stop_head, head, temp)
    return str(_HEAD["address"])
