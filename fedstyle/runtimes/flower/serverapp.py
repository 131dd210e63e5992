"""The Flower ServerApp: the simulator's round driver, with clients reached through Flower messages.

:class:`FlowerTransport` is a :class:`~fedstyle.federation.transport.Transport`: the round itself —
sampling, the setup exchange, the query and training phases, ``setup_broadcast`` /
``round_payloads`` / ``aggregate``, byte counting — is :class:`~fedstyle.federation.star.StarSimulator`'s
one driver; this module holds only what is Flower's: messages and records, node identification, and
the fault policy. The run loop is the runner's (``fedstyle.experiments.runner``): same evaluation,
selection, checkpoint, metrics.jsonl, summary.json and ``done``. Updates are aggregated in client-id
order, as in the simulator, so without faults a Flower run reproduces the simulator's metrics. The
global weights of a round are serialised once and the same record rides with every message.

Exchanges (each its own message round trip)::

    identify       (new nodes only)   node -> its client id (node config partition-id)
    setup_upload / setup_download     once, before round 0, when the method has a setup phase
    round_query                       when the method has a query phase (weights down)
    train                             weights + the round's payload down; weights, payload, loss up

Faults — the minimum-available policy: the run starts once every site is connected (or, after
``wait_timeout`` seconds, with at least ``min_sites``); a round starts once at least ``min_sites``
sites are connected (waiting up to ``wait_timeout`` seconds); sampled clients whose site is not connected,
or whose reply is an error or does not come within ``round_timeout``, drop out of the round, which
is aggregated from the clients that replied (a ClientApp that *raises* — a bug, a bad setting — stops
the run with its error instead, as the simulator would). Each dropout is logged in metrics.jsonl as
``{"event": "dropout", "round": R, "phase": ..., "clients": [...]}`` (R: the round being trained,
1-based like the evaluation lines). A restarted site registers as a new Flower node, is identified
at the next round, gets the setup broadcast with its first training message, and takes part again
(``{"event": "rejoin", ...}``). Flower marks a killed SuperNode unavailable after missing two
heartbeats (30 s each in Flower 1.41), so a round with a dead site lasts at most about a minute longer.

What differs from the simulator, by design: per-client state lives on the sites (in each site's
state folder, versioned by round, see :mod:`.site`), so the server's checkpoint holds the global
model and server state only. Every message carries the coordinator's session — a random id per start
of the round loop, the checkpoint round it resumed from, the round of the last checkpoint — with
which a site finds the state a (re)done round starts from and prunes the rest
(:mod:`fedstyle.runtimes.site_state`). Byte counts in metrics.jsonl are those of the driver, the same under
every runtime: the weights and payloads each message carries; Flower's own control traffic and
metric records are not counted.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedstyle.algorithms.context import ClientUpdate
from fedstyle.errors import FedstyleError
from fedstyle.federation.transport import ClientRequest, PhaseReplies, Transport
from fedstyle.payload import Payload
from fedstyle.runtimes.flower.received import check_received, received_metrics, received_payload, received_weights
from fedstyle.runtimes.flower.records import (META, METRICS, PAYLOAD, RESULT, SETUP, build_content, meta_record,
                                              weights_to_record)

_LOG = logging.getLogger("flwr")  # Flower's logger (timestamped with FLWR_LOG_LEVEL=DEBUG)

#: how often the ServerApp polls the SuperLink for replies (Flower's own loop sleeps 3 s)
PULL_INTERVAL = 0.1
#: how often the ServerApp looks for newly registered sites while it waits for them
WAIT_INTERVAL = 0.2
#: Flower error codes meaning the ClientApp's code raised (a bug or a bad setting, not a lost site):
#: LOAD_CLIENT_APP_EXCEPTION, CLIENT_APP_RAISED_EXCEPTION, INVALID_FAB
_CLIENT_CODE_FAILED = (1, 2, 7)


class SiteError(FedstyleError):
    """Too few sites are available to go on."""


@dataclass
class FaultPolicy:
    """The minimum-available policy (see the module docstring)."""

    min_sites: int = 1
    wait_timeout: float = 600.0
    round_timeout: float = 1800.0

    @classmethod
    def from_run_config(cls, run_config) -> "FaultPolicy":
        return cls(
            min_sites=int(run_config.get("min-sites", cls.min_sites)),
            wait_timeout=float(run_config.get("wait-timeout", cls.wait_timeout)),
            round_timeout=float(run_config.get("round-timeout", cls.round_timeout)),
        )


#: the driver's phases as Flower message types
MESSAGE_TYPES = {"setup_upload": "query.setup_upload", "setup_download": "query.setup_download",
                 "round_query": "query.round_query", "train": "train"}


class FlowerTransport(Transport):
    """The driver's clients are Flower nodes (one client per SuperNode)."""

    holds_client_state = False  # per-client state lives on the sites

    def __init__(self, grid: Grid, config_json: str, policy: FaultPolicy, log=None, quiet: bool = False):
        self.grid, self.config_json, self.policy = grid, config_json, policy
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        if quiet:
            self.log = lambda message: None
        self.node_of: dict[int, int] = {}  # client id -> Flower node id
        self.client_of: dict[int, int] = {}  # Flower node id -> client id
        self.broadcast: Payload | None = None
        self.has_setup_nodes: set[int] = set()  # nodes that hold the setup broadcast
        self.events: list[dict[str, Any]] = []
        self.seen_clients: set[int] = set()  # clients identified at least once (a second time: a rejoin)
        self.needed = 1  # replies a round needs (the minimum-available policy)
        # what the sites' state stores need (fedstyle.runtimes.site_state.Session): a random id per start
        # of the round loop, the checkpoint round it resumed from, the round of the last checkpoint
        self.session_id = uuid.uuid4().hex[:12]
        self.session_start = 0
        self.durable_round = 0
        self._records: tuple[Any, Any] | None = None  # (weights dict, its ArrayRecord): serialised once

    @property
    def num_clients(self) -> int:
        return self.driver.num_clients

    # -- nodes --------------------------------------------------------------------------
    def refresh_nodes(self, round_index: int) -> None:
        """Identify nodes that appeared since the last call; forget nodes Flower no longer lists."""
        online = set(int(n) for n in self.grid.get_node_ids())
        for node in list(self.client_of):
            if node not in online:
                cid = self.client_of.pop(node)
                if self.node_of.get(cid) == node:
                    del self.node_of[cid]
        new = sorted(online - set(self.client_of))
        if not new:
            return
        replies, _ = self._exchange("query.identify", {("node", n): None for n in new}, round_index,
                                    timeout=self.policy.round_timeout)
        rejoined, joined = [], []
        for (_, node), content in replies.items():
            cid = int(content.config_records[META]["client_id"])
            if cid in self.node_of and self.node_of[cid] != node:  # a restarted site: the old node is gone
                self.client_of.pop(self.node_of[cid], None)
            (rejoined if cid in self.seen_clients else joined).append(cid)
            self.node_of[cid], self.client_of[node] = node, cid
            self.seen_clients.add(cid)
        if round_index >= 0:  # after the start: a site that came back, or came late
            if rejoined:
                self._event("rejoin", round_index, "identify", sorted(rejoined))
            if joined:
                self._event("join", round_index, "identify", sorted(joined))

    def wait_for_sites(self, needed: int, round_index: int, at_least: int | None = None) -> None:
        """Wait until ``needed`` sites are connected; after ``wait_timeout`` s settle for ``at_least`` if given."""
        deadline = time.monotonic() + self.policy.wait_timeout
        announced = False
        while True:
            # identify once enough nodes are registered (one batch of identify messages, not one per
            # node as they trickle in: each costs a ClientApp process on the site)
            if len(self.grid.get_node_ids()) >= needed or time.monotonic() > deadline:
                self.refresh_nodes(round_index)
                if len(self.node_of) >= needed:
                    return
            if time.monotonic() > deadline and at_least is not None and len(self.node_of) >= at_least:
                self.log(f"starting with {len(self.node_of)} of {needed} sites (clients {sorted(self.node_of)})")
                return
            if time.monotonic() > deadline:
                raise SiteError(
                    f"only {len(self.node_of)} of the {needed} required sites are connected after "
                    f"{self.policy.wait_timeout:.0f} s (clients {sorted(self.node_of)}); start the missing "
                    "SuperNodes or lower --min-sites, then continue with `fedstyle deploy --resume OUT`")
            if not announced:
                self.log(f"waiting for sites: {len(self.node_of)} of {needed} connected")
                announced = True
            time.sleep(WAIT_INTERVAL)

    # -- messaging ----------------------------------------------------------------------
    def _content(self, cid: int | None, round_index: int, **pieces) -> RecordDict:
        meta = meta_record(config=self.config_json, client_id=-1 if cid is None else cid, round=round_index,
                           num_clients=self.num_clients, session=self.session_id,
                           session_start=self.session_start, durable_round=self.durable_round)
        return build_content(meta, **pieces)

    def _weights_record(self, weights):
        """The weights as one ArrayRecord, built once per weights dict (the driver makes one per round)."""
        if self._records is None or self._records[0] is not weights:
            self._records = (weights, weights_to_record(weights))
        return self._records[1]

    def _exchange(self, message_type: str, contents: dict, round_index: int, timeout: float):
        """Send one message per key (``cid`` or ``("node", node_id)``) and collect the replies.

        Returns ({key: reply content}, [keys that dropped out: no node, an error, or no reply in time]).
        """
        messages, key_of, dropped = [], {}, []
        for key, pieces in contents.items():
            node = key[1] if isinstance(key, tuple) else self.node_of.get(key)
            if node is None:
                dropped.append(key)
                continue
            cid = None if isinstance(key, tuple) else key
            content = self._content(cid, round_index, **(pieces or {}))
            messages.append((key, Message(content, dst_node_id=node, message_type=message_type,
                                          group_id=str(round_index), ttl=timeout + 60)))
        ids = list(self.grid.push_messages([m for _, m in messages])) if messages else []
        ids += [None] * (len(messages) - len(ids))  # Flower returns [] when the request was too large
        for (key, _), mid in zip(messages, ids):
            if mid is None:  # the SuperLink did not accept this message
                self.log(f"{message_type} to {self._name(key)} could not be pushed to the SuperLink")
                dropped.append(key)
            else:
                key_of[mid] = key
        pending, replies = set(key_of), {}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                key = key_of[mid]
                if reply.has_error():
                    if reply.error.code in _CLIENT_CODE_FAILED:
                        # the method itself failed on the site (as it would in the simulator): stop, do not hide it
                        raise SiteError(f"{message_type} on {self._name(key)} failed: {reply.error.reason}; the "
                                        "traceback is in that site's SuperNode log (flower/site-K.log)")
                    self.log(f"{message_type} to {self._name(key)} failed: {reply.error.reason}")
                    dropped.append(key)
                else:
                    replies[key] = reply.content
            if pending:
                time.sleep(PULL_INTERVAL)
        for mid in pending:
            self.log(f"{message_type} to {self._name(key_of[mid])}: no reply within {timeout:.0f} s")
            dropped.append(key_of[mid])
        for key in dropped:  # a node that failed is not trusted with the next message
            node = key[1] if isinstance(key, tuple) else self.node_of.pop(key, None)
            if node is not None:
                self.client_of.pop(node, None)
                self.has_setup_nodes.discard(node)
        return replies, dropped

    @staticmethod
    def _name(key) -> str:
        return f"node {key[1]}" if isinstance(key, tuple) else f"client {key}"

    def _event(self, kind: str, round_index: int, phase: str, clients: list[int]) -> None:
        event = {"event": kind, "round": round_index + 1, "phase": phase, "clients": clients}
        self.events.append(event)
        self.log(json.dumps(event))

    def _drop(self, dropped: list, round_index: int, phase: str) -> None:
        cids = sorted(k for k in dropped if not isinstance(k, tuple))
        if cids:
            self._event("dropout", round_index, phase, cids)

    # -- the transport ------------------------------------------------------------------
    def start(self) -> None:
        # every site is expected at the start (up to --wait-timeout), so that round 1 does not begin
        # while sites are still registering; later rounds need only --min-sites
        self.wait_for_sites(self.num_clients, -1, at_least=min(self.policy.min_sites, self.num_clients))

    def begin_round(self, round_index: int, chosen: list[int]) -> None:
        self.wait_for_sites(min(self.policy.min_sites, self.num_clients), round_index)
        self.needed = min(self.policy.min_sites, len(chosen))

    def call(self, phase: str, requests: dict[int, ClientRequest], round_index: int) -> PhaseReplies:
        contents = {}
        for cid, request in requests.items():
            pieces: dict[str, Any] = {"payloads": {PAYLOAD: request.payload}}
            if request.weights is not None:
                pieces["weights"] = self._weights_record(request.weights)
            if phase == "setup_download":
                self.broadcast = request.payload  # kept for sites that (re)join after the setup exchange
            elif phase == "train" and self.broadcast is not None and self.node_of.get(cid) not in self.has_setup_nodes:
                pieces["payloads"][SETUP] = self.broadcast
            contents[cid] = pieces
        sent = [cid for cid in requests if cid in self.node_of]
        sent_at = time.perf_counter()
        replies, dropped = self._exchange(MESSAGE_TYPES[phase], contents, round_index, self.policy.round_timeout)
        _LOG.debug("fedstyle: %s round %d: %d replies, %d dropouts after %.2f s", phase, round_index, len(replies),
                   len(dropped), time.perf_counter() - sent_at)
        self._drop(dropped, round_index, phase)
        results = {cid: self._result(phase, cid, replies[cid]) for cid in sorted(replies)}
        if phase in ("setup_download", "train"):
            self.has_setup_nodes.update(self.node_of[cid] for cid in results if cid in self.node_of)
        if phase == "setup_upload" and not results:
            raise SiteError("no site answered the setup exchange")
        return PhaseReplies(results, sent=sent, dropped=sorted(k for k in dropped if not isinstance(k, tuple)))

    def _result(self, phase: str, cid: int, content: RecordDict):
        if phase == "setup_download":
            return received_metrics(content)
        if phase != "train":
            return received_payload(content, self.driver.device) or {}
        check_received(content, f"client {cid}'s reply", [RESULT, METRICS])
        result = content.metric_records[RESULT]
        return ClientUpdate(
            client_id=cid,
            weights=received_weights(content, self.driver.device),
            num_samples=int(result["num_samples"]),
            train_loss=float(result["train_loss"]),
            payload=received_payload(content, self.driver.device) or {},
            metrics=received_metrics(content),
        )

    def end_round(self, round_index: int, chosen: list[int], replied: list[int]) -> None:
        if len(replied) < self.needed:
            raise SiteError(f"round {round_index + 1}: {len(replied)} of the {len(chosen)} sampled sites replied, "
                            f"fewer than --min-sites {self.needed}; continue with `fedstyle deploy --resume OUT` "
                            "once the sites are back")

    def drain_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events


