"""``--backend flower-sim --ray-address auto`` joins a running Ray cluster and reproduces ``--backend sim``."""

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
import torch

pytest.importorskip("flwr", reason="--backend flower-sim needs fedstyle[flower-sim] (flwr not installed)")
pytest.importorskip("ray", reason="--backend flower-sim needs fedstyle[flower-sim] (ray not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.experiments.runner import run_experiment  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray head node starts in ~10 s

#: a resource only the test's head node has: proof that the run joined that cluster
MARKER = "fedstyle_test_head"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(monkeypatch):
    """A Ray head node with 2 CPUs, as `ray start --head` on a cluster's first node; stopped afterwards.

    It runs with ``--block`` and is stopped by terminating that one process, which stops the
    processes it started (``ray stop`` would stop every Ray instance on the machine, other
    people's included). Its own ``--temp-dir`` keeps it from becoming this machine's "current"
    cluster for anyone else; ``RAY_ADDRESS`` points ``--ray-address auto`` at it, as Ray resolves
    ``auto`` from that variable first.
    """
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths live under it
    log = open(temp / "head.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--num-cpus", "2", "--num-gpus", "0", "--port", str(_free_port()),
         "--temp-dir", str(temp), "--include-dashboard", "false", "--resources", json.dumps({MARKER: 1}), "--block"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        address_file = temp / "ray_current_cluster"
        deadline = time.monotonic() + 180
        while not (address_file.exists() and address_file.read_text().strip()):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the Ray head node did not start:\n" + (temp / "head.log").read_text()[-3000:])
            time.sleep(0.5)
        monkeypatch.setenv("RAY_ADDRESS", address_file.read_text().strip())
        yield address_file.read_text().strip()
    finally:
        head.terminate()  # `ray start --block` stops the processes it started when it is terminated
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _evaluations(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in lines if "event" not in r]


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on workers
def test_flower_sim_on_a_running_cluster_equals_simulator(ray_head, tiny_config, tmp_path, monkeypatch):
    from fedstyle.runtimes.flower import simulation

    joined = {}
    original = simulation.join_cluster

    def spy(address, threads, quiet, extra_env=None):
        joined["resources"] = original(address, threads, quiet, extra_env)
        return joined["resources"]

    monkeypatch.setattr(simulation, "join_cluster", spy)
    config = tiny_config.updated(partition="per_domain", clients=6, clients_per_round=4, lr_schedule="constant")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors train with one torch thread (1 CPU each): so does the reference
    try:
        sim = run_experiment(config, tmp_path / "sim", quiet=True)
    finally:
        torch.set_num_threads(before)
    flower = run_experiment(config.updated(backend="flower-sim", ray_address="auto"), tmp_path / "flower", quiet=True)

    assert joined["resources"].get(MARKER) == 1.0 and joined["resources"]["CPU"] == 2.0  # the head node's cluster
    import ray

    assert not ray.is_initialized()  # this process left the cluster; the cluster itself stays up
    assert json.loads((tmp_path / "flower" / "config.json").read_text())["ray_address"] == "auto"
    assert _evaluations(tmp_path / "flower") == _evaluations(tmp_path / "sim")
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    globals_a = {k: v for k, v in a.items() if k.startswith("global/")}
    assert globals_a and all(torch.equal(v, b[k]) for k, v in globals_a.items())  # bitwise
    assert flower["targets"] == sim["targets"]


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on workers
def test_an_unreachable_cluster_is_one_clear_error(tiny_config, tmp_path, monkeypatch):
    from fedstyle.errors import ConfigError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tiny_config.updated(backend="flower-sim", ray_address=f"127.0.0.1:{_free_port()}")
    with pytest.raises(ConfigError, match="cannot join a Ray cluster"):
        run_experiment(config, tmp_path / "x", quiet=True)
    assert not (tmp_path / "x").exists()
