"""``--backend flower-sim`` (Flower's simulation engine, Ray) reproduces the in-process simulator."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="--backend flower-sim needs fedstyle[flower-sim] (flwr not installed)")
pytest.importorskip("ray", reason="--backend flower-sim needs fedstyle[flower-sim] (ray not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.experiments.runner import run_experiment  # noqa: E402
from run_records import evaluations  # noqa: E402

pytestmark = pytest.mark.slow  # Ray starts in ~10 s


@pytest.fixture
def one_thread():
    """Ray actors train with one torch thread; the in-process reference must too for bitwise equality."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on workers
def test_flower_sim_equals_simulator(tiny_config, tmp_path, one_thread, isolated_site_state):
    config = tiny_config.updated(partition="per_domain", clients=6, clients_per_round=4, lr_schedule="constant")
    sim = run_experiment(config, tmp_path / "sim", quiet=True)
    flower = run_experiment(config.updated(backend="flower-sim"), tmp_path / "flower", quiet=True)

    assert (tmp_path / "flower" / "done").exists()
    assert json.loads((tmp_path / "flower" / "config.json").read_text())["backend"] == "flower-sim"
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")  # accuracies, losses and bytes
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    globals_a = {k: v for k, v in a.items() if k.startswith("global/")}
    assert globals_a and all(torch.equal(v, b[k]) for k, v in globals_a.items())  # bitwise
    assert flower["targets"] == sim["targets"]
    # the actors kept the clients' state in the run directory (so --resume continues it), not elsewhere
    from fedstyle.runtimes.site_state import run_key

    key = run_key(json.dumps(json.loads((tmp_path / "flower" / "config.json").read_text()), sort_keys=True))
    assert list((tmp_path / "flower" / "flower" / "state" / key).glob("client-*/r000000-train.*.safetensors"))
    assert not (isolated_site_state / key).exists()


def test_flower_sim_refuses_peer_to_peer(tiny_config, tmp_path):
    from fedstyle.errors import ConfigError

    with pytest.raises(ConfigError, match="flower-sim runs star-topology"):
        run_experiment(tiny_config.updated(method="dsgd", topology="ring", backend="flower-sim"), tmp_path / "x")


@pytest.mark.xdist_group("ray")
def test_an_interrupted_flower_sim_run_resumes_to_the_uninterrupted_run(tiny_config, tmp_path, one_thread,
                                                                       monkeypatch, isolated_site_state):
    """FedDyn keeps a gradient term per client, which the actors keep in OUT/flower/state; its reference mode
    also a scale of alpha per client, from a setup exchange of the clients' sizes (unequal here). The ServerApp
    dies in round 3, after the checkpoint of round 2 and after round 3's clients wrote their states. A resume on a
    new Ray instance (new actors, nothing in memory, the setup exchange run again) continues from the states on
    disk and ends as the uninterrupted in-process run does, bitwise. (Which snapshot a redone round takes is
    checked message by message in test_flower_policy.py; here the redo repeats the dead round exactly.)"""
    from fedstyle.experiments.runner import resume_experiment
    from fedstyle.federation.star import StarSimulator

    config = tiny_config.updated(method="feddyn", hparams={"reference_code": True}, partition="dirichlet", clients=6,
                                 clients_per_round=2, rounds=4, eval_every=2, lr_schedule="constant")
    full = run_experiment(config, tmp_path / "sim", quiet=True)
    scales = [float(v) for k, v in load_file(str(tmp_path / "sim" / "checkpoint.safetensors")).items()
              if k.endswith("feddyn/alpha_scale")]
    assert len(scales) == 6 and len(set(scales)) > 1  # the clients' alphas differ

    original = StarSimulator.run_round

    def dies_after_training_round_3(self, round_index):
        result = original(self, round_index)  # the sampled clients trained and wrote round 3's states
        if round_index == 2:
            raise RuntimeError("the ServerApp dies")
        return result

    monkeypatch.setattr(StarSimulator, "run_round", dies_after_training_round_3)
    out = tmp_path / "flower"
    with pytest.raises(RuntimeError):
        run_experiment(config.updated(backend="flower-sim"), out, quiet=True)
    monkeypatch.setattr(StarSimulator, "run_round", original)
    from fedstyle.experiments.checkpoint import load_checkpoint

    assert load_checkpoint(out)[1]["round"] == 2 and not (out / "done").exists()
    states = out / "flower" / "state"
    assert list(states.glob("*/client-*/r000002-*.safetensors")), "round 3's states were not written before the kill"

    resumed = resume_experiment(out, quiet=True)
    assert (out / "done").exists() and resumed["targets"] == full["targets"]
    assert evaluations(out) == evaluations(tmp_path / "sim")
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(out / "checkpoint.safetensors"))
    globals_a = {k: v for k, v in a.items() if k.startswith("global/")}
    assert globals_a and all(torch.equal(v, b[k]) for k, v in globals_a.items())  # bitwise
