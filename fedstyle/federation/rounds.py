"""Types both simulators (and every runtime) share: round settings, traffic counters, round results,
the setup record and the checkpoint layout of per-client state."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

import torch

from fedstyle.algorithms.context import TrainSettings, lr_at
from fedstyle.errors import FedstyleError, brief

_CLIENT = "client/"


@dataclass
class Traffic:
    """Bytes sent by clients (up) and received by clients (down), models and payloads apart.

    Counted as what travels: every message's weights and payload tensors at their element size
    (uncompressed); Flower's control traffic and metric records are not counted.

    Peer-to-peer runs also count their ``iterations``, the ``edge_messages`` (one per device and
    neighbour per iteration: a directed edge's weights plus share) and the ``payload_values`` sent
    (numbers, see :func:`~fedstyle.payload.payload_values`), from which :meth:`per_edge_iteration`
    gives what one edge carries per iteration; star runs leave them at 0.
    """

    model_up: int = 0
    model_down: int = 0
    payload_up: int = 0
    payload_down: int = 0
    iterations: int = 0
    edge_messages: int = 0
    payload_values: int = 0

    @property
    def up(self) -> int:
        return self.model_up + self.payload_up

    @property
    def down(self) -> int:
        return self.model_down + self.payload_down

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def per_edge_iteration(self) -> dict[str, float]:
        """Peer-to-peer: the mean weights and payload one directed edge carries per iteration (bytes,
        and the payload's numbers), the payload as a fraction of the weights, and the iteration count;
        {} for star runs. Each edge carries the same message size when devices share alike."""
        if not self.edge_messages:
            return {}
        model = self.model_up / self.edge_messages
        payload = self.payload_up / self.edge_messages
        return {"iterations": self.iterations, "model_bytes": model, "payload_bytes": payload,
                "payload_values": self.payload_values / self.edge_messages,
                "payload_fraction_of_model": payload / model if model else 0.0}


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
    head_lr_scale: float = 1.0  # the linear head's lr as a multiple of the scheduled lr

    def train_settings(self, round_index: int) -> TrainSettings:
        return TrainSettings(
            lr=lr_at(self.lr, self.lr_schedule, round_index, self.rounds),
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            optimizer=self.optimizer,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            head_lr_scale=self.head_lr_scale,
        )


@dataclass
class RoundResult:
    round: int
    train_loss: float
    clients: list[int]
    seconds: float
    #: the clients' own metrics (loss terms, timings), averaged over the clients that reported each
    metrics: dict[str, float] = field(default_factory=dict)
    #: what the runtime saw happen (Flower: sites dropping out, rejoining), written to metrics.jsonl
    events: list[dict] = field(default_factory=list)
    #: client id -> its defended style releases so far, as it reported them this round (``dp_releases``;
    #: :func:`release_counts`): the mean in ``metrics`` hides the busiest sender, whose eps is the run's
    releases: dict[int, int] = field(default_factory=dict)


#: the client metric that counts a client's defended style releases so far (fedstyle.style.privacy.release_metrics)
RELEASES_METRIC = "dp_releases"


def release_counts(per_client: Mapping[int, Mapping[str, float]]) -> dict[int, int]:
    """Client id -> its ``dp_releases`` (the clients that reported one): the per-client counts that
    :func:`mean_metrics` would average away."""
    return {int(cid): int(round(float(m[RELEASES_METRIC]))) for cid, m in per_client.items() if RELEASES_METRIC in m}


#: metrics.jsonl: every evaluation row's per-client release counts so far ({"client id": count}), written by
#: the runner from :attr:`RoundResult.releases`; the audit and summary.json count eps from them
RELEASES_ROW_KEY = "dp_releases_per_client"


def releases_in_rows(records: Iterable[Mapping]) -> dict[int, int]:
    """The per-client release counts of the last metrics.jsonl row that carries them ({} when none does)."""
    for record in reversed(list(records)):
        if RELEASES_ROW_KEY in record:
            return {int(cid): int(n) for cid, n in record[RELEASES_ROW_KEY].items()}
    return {}


def merge_release_counts(known: Mapping[int, int], reported: Mapping[int, int]) -> dict[int, int]:
    """Per-client release counts over a run: each client's largest count so far (a count only grows; a client
    not sampled this round keeps its last one)."""
    merged = dict(known)
    for cid, count in reported.items():
        merged[cid] = max(merged.get(cid, 0), count)
    return dict(sorted(merged.items()))


def mean_metrics(per_client: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Each metric's mean over the clients that reported it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for metrics in per_client:
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sorted(sums)}


#: setup throughputs: name -> (image count, seconds), both summed over clients (style banks, stylization)
SETUP_RATES = {"style_images_per_s": ("style_images", "style_seconds"),
               "stylized_images_per_s": ("stylized_images", "stylize_seconds")}


def setup_info(client_metrics: Iterable[Mapping[str, float]], seconds: float, up: int, down: int) -> dict[str, float]:
    """The setup exchange's record: the clients' metrics summed, its time and bytes, the throughputs of
    :data:`SETUP_RATES` whose count and (non-zero) time are known."""
    info: dict[str, float] = {}
    for metrics in client_metrics:
        for key, value in metrics.items():
            info[key] = info.get(key, 0.0) + float(value)
    info.update(setup_seconds=seconds, setup_bytes_up=up, setup_bytes_down=down)
    for name, (count, time_key) in SETUP_RATES.items():
        if info.get(time_key, 0.0) > 0 and count in info:
            info[name] = info[count] / info[time_key]
    return info


def client_state_tensors(client_states: Mapping[int, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every client's persistent state as flat checkpoint entries ``client/<id>/<name>``."""
    out = {}
    for cid, state in client_states.items():
        out.update({f"{_CLIENT}{cid}/{k}": v for k, v in state.items()})
    return out


def load_client_states(tensors: Mapping[str, torch.Tensor], num_clients: int) -> dict[int, dict[str, torch.Tensor]]:
    """The inverse of :func:`client_state_tensors` (clients without entries get an empty state)."""
    states: dict[int, dict[str, torch.Tensor]] = {i: {} for i in range(num_clients)}
    for key, value in tensors.items():
        if key.startswith(_CLIENT):
            _, cid, name = key.split("/", 2)
            states[int(cid)][name] = value
    return states


class TrainingDivergedError(FedstyleError):
    """The model's weights or statistics became NaN or infinite."""


def check_finite_weights(weights: Mapping[str, torch.Tensor], round_index: int, lr: float, where: str) -> None:
    """Stop the run when any floating-point weight or buffer is NaN or infinite (one host sync).

    ``round_index`` is 0-based; the message names it as metrics.jsonl numbers rounds (1-based).
    """
    floats = [(k, v) for k, v in weights.items() if v.is_floating_point()]
    if not floats:
        return
    finite = torch.stack([torch.isfinite(v).all() for _, v in floats])
    if bool(finite.all()):
        return
    bad = [k for (k, _), ok in zip(floats, finite.tolist()) if not ok]
    raise TrainingDivergedError(
        f"training diverged in round {round_index + 1}: {where} holds NaN or infinite values in {brief(bad, 3)} "
        f"(learning rate {lr:g}); the run stopped and keeps its last good checkpoint — start a new run with a "
        "lower --lr")
