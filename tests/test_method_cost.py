"""benchmarks/method_cost.py: the time split per round, clients' means scaled to the round, the server's not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "method_cost.py"


@pytest.fixture(scope="module")
def method_cost():
    spec = importlib.util.spec_from_file_location("method_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_server_seconds_are_per_round_and_client_means_are_scaled_by_the_clients(method_cost):
    """A round of 10 clients: a client part logged as a mean of 0.3 s is 3 s of the round; the server's
    optimiser, timed once (0.09 s), stays 0.09 s (it was reported x10, 0.9 s, for FedOMG); a non-time metric
    is no part."""
    result = SimpleNamespace(clients=list(range(10)), metrics={"fediir_query_seconds": 0.3, "server_opt_seconds": 0.09,
                                                                "omg_step_ratio": 1.2})
    sim = SimpleNamespace(server=SimpleNamespace(metrics={"server_opt_seconds": 0.09, "omg_step_ratio": 1.2}))
    parts = method_cost.round_parts(result, sim)
    assert parts == pytest.approx({"fediir_query": 3.0, "server_opt": 0.09})


def test_a_simulator_without_a_server_scales_every_part(method_cost):
    """Peer-to-peer simulators have no server: every part is a mean over the devices that trained."""
    result = SimpleNamespace(clients=[0, 1, 2, 3], metrics={"style_share_seconds": 0.5})
    assert method_cost.round_parts(result, SimpleNamespace()) == {"style_share": 2.0}
