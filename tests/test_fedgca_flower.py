"""FedGCA (style-complement views, the frozen global model, FedDyn's client and server state) through Flower's
ServerApp and ClientApp (tests/flower_grid.py: every message over Flower's wire format) reproduces the in-process
simulator bitwise."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="Flower's apps need fedstyle[flower] (flwr not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.experiments.runner import run_experiment  # noqa: E402

from flower_grid import run_under_flower  # noqa: E402
from run_records import evaluations  # noqa: E402


@pytest.fixture
def one_thread():
    """A site trains with one torch thread; the in-process reference must too for bitwise equality."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_fedgca_under_flower_equals_the_simulator(tiny_config, tmp_path, one_thread):
    config = tiny_config.updated(method="fedgca", partition="per_domain", clients=6, clients_per_round=4,
                                 lr_schedule="constant", resolution=32, hparams={"augment_views": 2})
    sim = run_experiment(config, tmp_path / "sim", quiet=True)
    flower = run_under_flower(config, tmp_path / "flower")

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
