"""The in-process star-topology simulator (server + N clients, one model object).

All clients share one ``nn.Module`` on the run's device: a client's round loads the downloaded
weights into it in place, trains, and snapshots the result — no per-client deepcopy of the model.
Client data stay in memory as uint8 tensors. Every random draw is derived from (seed, round,
client), so a resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

import torch
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.errors import ConfigError
from fedstyle.federation.client import (
    client_round,
    client_round_query,
    client_setup_download,
    client_setup_upload,
    snapshot,
)
from fedstyle.federation.context import (
    ClientContext,
    ClientData,
    ServerContext,
    TrainSettings,
    lr_at,
)
from fedstyle.federation.payload import Payload, payload_nbytes, weights_nbytes
from fedstyle.seeding import derive_seed, numpy_rng


@dataclass
class Traffic:
    """Bytes sent by clients (up) and received by clients (down), models and payloads apart."""

    model_up: int = 0
    model_down: int = 0
    payload_up: int = 0
    payload_down: int = 0

    @property
    def up(self) -> int:
        return self.model_up + self.payload_up

    @property
    def down(self) -> int:
        return self.model_down + self.payload_down

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class FederationSettings:
    """Round-level settings shared by the star and peer-to-peer simulators."""

    rounds: int
    lr: float
    lr_schedule: str = "constant"
    batch_size: int = 32
    local_epochs: int = 1
    local_steps: int = 0
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    fraction: float = 1.0
    clients_per_round: int = 0  # > 0 overrides fraction

    def train_settings(self, round_index: int) -> TrainSettings:
        return TrainSettings(
            lr=lr_at(self.lr, self.lr_schedule, round_index, self.rounds),
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            optimizer=self.optimizer,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )


@dataclass
class RoundResult:
    round: int
    train_loss: float
    clients: list[int]
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    #: what the runtime saw happen (Flower: sites dropping out, rejoining), written to metrics.jsonl
    events: list[dict] = field(default_factory=list)


#: setup throughputs: name -> (image count, seconds), both summed over clients (style banks, stylization)
SETUP_RATES = {"style_images_per_s": ("style_images", "style_seconds"),
               "stylized_images_per_s": ("stylized_images", "stylize_seconds")}


def setup_info(client_metrics: Iterable[Mapping[str, float]], seconds: float, up: int, down: int) -> dict[str, float]:
    """The setup exchange's record: the clients' metrics summed, its time and bytes, the throughputs of
    :data:`SETUP_RATES` whose count and (non-zero) time are known. Shared by every star runtime."""
    info: dict[str, float] = {}
    for metrics in client_metrics:
        for key, value in metrics.items():
            info[key] = info.get(key, 0.0) + float(value)
    info.update(setup_seconds=seconds, setup_bytes_up=up, setup_bytes_down=down)
    for name, (count, time_key) in SETUP_RATES.items():
        if info.get(time_key, 0.0) > 0 and count in info:
            info[name] = info[count] / info[time_key]
    return info


class StarSimulator:
    topology = "star"

    def __init__(
        self,
        algo: Algorithm,
        model: nn.Module,
        clients: list[ClientData],
        settings: FederationSettings,
        seed: int,
        device: torch.device,
    ):
        if not clients:
            raise ConfigError("the partition produced no clients")
        for cid, data in enumerate(clients):
            if len(data) == 0:
                raise ConfigError(f"client {cid} has no training samples; change --partition, --clients or --alpha")
        self.algo, self.model, self.clients = algo, model, clients
        self.settings, self.seed, self.device = settings, seed, device
        self.local_keys = algo.local_keys(model)
        self.download_keys = [k for k in model.state_dict() if k not in self.local_keys]
        self.server = ServerContext(weights=snapshot(model), state={}, round=0, num_clients=len(clients), seed=seed)
        algo.init_server_state(self.server)
        self.client_states: dict[int, dict[str, torch.Tensor]] = {i: {} for i in range(len(clients))}
        self.traffic = Traffic()

    # -- helpers ------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def clients_per_round(self) -> int:
        s = self.settings
        m = s.clients_per_round if s.clients_per_round > 0 else max(1, round(s.fraction * self.num_clients))
        if m > self.num_clients:
            raise ConfigError(f"{m} clients per round requested but only {self.num_clients} clients exist")
        return m

    def sample_clients(self, round_index: int) -> list[int]:
        m = self.clients_per_round()
        if m == self.num_clients:
            return list(range(m))
        rng = numpy_rng(self.seed, "sample", round_index)
        return sorted(int(i) for i in rng.choice(self.num_clients, size=m, replace=False))

    def context(self, cid: int, round_index: int, purpose: str = "train") -> ClientContext:
        return ClientContext(
            client_id=cid,
            data=self.clients[cid],
            state=self.client_states[cid],
            train=self.settings.train_settings(max(0, round_index)),
            round=round_index,
            num_clients=self.num_clients,
            device=self.device,
            seed=derive_seed(self.seed, purpose, round_index, cid),
        )

    def _download_bytes(self) -> int:
        return weights_nbytes(self.server.weights, self.download_keys)

    # -- phases -------------------------------------------------------------------------
    def setup(self) -> dict[str, float]:
        """The one-time setup exchange before round 0 (a no-op when the method has none)."""
        start = time.perf_counter()
        uploads: dict[int, Payload] = {}
        for cid in range(self.num_clients):
            up = client_setup_upload(self.algo, self.model, self.context(cid, -1, "setup"), self.server.weights)
            if up is None:
                break
            uploads[cid] = up
        info: dict[str, float] = {}
        if uploads:
            self.server.round = 0
            broadcast = self.algo.setup_broadcast(uploads, self.server)
            up = sum(payload_nbytes(p) for p in uploads.values())
            down = payload_nbytes(broadcast) * self.num_clients
            self.traffic.payload_up += up
            self.traffic.payload_down += down
            metrics = [
                client_setup_download(self.algo, self.model, self.context(cid, -1, "setup"), self.server.weights, broadcast)
                for cid in range(self.num_clients)
            ]
            info = setup_info(metrics, time.perf_counter() - start, up, down)
        return info

    def run_round(self, round_index: int) -> RoundResult:
        start = time.perf_counter()
        self.server.round = round_index
        chosen = self.sample_clients(round_index)
        self.traffic.model_down += self._download_bytes() * len(chosen)
        queries: dict[int, Payload] = {}
        for cid in chosen:
            answer = client_round_query(self.algo, self.model, self.context(cid, round_index, "query"), self.server.weights)
            if answer is None:
                break
            queries[cid] = answer
            self.traffic.payload_up += payload_nbytes(answer)
        payloads = self.algo.round_payloads(self.server, chosen, queries)
        updates = []
        for cid in chosen:
            payload = payloads.get(cid, {})
            self.traffic.payload_down += payload_nbytes(payload)
            update = client_round(
                self.algo, self.model, self.context(cid, round_index), self.server.weights, payload, self.local_keys
            )
            self.traffic.model_up += weights_nbytes(update.weights)
            self.traffic.payload_up += payload_nbytes(update.payload)
            updates.append(update)
        self.server.weights = self.algo.aggregate(self.server, updates)
        loss = sum(u.train_loss * u.num_samples for u in updates) / sum(u.num_samples for u in updates)
        return RoundResult(round_index, loss, chosen, time.perf_counter() - start)

    def eval_weights(self) -> dict[str, torch.Tensor]:
        return self.server.weights

    def device_weights(self) -> list[dict[str, torch.Tensor]]:
        return []

    # -- checkpointing ------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"global/{k}": v for k, v in self.server.weights.items()}
        out.update({f"server/{k}": v for k, v in self.server.state.items()})
        for cid, state in self.client_states.items():
            out.update({f"client/{cid}/{k}": v for k, v in state.items()})
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.server.weights = {k[7:]: v for k, v in tensors.items() if k.startswith("global/")}
        self.server.state = {k[7:]: v for k, v in tensors.items() if k.startswith("server/")}
        self.client_states = {i: {} for i in range(self.num_clients)}
        for key, value in tensors.items():
            if key.startswith("client/"):
                _, cid, name = key.split("/", 2)
                self.client_states[int(cid)][name] = value

    def meta(self) -> dict:
        return {"traffic": self.traffic.as_dict()}

    def load_meta(self, meta: dict) -> None:
        self.traffic = Traffic(**meta["traffic"])
