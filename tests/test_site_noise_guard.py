"""Seeded style noise only inside fedstyle's own simulation engine (issue 50 §2).

A coordinator knows the run's config and seed: a site that obeyed ``dp_noise_source=seeded`` would release
noise the coordinator regenerates bit for bit. Flower's usual deployment node config
(``--node-config "partition-id=0 num-partitions=2"``) is the simulation engine's too, so only a positive
marker that fedstyle's flower-sim sets in its workers' environment (and that no message can carry) lets a
site take seeded noise."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower sites need fedstyle[flower] (flwr not installed)")

from fedstyle.runtimes.flower import site  # noqa: E402
from fedstyle.runtimes.flower.node_config import (  # noqa: E402
    SIMULATION_MARKER_ENV,
    SIMULATION_MARKER_VALUE,
    in_simulation_engine,
)
from site_messages import node, send  # noqa: E402

FLOWER_DEPLOYMENT_NODE = {"partition_id": 0, "num_partitions": 2}  # flower-supernode --node-config in Flower's guides


@pytest.fixture(autouse=True)
def fresh_site_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_SITE_STATE", str(tmp_path / "site-state"))
    monkeypatch.delenv(SIMULATION_MARKER_ENV, raising=False)
    site._SITES.clear()
    yield
    site._SITES.clear()


def seeded_config(tiny_config) -> str:
    """What a curious coordinator sends: StableFDG's defence with seeded noise (z = 1e-3 at C = 1e3: sigma = 2,
    far above float rounding, so seeded and OS draws cannot agree by chance)."""
    hp = {"attention": False, "dp_clip": 1e3, "dp_noise": 1e-3, "dp_noise_source": "seeded"}
    return tiny_config.updated(method="stablefdg", hparams=hp, rounds=1).to_json()


def site_source() -> str:
    (built,) = site._SITES.values()
    return built.experiment.algorithm.hp["dp_noise_source"]


def test_flower_deployment_node_config_draws_os_noise_whatever_the_coordinator_sends(tiny_config, monkeypatch):
    config_json = seeded_config(tiny_config)
    # what the coordinator regenerates: the same message answered inside fedstyle's simulation engine, with the
    # config's seeded noise (twice, bitwise: the seed fixes it)
    monkeypatch.setenv(SIMULATION_MARKER_ENV, SIMULATION_MARKER_VALUE)
    regenerated = send("round_query", config_json, node(**FLOWER_DEPLOYMENT_NODE))["style"]
    assert site_source() == "seeded"
    site._SITES.clear()
    assert torch.equal(send("round_query", config_json, node(**FLOWER_DEPLOYMENT_NODE))["style"], regenerated)
    monkeypatch.delenv(SIMULATION_MARKER_ENV)
    site._SITES.clear()

    # a SuperNode started as Flower's deployment guides say: the same node config, no marker
    released = send("round_query", config_json, node(**FLOWER_DEPLOYMENT_NODE))["style"]
    assert site_source() == "os"
    assert released.shape == regenerated.shape and not torch.equal(released, regenerated)
    # sigma = z * 2C = 2 on the sums: the release is off the coordinator's regeneration by noise, not rounding
    assert float((released - regenerated).abs().max()) > 1e-3


def test_only_the_marker_of_fedstyles_simulation_engine_makes_a_simulation(monkeypatch):
    assert not in_simulation_engine(node(**FLOWER_DEPLOYMENT_NODE))  # Flower's deployment node config
    assert not in_simulation_engine(node(partition_id=0))
    monkeypatch.setenv(SIMULATION_MARKER_ENV, "1")  # a guess at the marker is no marker
    assert not in_simulation_engine(node(**FLOWER_DEPLOYMENT_NODE))
    monkeypatch.setenv(SIMULATION_MARKER_ENV, SIMULATION_MARKER_VALUE)
    assert in_simulation_engine(node(**FLOWER_DEPLOYMENT_NODE))
    assert not in_simulation_engine(node(partition_id=0, num_partitions=2, state_dir="/s"))  # fedstyle deploy's site
    assert not in_simulation_engine(node(partition_id=0))  # a hand-started SuperNode


def test_flower_sim_sets_the_marker_for_its_workers_only(tiny_config, tmp_path, monkeypatch):
    """fedstyle's flower-sim launcher puts the marker in the environment its Ray workers inherit while Flower's
    engine runs, and takes it away afterwards; a deployment's sites never get it."""
    pytest.importorskip("ray")
    import flwr.simulation

    from fedstyle.experiments.runner import start_run_dir
    from fedstyle.runtimes.flower.deployment import DeploySettings, Federation
    from fedstyle.runtimes.flower.simulation import train_on_flower_sim

    seen = {}
    monkeypatch.setattr(flwr.simulation, "run_simulation", lambda **kw: seen.update(os.environ))
    exp = start_run_dir(tiny_config.updated(backend="flower-sim"), tmp_path / "run", quiet=True)
    with pytest.raises(RuntimeError, match="ended without finishing"):
        train_on_flower_sim(exp, tmp_path / "run", quiet=True, checkpoint=None)
    assert seen[SIMULATION_MARKER_ENV] == SIMULATION_MARKER_VALUE
    assert SIMULATION_MARKER_ENV not in os.environ

    monkeypatch.setenv(SIMULATION_MARKER_ENV, SIMULATION_MARKER_VALUE)  # even from a process that has it
    federation = Federation(tmp_path / "dep", DeploySettings(sites=1, insecure=True))
    assert SIMULATION_MARKER_ENV not in federation.env(site=True)


@pytest.mark.slow  # Ray starts in ~10 s
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on workers
def test_flower_sim_workers_see_the_marker_and_reproduce_the_seeded_simulator(tiny_config, tmp_path):
    """The marker reaches the Ray actors: a flower-sim run with the defence's seeded noise equals the in-process
    simulator bitwise (a site that took itself for a deployment would draw OS noise and keep a ledger)."""
    pytest.importorskip("ray")
    from fedstyle.experiments.runner import run_experiment
    from run_records import evaluations

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actors train
    try:
        hp = {"attention": False, "dp_clip": 1e3, "dp_noise": 1e-3}
        config = tiny_config.updated(method="stablefdg", hparams=hp, rounds=1, lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_experiment(config.updated(backend="flower-sim"), tmp_path / "flower", quiet=True)
    finally:
        torch.set_num_threads(before)
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")
    assert not (tmp_path / "flower" / "flower" / "state" / "privacy").exists()
