"""What a client and the server see during a federated run.

These objects are runtime-neutral: the in-process simulators and the Flower bridge build them
the same way, so an algorithm written against them runs unchanged on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from fedstyle.errors import ConfigError


class ClientData:
    """A client's training samples as uint8 tensors plus a batched transform.

    Images are gathered once from the dataset cache when the client is created; batches are
    index gathers, a device transfer and one batched transform (no DataLoader, no decoding).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, domains: torch.Tensor, transform: Callable):
        if len(images) != len(labels) or len(labels) != len(domains):
            raise ConfigError("client images, labels and domains must have the same length")
        self.images = images
        self.labels = labels
        self.domains = domains
        self.transform = transform

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str) -> "ClientData":
        return ClientData(self.images.to(device), self.labels.to(device), self.domains.to(device), self.transform)

    def num_batches(self, batch_size: int) -> int:
        n = len(self)
        full, rest = divmod(n, batch_size)
        # a trailing batch of one sample is dropped: BatchNorm cannot train on it
        return full + (1 if rest >= 2 or (rest == 1 and full == 0) else 0)

    def batches(
        self,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
        steps: int,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``steps`` augmented batches (x float on ``device``, y, domain), reshuffling per epoch."""
        n = len(self)
        if n == 0:
            raise ConfigError("a client has no training samples; choose a partition that leaves no client empty")
        per_epoch = self.num_batches(batch_size)
        done = 0
        while done < steps:
            order = torch.randperm(n, generator=generator)
            for b in range(per_epoch):
                if done == steps:
                    return
                idx = order[b * batch_size : (b + 1) * batch_size].to(self.images.device)
                x = self.images.index_select(0, idx).to(device, non_blocking=True)
                y = self.labels.index_select(0, idx).to(device, non_blocking=True)
                d = self.domains.index_select(0, idx).to(device, non_blocking=True)
                yield self.transform(x, train=True, generator=generator), y, d
                done += 1


@dataclass
class TrainSettings:
    """Local optimisation settings of one client in one round (lr already scheduled)."""

    lr: float
    batch_size: int = 32
    local_epochs: int = 1
    local_steps: int = 0  # > 0 overrides local_epochs
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4

    def steps_for(self, data: ClientData) -> int:
        if self.local_steps > 0:
            return self.local_steps
        return max(1, self.local_epochs * data.num_batches(self.batch_size))

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        raise ConfigError(f"unknown optimizer {self.optimizer!r}; choose sgd or adam")


def lr_at(base_lr: float, schedule: str, round_index: int, rounds: int) -> float:
    """Learning rate of a round: ``constant``, ``cosine`` (to 0 over the run) or ``step`` (x0.1 at 50% and 75%)."""
    if schedule == "constant":
        return base_lr
    if schedule == "cosine":
        return base_lr * 0.5 * (1.0 + math.cos(math.pi * round_index / max(1, rounds)))
    if schedule == "step":
        return base_lr * (0.1 ** (int(round_index >= 0.5 * rounds) + int(round_index >= 0.75 * rounds)))
    raise ConfigError(f"unknown lr schedule {schedule!r}; choose constant, cosine or step")


@dataclass
class ClientContext:
    """Everything a client's algorithm code may use in one round (or in the setup exchange)."""

    client_id: int
    data: ClientData
    state: dict[str, torch.Tensor]
    train: TrainSettings
    round: int
    num_clients: int
    device: torch.device
    seed: int
    generator: torch.Generator = field(init=False)
    global_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    #: peer-to-peer only: this iteration's payloads from the one-hop neighbours, by device id
    neighbours: dict[int, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return self.data.batches(self.train.batch_size, self.generator, self.device, self.train.steps_for(self.data))


@dataclass
class ServerContext:
    """The server's view: global weights, its persistent state and the run's facts."""

    weights: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]
    round: int
    num_clients: int
    seed: int


@dataclass
class ClientUpdate:
    """What one client returns after local training."""

    client_id: int
    weights: dict[str, torch.Tensor]
    num_samples: int
    train_loss: float
    payload: dict = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
