"""FedGCA (style-complement views, the frozen global model, FedDyn's client and server state) under
``--backend flower-sim`` reproduces the in-process simulator bitwise."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="--backend flower-sim needs fedstyle[flower-sim] (flwr not installed)")
pytest.importorskip("ray", reason="--backend flower-sim needs fedstyle[flower-sim] (ray not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.experiments.runner import run_experiment  # noqa: E402

from test_flower_sim import evaluations  # noqa: E402
from ray_cluster import shared_ray_address  # noqa: E402  (one Ray head per test process)

pytestmark = pytest.mark.slow  # Ray starts in ~10 s


@pytest.fixture
def one_thread():
    """Ray actors train with one torch thread; the in-process reference must too for bitwise equality."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on workers
def test_fedgca_under_flower_sim_equals_the_simulator(tiny_config, tmp_path, one_thread):
    config = tiny_config.updated(method="fedgca", partition="per_domain", clients=6, clients_per_round=4,
                                 lr_schedule="constant", resolution=32, hparams={"augment_views": 2})
    sim = run_experiment(config, tmp_path / "sim", quiet=True)
    flower = run_experiment(config.updated(backend="flower-sim", ray_address=shared_ray_address()), tmp_path / "flower", quiet=True)

    records = evaluations(tmp_path / "sim")
    assert all(r["train_metrics"]["loss_cam"] > 0 and "loss_oc" in r["train_metrics"] for r in records)
    strip = [{k: v for k, v in r.items() if k != "train_metrics"} for r in records]
    assert [{k: v for k, v in r.items() if k != "train_metrics"} for r in evaluations(tmp_path / "flower")] == strip
    losses = [{k: v for k, v in r["train_metrics"].items() if not k.endswith("_seconds")} for r in records]
    assert [{k: v for k, v in r["train_metrics"].items() if not k.endswith("_seconds")}
            for r in evaluations(tmp_path / "flower")] == losses
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    kept = {k: v for k, v in a.items() if k.startswith(("global/", "server/"))}
    assert any(k.startswith("server/feddyn/h/") for k in kept)  # FedDyn's server state (L_OC) matches too
    assert all(torch.equal(v, b[k]) for k, v in kept.items())  # bitwise
    assert flower["targets"] == sim["targets"]
