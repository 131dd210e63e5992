"""The Flower ClientApp: one site (one client of the run's partition) answering the ServerApp.

Every handler calls the procedure the in-process transport calls
(``fedstyle.federation.client.run_client_phase``) with a ``ClientContext`` made by the same
``StarSimulator.context`` (same derived seeds), so a client trains bitwise as in the simulator
given the same weights and thread count. Messages without weights (the setup exchange) mean the
run's initial weights, which the site rebuilt from the config and seed.

The site learns the run from each message (the resolved config.json travels in the ``fedstyle``
config record) and which client it is from its node config: ``partition-id`` (Flower's simulation
engine sets it; ``flower-supernode --node-config 'partition-id=3'`` in a deployment). It rebuilds
the run's data and model locally (deterministic from the config and seed; about 0.3 s on digits4,
cached for as long as the process lives).

Per-client persistent state (``ClientContext.state``: FedDyn's gradient term, FedBN's local
layers) lives in Flower's ``context.state`` as the ``fedstyle.state`` ArrayRecord, which the
SuperNode keeps between messages of a run. A deployment runs each message in a fresh process, so
whatever ``setup_download`` does outside the state (augmenting the client's data, say) is redone
from the stored setup broadcast — the same rule as ``fedstyle run --resume``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from fedstyle.errors import ConfigError
from fedstyle.federation.client import PHASES, run_client_phase
from fedstyle.runtimes.flower.records import (
    META,
    PAYLOAD,
    SETUP,
    WEIGHTS,
    build_content,
    check_records,
    meta_record,
    payload_names,
    record_to_weights,
    records_to_payload,
    weights_to_record,
)
from fedstyle.payload import Payload, payload_to

STATE = "fedstyle.state"
SETUP_STORED = "fedstyle.setup"
#: node-config key naming the client (partition) a SuperNode holds
PARTITION_KEY = "partition-id"
#: node-config key of a site's own copy of the dataset (replaces the run's --data-root on that site)
DATA_ROOT_KEY = "data-root"

app = ClientApp()


@dataclass
class Site:
    """A run as one process rebuilt it: the experiment (data, model, algorithm) and setup bookkeeping."""

    experiment: object
    setup_applied: set[int] = field(default_factory=set)


_SITES: dict[tuple[str, str | None], Site] = {}


def _site(config_json: str, data_root: str | None) -> Site:
    """The run rebuilt in this process, from the site's own copy of the data when ``data_root`` is given."""
    key = (config_json, data_root)
    site = _SITES.get(key)
    if site is None:
        from fedstyle.experiments.build import build_experiment
        from fedstyle.experiments.config import RunConfig

        config = RunConfig.from_mapping(json.loads(config_json), where="the ServerApp's run config")
        if data_root:
            config = config.updated(data_root=data_root)
        _SITES.clear()  # one run per process at a time; free the previous run's data
        site = _SITES[key] = Site(build_experiment(config, progress=False))
    return site


def client_id_of(context: Context, num_clients: int) -> int:
    if PARTITION_KEY not in context.node_config:
        raise ConfigError(f"this SuperNode has no {PARTITION_KEY!r} in its node config; start it with "
                          f"--node-config '{PARTITION_KEY}=K' (K = 0..{num_clients - 1})")
    cid = int(context.node_config[PARTITION_KEY])
    if not 0 <= cid < num_clients:
        raise ConfigError(f"node config {PARTITION_KEY}={cid} but the run has clients 0..{num_clients - 1}")
    return cid


def _load_state(context: Context, device: torch.device) -> dict[str, torch.Tensor]:
    record = context.state.array_records.get(STATE)
    return {} if record is None else {k: v.to(device) for k, v in record_to_weights(record).items()}


def _save_state(context: Context, state: dict[str, torch.Tensor]) -> None:
    context.state[STATE] = weights_to_record(state)