def serve(grid: Grid, out: Path, policy: FaultPolicy, *, quiet: bool = True, log_events: bool = True,
          experiment=None) -> dict[str, Any]:
    """Run (or resume from its checkpoint) the run in ``out`` with the clients behind ``grid``.

    ``quiet`` silences the progress bar, ``log_events`` the fault and waiting messages (stderr).
    """
    from fedstyle.experiments.build import build_experiment
    from fedstyle.experiments.checkpoint import load_checkpoint
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.runner import CONFIG, train_experiment

    config_text = (out / CONFIG).read_text()
    if experiment is None:
        started = time.perf_counter()
        config = RunConfig.from_mapping(json.loads(config_text), where=str(out / CONFIG))
        experiment = build_experiment(config, progress=False)
        _LOG.debug("fedstyle: the ServerApp built the run in %.2f s", time.perf_counter() - started)
    if experiment.config.topology != "star":
        raise FedstyleError("Flower runs star-topology methods; peer-to-peer runs use the in-process simulator")
    config_json = json.dumps(json.loads(config_text), sort_keys=True)
    checkpoint = load_checkpoint(out)
    transport = FlowerTransport(grid, config_json, policy, quiet=not log_events)
    if checkpoint is not None:
        transport.session_start = transport.durable_round = int(checkpoint[1]["round"])
    experiment.simulator.use_transport(transport)
    return train_experiment(experiment, out, quiet=quiet, checkpoint=checkpoint,
                            on_checkpoint=lambda done_round: setattr(transport, "durable_round", done_round))


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under a SuperLink: the run directory and fault policy come from the run config.

    The ServerApp writes the run directory, so it holds the directory's lock itself (shared with the
    `fedstyle deploy` process that started it, see :class:`~.deployment.Federation`): a resume is refused
    for as long as it lives, whatever happened to that process — which it also dies with
    (:func:`~.processes.die_with_owner`).
    """
    from fedstyle.io import DirectoryLock
    from fedstyle.runtimes.flower.deployment import record_serverapp
    from fedstyle.runtimes.flower.processes import die_with_owner

    die_with_owner()
    run_dir = str(context.run_config.get("run-dir", ""))
    if not run_dir or not (Path(run_dir) / "config.json").exists():
        raise FedstyleError(f"run-dir {run_dir!r} holds no config.json; start runs with `fedstyle deploy`")
    with DirectoryLock(run_dir, shared=True):
        record_serverapp(Path(run_dir))  # `fedstyle deploy` watches this process from now on
        # no progress bar in the ServerApp's log (the `fedstyle deploy` process shows one); faults are logged
        serve(grid, Path(run_dir), FaultPolicy.from_run_config(context.run_config), quiet=True, log_events=True)
