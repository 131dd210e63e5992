"""What a client and the server see during a federated run (part of the algorithm API).

These objects are runtime-neutral: the in-process simulators and the Flower bridge build them
the same way, so an algorithm written against them runs unchanged on both.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import torch
from torch import nn

from fedstyle.data.client import ClientData
from fedstyle.errors import ConfigError
from fedstyle.payload import Payload

if TYPE_CHECKING:
    from fedstyle.style.privacy import StylePrivacy


class ReleaseKeeper(Protocol):
    """What a deployed site gives its client's algorithm to make defended releases through (:meth:`ClientContext.release`)."""

    def release(self, name: str, privacy: StylePrivacy, make: Callable[[], Payload]) -> Payload: ...


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
    #: the linear head's learning rate as a multiple of ``lr`` (a fresh head on a pretrained backbone)
    head_lr_scale: float = 1.0

    def steps_for(self, data: ClientData) -> int:
        if self.local_steps > 0:
            return self.local_steps
        return max(1, self.local_epochs * data.num_batches(self.batch_size))

    def make_optimizer(self, params, head=()) -> torch.optim.Optimizer:
        """The client's optimiser over ``params``; those also in ``head`` (the classifier's linear head) learn
        at ``lr * head_lr_scale``, the rest at ``lr`` (one parameter group when the scale is 1)."""
        head_ids = {id(p) for p in head}
        if self.head_lr_scale != 1.0 and head_ids:
            params = list(params)
            params = [{"params": [p for p in params if id(p) not in head_ids]},
                      {"params": [p for p in params if id(p) in head_ids], "lr": self.lr * self.head_lr_scale}]
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


#: the phases a client hook runs in; the runtime sets the model's mode for each (see :class:`ClientContext`)
PHASE_MODES = {"setup": "eval", "query": "eval", "train": "train", "share": "eval"}


@dataclass
class ClientContext:
    """Everything a client's algorithm code may use in one round (or in the setup exchange).

    ``phase`` says which hook runs: ``setup`` (setup_upload / setup_download), ``query``
    (round_query), ``train`` (local_train and training_loss) or ``share`` (p2p_share). The runtime
    puts the model in the mode of :data:`PHASE_MODES` before the hook — eval everywhere except
    training — so what a client shares never depends on which runtime or process computed it.

    ``scratch`` is per call: a method's per-round working objects (anchors, caches), never
    checkpointed and empty at the next call. :meth:`global_model` is one frozen copy of this
    round's downloaded global weights, in eval mode, shared by every client of the round (the
    runtime keeps one copy per process, not one per client). :meth:`log` and :meth:`timed` record
    loss terms and timings; the runtime averages them over the round's clients into metrics.jsonl.
    """

    client_id: int
    data: ClientData
    state: dict[str, torch.Tensor]
    train: TrainSettings
    round: int
    num_clients: int
    device: torch.device
    seed: int
    phase: str = "train"
    generator: torch.Generator = field(init=False)
    global_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
    #: set by the runtime: returns the frozen global model (see :meth:`global_model`)
    global_model_source: Callable[[], nn.Module] | None = field(default=None, repr=False)
    #: set by a deployed site's runtime (``fedstyle.runtimes.site_privacy.SiteReleases``): keeps every defended
    #: release, answers the same question again with it, counts it in the site's ledger (see :meth:`release`)
    release_keeper: ReleaseKeeper | None = field(default=None, repr=False)
    _sums: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _counts: dict[str, int] = field(default_factory=dict, repr=False)
    _timings: dict[str, list] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.phase not in PHASE_MODES:
            raise ConfigError(f"unknown client phase {self.phase!r}; one of {', '.join(PHASE_MODES)}")
        self.generator = torch.Generator().manual_seed(self.seed)

    def batches(self, views: bool = False) -> Iterator[tuple]:
        """This round's training batches (``views=True``: with the data's aligned views, see ClientData)."""
        return self.data.batches(self.train.batch_size, self.generator, self.device, self.train.steps_for(self.data),
                                 views=views)

    def global_model(self) -> nn.Module:
        """This round's downloaded global model: frozen (no gradients), eval mode (BatchNorm uses its
        running statistics), on the training device. Do not train or modify it."""
        if self.global_model_source is None:
            raise ConfigError("this runtime provides no global model copy in this phase")
        return self.global_model_source()

    def release(self, name: str, privacy: StylePrivacy, make: Callable[[], Payload]) -> Payload:
        """A defended style release named ``name`` (what ``make()`` computes): ``make()`` itself in a simulation
        or without the defence; on a deployed site, the release kept for the same question (run, client,
        round, name, what the message sent) if there is one, else ``make()``'s, recorded in the site's
        ledger and budget (docs/privacy.md)."""
        if self.release_keeper is None or not privacy.enabled:
            return make()
        return self.release_keeper.release(name, privacy, make)

    # -- metrics of the round ---------------------------------------------------------
    def log(self, name: str, value: torch.Tensor | float) -> None:
        """Record one value of ``name`` (a loss term, say); the round's metric is the mean of the values.

        Tensors are accumulated on their device without a host synchronisation.
        """
        value = value.detach().float().reshape(()) if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        if name in self._sums:
            self._sums[name] = self._sums[name] + value.to(self._sums[name].device)
        else:
            self._sums[name] = value
        self._counts[name] = self._counts.get(name, 0) + 1

    @contextmanager
    def timed(self, name: str):
        """Time the block; ``{name}_seconds`` (summed over the call) joins the logged metrics.

        On CUDA the block is timed with events read once at the end (no synchronisation per block).
        """
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._timings.setdefault(name, []).append((start, end))
        else:
            tick = time.perf_counter()
            yield
            self._timings.setdefault(name, []).append(time.perf_counter() - tick)

    def logged_metrics(self) -> dict[str, float]:
        """The means of :meth:`log` and the totals of :meth:`timed` so far, as floats (one host sync)."""
        out = {name: float(total) / self._counts[name] for name, total in self._sums.items()}
        if self._timings and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for name, spans in self._timings.items():
            out[f"{name}_seconds"] = sum(s if isinstance(s, float) else s[0].elapsed_time(s[1]) / 1000.0 for s in spans)
        return out


@dataclass
class ServerContext:
    """The server's view: global weights, its persistent state and the run's facts."""

    weights: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]
    round: int
    num_clients: int
    seed: int
    #: the run's number of rounds (0: not known), for schedules over the run (FedDG-GA's step decay)
    rounds: int = 0
    #: numbers the server's step logs this round (a server optimiser's, see fedstyle.algorithms.server_opt); the
    #: star driver adds them to the round's metrics beside the clients' means
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What one client returns after local training."""

    client_id: int
    weights: dict[str, torch.Tensor]
    num_samples: int
    train_loss: float
    payload: dict = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
