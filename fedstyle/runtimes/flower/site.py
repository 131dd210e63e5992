"""What a site does with a message (the ClientApp's handlers, :mod:`.clientapp`, call into this module).

Every handler calls the procedure the in-process transport calls
(``fedstyle.federation.client.run_client_phase``) with a ``ClientContext`` made by the same
``StarSimulator.context`` (same derived seeds), so a client trains bitwise as in the simulator
given the same weights and thread count. Messages without weights (the setup exchange) mean the
run's initial weights, which the site rebuilt from the config and seed.

The site learns the run from each message (the resolved config.json travels in the ``fedstyle``
config record) and which client it is from its node config: ``partition-id`` (Flower's simulation
engine sets it; ``flower-supernode --node-config 'partition-id=3'`` in a deployment). It rebuilds
the run's data and model locally (deterministic from the config and seed; cached for as long as the
process lives — a deployment starts a fresh process per message, Flower's design).

Per-client persistent state (``ClientContext.state``: FedDyn's gradient term, FedBN's local layers,
any tensor a method keeps) lives on disk in the site's state folder
(:class:`~fedstyle.runtimes.site_state.ClientStateStore`: node config ``state-dir``, else
``$FEDSTYLE_SITE_STATE``, else the per-user state folder), one snapshot per message that changed it,
versioned by round. A message at round r works on the state after the client's last message before
it; the coordinator's session (sent along) tells the store which snapshots a resumed coordinator
abandoned and which are older than its last checkpoint. So a restarted site and a resumed
coordinator continue exactly where an uninterrupted run would be.

On a deployed site (not fedstyle's flower-sim engine: :func:`.node_config.in_simulation_engine`) a style
defence's noise comes from the OS, the operator's floor (node config ``dp-min-noise``, ``dp-max-clip``)
raises the run's defence, and every defended release goes through the site's release ledger
(:mod:`fedstyle.runtimes.site_privacy`): the same question gets the same release, and the budget
(``dp-max-epsilon``) is counted there, where no resume rolls it back (docs/privacy.md).

What ``setup_download`` does outside the state (augmenting the client's data, say) lives in the
process: a fresh process redoes it from the setup broadcast kept in Flower's ``context.state``
(the SuperNode's memory, for the run), on a scratch copy of the state — the same rule as
``fedstyle run --resume``. A site that lost the broadcast (a restarted SuperNode) gets it again with
its next training message.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Message

from fedstyle.federation.client import PHASES, run_client_phase
from fedstyle.payload import Payload
from fedstyle.runtimes.flower.node_config import (
    DATA_ROOT_KEY,
    STATE_DIR_KEY,
    SitePrivacy,
    client_id_of,
    in_simulation_engine,
    site_privacy,
)
from fedstyle.runtimes.flower.received import check_received, received_payload, received_weights
from fedstyle.runtimes.flower.records import META, PAYLOAD, SETUP, WEIGHTS, build_content, meta_record, payload_names
from fedstyle.runtimes.site_privacy import ReleaseLedger, SiteReleases, apply_floor, tensors_digest
from fedstyle.runtimes.site_state import ClientStateStore, Session, default_state_root, run_key, same_state, step_of

_LOG = logging.getLogger("flwr")  # Flower's logger: the SuperNode's log, timestamped at DEBUG level

#: Flower context.state record holding the setup broadcast (for fresh processes of the same run)
SETUP_STORED = "fedstyle.setup"


@dataclass
class Site:
    """A run as one process rebuilt it: the experiment (data, model, algorithm) and setup bookkeeping;
    ``asked``: the defence the coordinator's config asked for, before the site's floor (for the ledger)."""

    experiment: object
    setup_applied: set[int] = field(default_factory=set)
    asked: dict[str, float] = field(default_factory=dict)


_SITES: dict[tuple[str, str | None, bool, SitePrivacy], Site] = {}


def _site(config_json: str, data_root: str | None, deployed: bool = False, floor: SitePrivacy = SitePrivacy()) -> Site:
    """The run rebuilt in this process, from the site's own copy of the data when ``data_root`` is given.
    ``deployed`` (a site outside fedstyle's flower-sim engine): a style defence's noise comes from the OS CSPRNG
    whatever the received config says — the config comes from the coordinator the noise protects against —
    and the defence is at least the operator's ``floor`` (:func:`~fedstyle.runtimes.site_privacy.apply_floor`)."""
    key = (config_json, data_root, deployed, floor)
    site = _SITES.get(key)
    if site is None:
        from fedstyle.experiments.build import build_experiment, deployment_noise
        from fedstyle.experiments.config import RunConfig

        config = RunConfig.from_mapping(json.loads(config_json), where="the ServerApp's run config")
        if data_root:
            config = config.updated(data_root=data_root)
        asked: dict[str, float] = {}
        if deployed:
            if config.hparams.get("dp_noise_source") == "seeded":
                _LOG.warning("fedstyle: the run's config asks for seeded style noise; this site is deployed and "
                             "draws it from the OS CSPRNG instead (the coordinator could regenerate seeded noise)")
            config = deployment_noise(config, refuse_seeded=False)
            floored, asked = apply_floor(config, floor)
            if floored is not config:
                hp = floored.hparams
                _LOG.warning("fedstyle: this site's floor applies: noise multiplier %g (the run asked %g), clip %g "
                             "(the run asked %g)", hp["dp_noise"], asked["noise"], hp["dp_clip"], asked["clip"])
            config = floored
        _SITES.clear()  # one run per process at a time; free the previous run's data
        site = _SITES[key] = Site(build_experiment(config, progress=False), asked=asked)
    return site


def state_root(context: Context) -> Path:
    """The site's state folder: node config ``state-dir``, else $FEDSTYLE_SITE_STATE, else the per-user one."""
    configured = context.node_config.get(STATE_DIR_KEY)
    return Path(str(configured)).expanduser() if configured else default_state_root()


def state_store(context: Context, config_json: str, client_id: int) -> ClientStateStore:
    return ClientStateStore.open(state_root(context), config_json, client_id)


class Call:
    """One message on this site: the rebuilt run, its client id, the client's state at this step."""

    def __init__(self, message: Message, context: Context, phase: str, allowed: list[str],
                 started: float | None = None):
        self.times = {"start": started if started is not None else time.perf_counter(), "imported": time.perf_counter()}
        content = message.content
        check_received(content, f"message {message.metadata.message_type}", allowed)
        meta = content.config_records[META]
        self.message, self.context, self.phase = message, context, phase
        self.round = int(meta["round"])
        self.step = step_of(phase, self.round)
        self.session = Session(str(meta["session"]), int(meta["session_start"]), int(meta["durable_round"]))
        self.config_json = str(meta["config"])
        self._bind(self.config_json)
        self.times["built"] = time.perf_counter()
        self.store = state_store(context, self.config_json, self.cid)
        # the setup exchange reruns at every start: it never prunes what the rounds will need
        self.store.prune(self.session, durable=self.round >= 0)
        state, self.snapshot = self.store.load(self.step, self.session.id, self.device)
        self.loaded = {k: v.clone() for k, v in state.items()}  # hooks may change tensors in place
        self.sim.client_states[self.cid] = state
        self.times["state"] = time.perf_counter()
        self._restore_setup()
        self.times["setup"] = time.perf_counter()

    def _bind(self, config_json: str, fresh: bool = False) -> None:
        data_root = self.context.node_config.get(DATA_ROOT_KEY)
        self.deployed = not in_simulation_engine(self.context)
        self.floor = site_privacy(self.context) if self.deployed else SitePrivacy()
        key = (config_json, str(data_root) if data_root else None, self.deployed, self.floor)
        if fresh:
            _SITES.pop(key, None)
        self.site = _site(*key)
        exp = self.site.experiment
        self.sim = exp.simulator
        self.algo, self.model, self.device = exp.algorithm, exp.model, exp.device
        self.cid = client_id_of(self.context, self.sim.num_clients)

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return self.sim.client_states[self.cid]

    def has_setup(self) -> bool:
        return SETUP_STORED in self.context.state.array_records

    def join_late(self, broadcast: Payload) -> None:
        """A node without the setup broadcast (a restarted SuperNode, a late site): apply it as the setup
        exchange would, on the initial weights (rebuilt here from the run's seed). A site whose stored
        state already went through the setup exchange keeps that state (only the data-side effects are
        redone); a site without it starts from what the setup leaves."""
        keep = self.snapshot is not None and self.snapshot.step >= step_of("setup_download", -1)
        self.apply_setup(broadcast, self.sim.initial_weights, scratch=keep)

    def weights(self) -> dict[str, torch.Tensor]:
        """The downloaded weights, or the run's initial weights when the message carries none."""
        if WEIGHTS not in self.message.content.array_records:
            return self.sim.initial_weights
        return received_weights(self.message.content, self.device)

    def payload(self, name: str = PAYLOAD) -> Payload | None:
        return received_payload(self.message.content, self.device, name)

    def run(self, phase: str, payload: Payload, weights=None):
        """The simulator's client procedure for ``phase`` on this site's client (on a deployed site, its
        defended releases go through the site's ledger: :meth:`release_keeper`)."""
        purpose, fixed_round = PHASES[phase]
        round_index = self.round if fixed_round is None else fixed_round
        ctx = self.sim.context(self.cid, round_index, purpose)
        weights = self.weights() if weights is None else weights
        if self.deployed:
            ctx.release_keeper = self.release_keeper(phase, round_index, weights, payload)
        return run_client_phase(phase, self.algo, self.model, ctx, weights, payload, self.sim.local_keys,
                                self.sim.initial_weights)

    def release_keeper(self, phase: str, round_index: int, weights, payload: Payload) -> SiteReleases:
        """The site's ledger for this message: a release is the same question again when the run, client,
        round, phase and what the message sent (weights, payload) are."""
        return SiteReleases(ReleaseLedger.open(state_root(self.context), self.cid), run=run_key(self.config_json),
                            client=self.cid, round_index=round_index,
                            inputs=lambda: phase + ":" + tensors_digest(weights, payload or {}),
                            floor=self.floor, asked=self.site.asked, log=_LOG.info)

    def save_state(self) -> None:
        """Persist the client's state if this message changed it (a snapshot of this step)."""
        state = self.state
        if not same_state(self.loaded, state):
            self.store.save(self.step, self.session.id, state)
            self.loaded = {k: v.clone() for k, v in state.items()}

    def reply(self, **pieces) -> Message:
        ran = time.perf_counter()
        self.save_state()
        meta = meta_record(client_id=self.cid, round=self.round)
        message = Message(build_content(meta, **pieces), reply_to=self.message)
        t = self.times
        # one line per message in the SuperNode's log with FLWR_LOG_LEVEL=DEBUG (benchmarks/deploy_timeline.py)
        _LOG.debug("fedstyle: client %d %s round %d: import %.2f s, build %.2f s, state load %.2f s, setup redo %.2f s, "
                   "hook %.2f s, state save + reply %.2f s", self.cid, self.phase, self.round,
                   t["imported"] - t["start"], t["built"] - t["imported"], t["state"] - t["built"],
                   t["setup"] - t["state"], ran - t["setup"], time.perf_counter() - ran)
        return message

    def apply_setup(self, broadcast: Payload, global_weights, scratch: bool = False) -> dict[str, float]:
        """Hand the setup broadcast to the client and remember it for later messages of this run.

        ``scratch``: run it on a copy of the state and keep the state as it was (only its effects
        outside the state, on the client's data, remain).
        """
        state = self.state
        if self.cid in self.site.setup_applied:  # this process changed the client's data already: rebuild it
            self._bind(self.config_json, fresh=True)
            global_weights = {k: v.to(self.device) for k, v in global_weights.items()}
        self.sim.client_states[self.cid] = {k: v.clone() for k, v in state.items()} if scratch else state
        metrics = self.run("setup_download", broadcast, global_weights)
        if scratch:
            self.sim.client_states[self.cid] = state
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
        if self.cid in self.site.setup_applied or not self.has_setup():
            return
        holder = build_content(ConfigRecord())
        holder[SETUP] = self.context.state.array_records[SETUP_STORED]
        holder[SETUP + ".scalars"] = self.context.state.config_records[SETUP_STORED + ".scalars"]
        broadcast = received_payload(holder, self.device, SETUP)
        kept = self.state
        self.sim.client_states[self.cid] = {k: v.clone() for k, v in kept.items()}
        self.run("setup_download", broadcast, self.sim.initial_weights)
        self.sim.client_states[self.cid] = kept
        self.site.setup_applied.add(self.cid)


def setup_upload(message: Message, context: Context, started: float | None = None) -> Message:
    call = Call(message, context, "setup_upload", [], started)
    return call.reply(payloads={PAYLOAD: call.run("setup_upload", call.payload() or {})})


def setup_download(message: Message, context: Context, started: float | None = None) -> Message:
    call = Call(message, context, "setup_download", [], started)
    metrics = call.apply_setup(call.payload() or {}, call.weights())
    return call.reply(metrics=metrics)


def round_query(message: Message, context: Context, started: float | None = None) -> Message:
    call = Call(message, context, "round_query", [], started)
    return call.reply(payloads={PAYLOAD: call.run("round_query", call.payload() or {})})


def train(message: Message, context: Context, started: float | None = None) -> Message:
    """Local training on the downloaded weights; a late joiner first applies the setup broadcast sent along."""
    call = Call(message, context, "train", payload_names(SETUP), started)
    if SETUP in message.content.array_records and not call.has_setup():
        call.join_late(call.payload(SETUP) or {})
    update = call.run("train", call.payload() or {})
    return call.reply(
        weights=update.weights,
        payloads={PAYLOAD: update.payload},
        result={"num_samples": update.num_samples, "train_loss": update.train_loss},
        metrics=update.metrics,
    )
