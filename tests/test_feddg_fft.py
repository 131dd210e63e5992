"""FedDG-FFT: the amplitude-exchange baseline through the fft backend."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.feddg_fft import FedDGFFT, plan_amplitude_exchange
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.data.client import ClientData
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.models import build_model
from fedstyle.seeding import seed_everything
from fedstyle.style.transfer import Style
from fedstyle.style.transfer.augment import StyleBank

SIZE, PER_CLIENT = 16, 16
TRANSFORM = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def make_clients(n=3):
    g = torch.Generator().manual_seed(0)
    return [ClientData(torch.randint(60 * c, 60 * c + 100, (PER_CLIENT, 3, SIZE, SIZE), generator=g).to(torch.uint8),
                       torch.arange(PER_CLIENT) % 4, torch.full((PER_CLIENT,), c), TRANSFORM) for c in range(n)]


def simulator(hp=None, n=3):
    seed_everything(0)
    model = build_model("convnet", 4, SIZE)
    algo = METHODS.get("feddg_fft")(hp or {}, num_classes=4, num_clients=n)
    algo.configure_model(model)
    settings = FederationSettings(rounds=1, lr=0.05, batch_size=8, local_steps=1)
    return StarSimulator(algo, model, make_clients(n), settings, seed=0, device=torch.device("cpu"))


def test_plan_keeps_each_image_then_adds_copies_from_other_clients():
    owner = torch.tensor([0, 0, 1, 1, 1, 2])
    bank = StyleBank(Style("fft", "x", {"amplitude": torch.zeros(6, 3, 2, 2)}), owner)
    plan = plan_amplitude_exchange(50, bank, own=1, copies=2, seed=3)
    rows, ratio = plan.style_row.view(50, 3), plan.ratio.view(50, 3)
    assert torch.equal(plan.source, torch.arange(50).repeat_interleave(3))
    assert bool((rows[:, 0] == -1).all()) and bool((rows[:, 1:] >= 0).all())  # original first
    assert set(owner[rows[:, 1:]].flatten().tolist()) == {0, 2}  # never the own client
    assert bool(((ratio[:, 1:] >= 0) & (ratio[:, 1:] <= 1)).all()) and float(ratio[:, 1:].std()) > 0.1  # U(0, 1)
    with pytest.raises(ConfigError, match="another client"):
        plan_amplitude_exchange(5, StyleBank(bank.style.select([0, 1]), torch.tensor([1, 1])), own=1, copies=1, seed=0)


def test_setup_doubles_the_data_keeps_originals_and_counts_the_bank_bytes():
    originals = make_clients()
    sim = simulator({"bank_size": 3, "band": 0.2, "stylize": "eager"})  # eager: the setup counts every copy
    info = sim.setup()
    for c, data in enumerate(sim.clients):
        assert len(data) == 2 * PER_CLIENT and data.images.dtype == torch.uint8
        assert torch.equal(data.images[0::2], originals[c].images)  # originals kept, in order
        assert not torch.equal(data.images[1::2], originals[c].images)  # copies changed
        assert torch.equal(data.labels, originals[c].labels.repeat_interleave(2))
    amplitudes = 3 * SIZE * SIZE * 4  # one float32 amplitude spectrum
    strings = len("fft") + len("fft2-amplitude")
    assert sim.traffic.payload_up == 3 * (strings + 3 * amplitudes)
    assert sim.traffic.payload_down == 3 * (strings + 9 * amplitudes + 9 * 8)
    assert info["style_images"] == 9 and info["stylized_images"] == 3 * PER_CLIENT
    assert sim.algo.display_name(sim.algo.hp) == "FedDG-FFT"


def test_default_bank_is_an_eighth_of_the_images_and_one_client_is_refused():
    sim = simulator()
    upload = sim.algo.setup_upload(sim.context(0, -1, "setup"), sim.model)
    assert len(Style.from_payload(upload)) == 2  # ceil(16 / 8)
    with pytest.raises(ConfigError, match="another client"):
        simulator(n=1).setup()


def test_the_missing_meta_learning_is_stated():
    assert "episodic" in FedDGFFT.summary and "NO" in FedDGFFT.summary
    assert "NOT implemented" in __import__("fedstyle.algorithms.feddg_fft", fromlist=["x"]).__doc__