class _Call:
    """The pieces every handler needs: the site, its client id, the simulator's context factory."""

    def __init__(self, message: Message, context: Context, allowed: list[str]):
        content = message.content
        check_records(content, [META, WEIGHTS, *payload_names(PAYLOAD), *allowed],
                      f"message {message.metadata.message_type}")
        meta = content.config_records[META]
        self.message, self.context = message, context
        self.round = int(meta["round"])
        self._bind(str(meta["config"]))
        self._restore_setup()

    def _bind(self, config_json: str, fresh: bool = False) -> None:
        data_root = self.context.node_config.get(DATA_ROOT_KEY)
        key = (config_json, str(data_root) if data_root else None)
        if fresh:
            _SITES.pop(key, None)
        self.site = _site(*key)
        exp = self.site.experiment
        self.sim = exp.simulator
        self.algo, self.model, self.device = exp.algorithm, exp.model, exp.device
        self.cid = client_id_of(self.context, self.sim.num_clients)
        self.sim.client_states[self.cid] = _load_state(self.context, self.device)

    def has_setup(self) -> bool:
        return SETUP_STORED in self.context.state.array_records

    def join_late(self, broadcast: Payload) -> None:
        """A node without the setup broadcast (a restarted site): apply it as the setup exchange would,
        on the initial weights (rebuilt here from the run's seed)."""
        self.apply_setup(broadcast, self.sim.initial_weights)

    def weights(self) -> dict[str, torch.Tensor]:
        """The downloaded weights, or the run's initial weights when the message carries none."""
        if WEIGHTS not in self.message.content.array_records:
            return self.sim.initial_weights
        return {k: v.to(self.device) for k, v in record_to_weights(self.message.content[WEIGHTS]).items()}

    def payload(self, name: str = PAYLOAD) -> Payload | None:
        payload = records_to_payload(self.message.content, name)
        return None if payload is None else payload_to(payload, self.device)

    def run(self, phase: str, payload: Payload, weights=None):
        """The simulator's client procedure for ``phase`` on this site's client."""
        purpose, fixed_round = PHASES[phase]
        ctx = self.sim.context(self.cid, self.round if fixed_round is None else fixed_round, purpose)
        return run_client_phase(phase, self.algo, self.model, ctx, self.weights() if weights is None else weights,
                                payload, self.sim.local_keys, self.sim.initial_weights)

    def reply(self, **pieces) -> Message:
        _save_state(self.context, self.sim.client_states[self.cid])
        meta = meta_record(client_id=self.cid, round=self.round)
        return Message(build_content(meta, **pieces), reply_to=self.message)

    def apply_setup(self, broadcast: Payload, global_weights) -> dict[str, float]:
        """Hand the setup broadcast to the client and remember it for later messages."""
        if self.cid in self.site.setup_applied:  # this process changed the client's data already: rebuild it
            state = self.sim.client_states[self.cid]
            self._bind(str(self.message.content.config_records[META]["config"]), fresh=True)
            self.sim.client_states[self.cid] = state
            global_weights = {k: v.to(self.device) for k, v in global_weights.items()}
        metrics = self.run("setup_download", broadcast, global_weights)
        stored = build_content(ConfigRecord(), payloads={SETUP: broadcast})
        self.context.state[SETUP_STORED] = stored.array_records[SETUP]
        self.context.state[SETUP_STORED + ".scalars"] = stored.config_records[SETUP + ".scalars"]
        self.site.setup_applied.add(self.cid)
        return metrics

    def _restore_setup(self) -> None:
        """Redo setup_download's effects outside the state in a process that has not seen them.

        The persistent state is kept as stored: only data-side effects are rebuilt, exactly as a
        resumed in-process run does (setup first, then the checkpointed state).
        """
        if self.cid in self.site.setup_applied or SETUP_STORED not in self.context.state.array_records:
            return
        holder = build_content(ConfigRecord())
        holder[SETUP] = self.context.state.array_records[SETUP_STORED]
        holder[SETUP + ".scalars"] = self.context.state.config_records[SETUP_STORED + ".scalars"]
        broadcast = payload_to(records_to_payload(holder, SETUP), self.device)
        kept = self.sim.client_states[self.cid]
        self.sim.client_states[self.cid] = {k: v.clone() for k, v in kept.items()}
        self.run("setup_download", broadcast, self.sim.initial_weights)
        self.sim.client_states[self.cid] = kept
        self.site.setup_applied.add(self.cid)


@app.query("identify")
def identify(message: Message, context: Context) -> Message:
    """Which client this node holds (the ServerApp maps node ids to client ids with it)."""
    call = _Call(message, context, [])
    return call.reply(result={"num_samples": len(call.sim.clients[call.cid])})


@app.query("setup_upload")
def setup_upload(message: Message, context: Context) -> Message:
    call = _Call(message, context, [])
    return call.reply(payloads={PAYLOAD: call.run("setup_upload", call.payload() or {})})


@app.query("setup_download")
def setup_download(message: Message, context: Context) -> Message:
    call = _Call(message, context, [])
    metrics = call.apply_setup(call.payload() or {}, call.weights())
    return call.reply(metrics=metrics)


@app.query("round_query")
def round_query(message: Message, context: Context) -> Message:
    call = _Call(message, context, [])
    return call.reply(payloads={PAYLOAD: call.run("round_query", call.payload() or {})})


@app.train()
def train(message: Message, context: Context) -> Message:
    """Local training on the downloaded weights; a late joiner first applies the setup broadcast sent along."""
    call = _Call(message, context, payload_names(SETUP))
    if SETUP in message.content.array_records and not call.has_setup():
        call.join_late(call.payload(SETUP) or {})
    update = call.run("train", call.payload() or {})
    return call.reply(
        weights=update.weights,
        payloads={PAYLOAD: update.payload},
        result={"num_samples": update.num_samples, "train_loss": update.train_loss},
        metrics=update.metrics,
    )
