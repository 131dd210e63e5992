"""The star-topology round driver (server + N clients) — the one every star runtime uses.

:class:`StarSimulator` samples clients, runs the setup exchange and each round's query and
training phases, aggregates and counts bytes; a :class:`~fedstyle.federation.transport.Transport`
reaches the clients. In process (the default) all clients share one ``nn.Module`` on the run's
device: a client's phase loads the downloaded weights into it in place, runs the hook, and
snapshots the result — no per-client deepcopy of the model. Client data are rows of one shared
uint8 sample pool (:class:`~fedstyle.data.client.SamplePool`), and the clients' persistent states
live in a :class:`~fedstyle.federation.states.ClientStates` store that keeps at most
``state_budget`` bytes of them in memory between phases (the rest on disk), so the memory a run
holds grows with the clients of a round, not with all clients. Every random draw is derived from (seed, round, client), so a resumed run repeats an
uninterrupted one exactly, and the Flower transport reproduces the in-process one bitwise.

Per round::

    chosen = sample_clients(r)                      seeded
    [query phase]  round_query on the download      each sampled client; weights counted down
    payloads = algo.round_payloads(server, alive, queries)
    train phase    local_train on the download      weights + payload down; weights + payload up
    weights = server_update(algo, server, updates)  aggregate (+ server_opt) of the updates in client-id order

The download is every state key except the clients' local layers (FedBN); a client's local layers
stay in its state and start, before its first round, from the run's initial weights.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.server_opt import server_update
from fedstyle.data.client import ClientData
from fedstyle.errors import ConfigError
from fedstyle.federation.batched import MODES as BATCHING_MODES
from fedstyle.federation.batched import BatchingDecision, decide_batching
from fedstyle.federation.client import snapshot
from fedstyle.federation.rounds import (
    FederationSettings,
    RoundResult,
    Traffic,
    check_finite_weights,
    mean_metrics,
    release_counts,
    setup_info,
)
from fedstyle.federation.states import ClientStates
from fedstyle.federation.transport import ClientRequest, InProcessTransport, Transport
from fedstyle.payload import Payload, payload_nbytes, weights_nbytes
from fedstyle.seeding import derive_seed, numpy_rng


class StarSimulator:
    """The round driver of every star runtime; ``transport`` says how clients are reached."""

    topology = "star"

    def __init__(
        self,
        algo: Algorithm,
        model: nn.Module,
        clients: list[ClientData],
        settings: FederationSettings,
        seed: int,
        device: torch.device,
        transport: Transport | None = None,
        state_budget: int | None = None,
        client_batching: str = "auto",
    ):
        """``state_budget``: bytes of client state kept in memory between phases (None: all of it),
        see :class:`~fedstyle.federation.states.ClientStates`. ``client_batching``: whether the
        in-process training phase trains the round's clients as one batched computation (auto, on,
        off; see :mod:`fedstyle.federation.batched`)."""
        if client_batching not in BATCHING_MODES:
            raise ConfigError(f"client_batching {client_batching!r} is not one of {', '.join(BATCHING_MODES)}")
        if not clients:
            raise ConfigError("the partition produced no clients")
        for cid, data in enumerate(clients):
            if len(data) == 0:
                raise ConfigError(f"client {cid} has no training samples; change --partition, --clients or --alpha")
        self.algo, self.model, self.clients = algo, model, clients
        self.settings, self.seed, self.device = settings, seed, device
        self.local_keys = algo.local_keys(model)
        self.download_keys = [k for k in model.state_dict() if k not in self.local_keys]
        #: the shared trainable parameters a server optimiser moves (fedstyle.algorithms.server_opt)
        self.server_opt_keys = [k for k, _ in model.named_parameters() if k not in self.local_keys]
        self.initial_weights = snapshot(model)
        self.server = ServerContext(weights=dict(self.initial_weights), state={}, round=0, num_clients=len(clients),
                                    seed=seed, rounds=settings.rounds)
        algo.init_server_state(self.server)
        self.client_states = ClientStates(len(clients), state_budget, device)
        self.traffic = Traffic()
        self.client_batching = client_batching
        self._batching: BatchingDecision | None = None
        self.use_transport(transport or InProcessTransport())

    def batching(self) -> BatchingDecision:
        """Whether the in-process training phase runs batched, and why not (decided on first use)."""
        if self._batching is None:
            self._batching = decide_batching(self, self.client_batching)
        return self._batching

    def use_transport(self, transport: Transport) -> None:
        """Reach the clients through ``transport`` from now on (the Flower ServerApp swaps its own in)."""
        self.transport = transport
        transport.attach(self)

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
        """Client ``cid``'s context; its seed depends only on (seed, purpose, round, client)."""
        return ClientContext(
            client_id=cid,
            data=self.clients[cid],
            state=self.client_states[cid],
            train=self.settings.train_settings(max(0, round_index)),
            round=round_index,
            num_clients=self.num_clients,
            device=self.device,
            seed=derive_seed(self.seed, purpose, round_index, cid),
            phase=purpose,
        )

    def download(self) -> dict[str, torch.Tensor]:
        """The global weights that travel to a client: every key but the clients' local layers."""
        return {k: self.server.weights[k] for k in self.download_keys}

    def _count_down(self, requests: dict[int, ClientRequest], sent: list[int]) -> None:
        for cid in sent:
            request = requests[cid]
            if request.weights is not None:
                self.traffic.model_down += weights_nbytes(request.weights)
            self.traffic.payload_down += payload_nbytes(request.payload)

    def _call(self, phase: str, requests: dict[int, ClientRequest], round_index: int):
        replies = self.transport.call(phase, requests, round_index)
        self.client_states.settle()  # the phase is over: fit the states in memory to the budget
        self._count_down(requests, replies.sent)
        return replies

    # -- phases -------------------------------------------------------------------------
    def setup(self) -> dict[str, float]:
        """The one-time setup exchange before round 0 (a no-op when the method has none)."""
        start = time.perf_counter()
        self.transport.start()
        if not self.algo.uses_phase("setup"):
            return {}
        everyone = {cid: ClientRequest() for cid in range(self.num_clients)}
        replies = self._call("setup_upload", everyone, -1)
        uploads: dict[int, Payload] = {cid: replies.results[cid] for cid in sorted(replies.results)}
        if not uploads:
            raise ConfigError("no client answered the setup exchange")
        up = sum(payload_nbytes(p) for p in uploads.values())
        self.traffic.payload_up += up
        self.server.round = 0
        broadcast = self.algo.setup_broadcast(uploads, self.server)
        before = self.traffic.payload_down
        replies = self._call("setup_download", {cid: ClientRequest(payload=broadcast) for cid in range(self.num_clients)}, -1)
        metrics = [replies.results[cid] for cid in sorted(replies.results)]
        return setup_info(metrics, time.perf_counter() - start, up, self.traffic.payload_down - before)

    def run_round(self, round_index: int) -> RoundResult:
        start = time.perf_counter()
        self.server.round = round_index
        self.server.metrics = {}  # what round_payloads and the server optimiser log this round
        chosen = self.sample_clients(round_index)
        self.transport.begin_round(round_index, chosen)
        weights = self.download()  # one dict per round: a transport serialises it once
        alive, queries = list(chosen), {}
        if self.algo.uses_phase("query"):
            replies = self._call("round_query", {cid: ClientRequest(weights) for cid in chosen}, round_index)
            queries = {cid: replies.results[cid] for cid in sorted(replies.results)}
            self.traffic.payload_up += sum(payload_nbytes(q) for q in queries.values())
            alive = sorted(queries)
        payloads = self.algo.round_payloads(self.server, alive, queries)
        requests = {cid: ClientRequest(weights, payloads.get(cid, {})) for cid in alive}
        replies = self._call("train", requests, round_index)
        updates = [replies.results[cid] for cid in sorted(replies.results)]  # client-id order, on every runtime
        for update in updates:
            self.traffic.model_up += weights_nbytes(update.weights)
            self.traffic.payload_up += payload_nbytes(update.payload)
        self.transport.end_round(round_index, chosen, [u.client_id for u in updates])
        self.server.weights = server_update(self.algo, self.server, updates, self.server_opt_keys)
        check_finite_weights(self.server.weights, round_index, self.settings.train_settings(round_index).lr,
                             "the aggregated model")
        loss = sum(u.train_loss * u.num_samples for u in updates) / sum(u.num_samples for u in updates)
        return RoundResult(round_index, loss, [u.client_id for u in updates], time.perf_counter() - start,
                           metrics={**mean_metrics(u.metrics for u in updates), **self.server.metrics},
                           events=self.transport.drain_events(),
                           releases=release_counts({u.client_id: u.metrics for u in updates}))

    def eval_weights(self) -> dict[str, torch.Tensor]:
        return self.server.weights

    def device_weights(self) -> list[dict[str, torch.Tensor]]:
        return []

    # -- checkpointing ------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"global/{k}": v for k, v in self.server.weights.items()}
        out.update({f"server/{k}": v for k, v in self.server.state.items()})
        if self.transport.holds_client_state:
            out.update(self.client_states.checkpoint_tensors())
        return out

    def checkpoint_saved(self) -> None:
        """The checkpoint of :meth:`state_tensors` is in place (the store drops files no checkpoint needs)."""
        self.client_states.checkpoint_saved()

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore a checkpoint; a server-state tensor goes back to the device its method keeps it on.

        The runner moves every checkpoint tensor to the run's device, but a method may keep server state
        elsewhere (FedIIR's moving average lives on the CPU, beside the CPU copies of the clients' gradients
        it is mixed with): restored on the GPU, a resumed run on CUDA failed on mixing devices. The fresh
        state of ``init_server_state`` (made in the constructor) says where each tensor lives."""
        fresh = self.server.state
        self.server.weights = {k[7:]: v for k, v in tensors.items() if k.startswith("global/")}
        self.server.state = {k[7:]: v.to(fresh[k[7:]].device) if k[7:] in fresh else v
                             for k, v in tensors.items() if k.startswith("server/")}
        self.client_states.restore(tensors)

    def meta(self) -> dict:
        return {"traffic": self.traffic.as_dict()}

    def load_meta(self, meta: dict) -> None:
        self.traffic = Traffic(**meta["traffic"])
