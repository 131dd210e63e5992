"""A Ray head node for the tests that run Flower's simulation engine on a running cluster (test_flower_cluster.py).

Started with ``ray start --head --block`` in a session of its own, with its own ``--temp-dir``, and stopped by
terminating that one process (``ray stop`` would stop every Ray on the machine). The methods' "under Flower"
tests do not use Ray: they run Flower's ServerApp and ClientApp on an in-process grid (tests/flower_grid.py, every
message over Flower's wire format), which checks the same queries, payloads and state in seconds where Ray's
actors took 15-25 s each on the 2-core CPU; Ray's engine is tested method-independently (test_flower_sim.py on
a private instance, test_flower_cluster.py on this head, test_sweep.py's Ray workers).
"""

from __future__ import annotations

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
