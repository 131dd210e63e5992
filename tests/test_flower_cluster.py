"""``--backend flower-sim --ray-address auto`` joins a running Ray cluster and reproduces ``--backend sim``."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="--backend flower-sim needs fedstyle[flower-sim] (flwr not installed)")
pytest.importorskip("ray", reason="--backend flower-sim needs fedstyle[flower-sim] (ray not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.experiments.runner import run_experiment  # noqa: E402
from ray_cluster import free_port, start_head, stop_head  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray head node starts in ~10 s

#: a resource only the test's head node has: proof that the run joined that cluster
MARKER = "fedstyle_test_head"


@pytest.fixture
def ray_head(monkeypatch):
    """A Ray head node with 2 CPUs, as `ray start --head` on a cluster's first node, of this test's own (its
    marker resource proves a run joined it); stopped afterwards (tests/ray_cluster.py). Its own ``--temp-dir``
    keeps it from becoming this machine's "current" cluster for anyone else; ``RAY_ADDRESS`` points
    ``--ray-address auto`` at it, as Ray resolves ``auto`` from that variable first.
    """
    head, address, temp = start_head(resources={MARKER: 1})
    try:
        monkeypatch.setenv("RAY_ADDRESS", address)
        yield address
    finally:
        stop_head(head, temp)


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
    config = tiny_config.updated(backend="flower-sim", ray_address=f"127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match="cannot join a Ray cluster"):
        run_experiment(config, tmp_path / "x", quiet=True)
    assert not (tmp_path / "x").exists()
