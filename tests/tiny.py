"""Tiny in-memory clients and models shared by the API, federation and method tests (not collected)."""

from __future__ import annotations

import torch

from fedstyle.algorithms import METHODS
from fedstyle.data.client import ClientData
from fedstyle.data.transforms import BatchTransform
from fedstyle.federation.rounds import FederationSettings
from fedstyle.models import build_model
from fedstyle.seeding import seed_everything

TRANSFORM = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")
SETTINGS = FederationSettings(rounds=2, lr=0.05, batch_size=8, local_epochs=1)


def make_clients(n=3, per_client=24, size=16, seed=0, transform=TRANSFORM, classes=4):
    """``n`` clients of ``per_client`` images whose brightness depends on the class (learnable)."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for cid in range(n):
        labels = torch.arange(per_client) % classes
        base = (labels * (240 // classes) + 20).view(-1, 1, 1, 1).float()
        images = (base + torch.randint(0, 30, (per_client, 3, size, size), generator=g)).clamp(0, 255).to(torch.uint8)
        clients.append(ClientData(images, labels, torch.full((per_client,), cid), transform))
    return clients


def make_model(method="fedavg", hp=None, n_clients=3, backbone="convnet", classes=4, size=16, algo_cls=None):
    """A seeded model and the method's algorithm, configured as build_experiment does."""
    seed_everything(0)
    model = build_model(backbone, classes, size)
    cls = algo_cls or METHODS.get(method)
    algo = cls(hp or {}, num_classes=classes, num_clients=n_clients)
    algo.configure_model(model)
    return algo, model


def interrupt_and_resume(config, out, monkeypatch, at_round: int):
    """Run ``config`` into ``out``, interrupted as Ctrl-C would when round ``at_round`` starts, then
    resume it; returns the resumed run's summary."""
    import pytest

    from fedstyle.experiments.runner import resume_experiment, run_experiment
    from fedstyle.federation.star import StarSimulator

    original = StarSimulator.run_round

    def interrupted(self, round_index):
        if round_index == at_round:
            raise KeyboardInterrupt
        return original(self, round_index)

    monkeypatch.setattr(StarSimulator, "run_round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, out, quiet=True)
    monkeypatch.setattr(StarSimulator, "run_round", original)
    return resume_experiment(out, quiet=True)
