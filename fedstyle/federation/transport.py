"""How the round driver reaches its clients: "run this client phase for these clients with these
requests, return their results or their dropouts".

:class:`~fedstyle.federation.star.StarSimulator` is the only round driver (sampling, the setup
exchange, query and training phases, aggregation, byte counting); a transport only moves requests
and results. :class:`InProcessTransport` calls the client procedures on the simulator's shared
model; the Flower transport (``fedstyle.runtimes.flower``) sends messages and turns failures and
timeouts into dropouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from fedstyle.federation.client import PHASES, run_client_phase
from fedstyle.payload import Payload


@dataclass
class ClientRequest:
    """What one client receives in a phase.

    ``weights`` are the global weights sent down (counted as model bytes); None means the run's
    initial weights, which every client rebuilds from the config and seed, so nothing travels.
    """

    weights: Mapping[str, torch.Tensor] | None = None
    payload: Payload = field(default_factory=dict)


@dataclass
class PhaseReplies:
    """The clients' results of a phase; ``sent`` are the clients the requests reached (bytes counted)."""

    results: dict[int, Any]
    sent: list[int]
    dropped: list[int] = field(default_factory=list)


class Transport:
    """Base class: the in-process defaults of the hooks around the phases."""

    #: whether the driver's ``client_states`` are the clients' state (checkpointed by the driver);
    #: False where the state lives on the sites (Flower)
    holds_client_state = True

    def attach(self, driver) -> None:
        """Bind to the driver, a :class:`~fedstyle.federation.star.StarSimulator` (called by it)."""
        self.driver = driver

    def start(self) -> None:
        """Before the setup exchange (Flower: wait for the sites)."""

    def begin_round(self, round_index: int, chosen: list[int]) -> None:
        """Before a round's first phase (Flower: identify new nodes, wait for --min-sites)."""

    def call(self, phase: str, requests: dict[int, ClientRequest], round_index: int) -> PhaseReplies:
        raise NotImplementedError

    def end_round(self, round_index: int, chosen: list[int], replied: list[int]) -> None:
        """After the training phase, before aggregation (Flower: the minimum-available check)."""

    def drain_events(self) -> list[dict]:
        """Runtime events since the last call (Flower: dropouts, rejoins), for metrics.jsonl."""
        return []


class InProcessTransport(Transport):
    """Clients as function calls on the driver's shared model, in the order of the requests (the
    training phase through :class:`~fedstyle.federation.batched.BatchedTrainer` when the driver batches)."""

    def call(self, phase: str, requests: dict[int, ClientRequest], round_index: int) -> PhaseReplies:
        sim = self.driver
        if phase == "train" and requests:
            trainer = sim.batching().trainer  # --client-batching: the round's clients as one computation
            if trainer is not None:
                return PhaseReplies(trainer.train(requests, round_index), sent=list(requests))
        purpose, fixed_round = PHASES[phase]
        results = {}
        for cid, request in requests.items():
            ctx = sim.context(cid, round_index if fixed_round is None else fixed_round, purpose)
            weights = sim.initial_weights if request.weights is None else request.weights
            results[cid] = run_client_phase(phase, sim.algo, sim.model, ctx, weights, request.payload,
                                            sim.local_keys, sim.initial_weights)
        return PhaseReplies(results, sent=list(requests))
