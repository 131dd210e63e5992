"""The ServerApp's round logic and fault policy, in-process: a fake Flower grid that hands every message
to the real ClientApp (no processes, a few seconds). The process-level tests are in test_flower_deploy.py."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs fedstyle[flower] (flwr not installed)")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402

from fedstyle.algorithms import METHODS  # noqa: E402
from probes import ExchangeProbe as SharedExchangeProbe  # noqa: E402
from fedstyle.experiments.runner import run_experiment, start_run_dir  # noqa: E402
from fedstyle.runtimes.flower.clientapp import app as client_app  # noqa: E402
from fedstyle.runtimes.flower.serverapp import FaultPolicy, SiteError, serve  # noqa: E402

CLIENT_APP_RAISED_EXCEPTION, NODE_UNAVAILABLE = 2, 5  # flwr.common.constant.ErrorCode


class FakeGrid:
    """Nodes by id with their partition id; ``before_round`` hooks change the federation between rounds."""

    def __init__(self, partitions: dict[int, int]):
        self.partitions = dict(partitions)
        self.contexts = {n: self._context(n) for n in self.partitions}
        self.dead: set[int] = set()
        self.replies: dict[str, Message] = {}
        self.trains = 0
        self.on_train = None  # called with the number of train messages seen so far

    def _context(self, node: int) -> Context:
        return Context(run_id=1, node_id=node, node_config={"partition-id": self.partitions[node]},
                       state=RecordDict(), run_config={})

    def add_node(self, node: int, partition: int) -> None:
        self.partitions[node] = partition
        self.contexts[node] = self._context(node)

    def get_node_ids(self):
        return [n for n in self.partitions if n not in self.dead]

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id
            node = message.metadata.dst_node_id
            if message.metadata.message_type == "train":
                self.trains += 1
                if self.on_train:
                    self.on_train(self)
            if node in self.dead:
                reply = Message(Error(code=NODE_UNAVAILABLE, reason="node unavailable"), reply_to=message)
            else:
                try:
                    reply = client_app(message=message, context=self.contexts[node])
                except Exception as ex:  # what flwr-clientapp does with an exception
                    reply = Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(ex)}:<'{ex}'>"),
                                    reply_to=message)
            self.replies[message.object_id] = reply
            ids.append(message.object_id)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


def evaluations(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in lines if "event" not in r]


def events(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("event")
            in ("dropout", "rejoin", "join")]


@pytest.fixture(autouse=True)
def task_identity():
    """Flower stamps messages with the process's task identity, which a real ServerApp process has set."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@pytest.fixture
def config(tiny_config):
    return tiny_config.updated(lr_schedule="constant", rounds=3)  # 3 clients (one per source domain)


def test_fake_grid_reproduces_the_simulator(config, tmp_path):
    config = config.updated(method="fedbn", rounds=2)  # per-client state (local BatchNorm) lives in context.state
    run_experiment(config, tmp_path / "sim", quiet=True)
    start_run_dir(config, tmp_path / "flower", quiet=True)
    grid = FakeGrid({101: 2, 102: 0, 103: 1})  # node ids unrelated to client ids
    serve(grid, tmp_path / "flower", FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")
    assert all("fedstyle.state" in c.state.array_records for c in grid.contexts.values())


def test_dead_node_drops_out_and_a_new_node_rejoins(config, tmp_path):
    start_run_dir(config, tmp_path / "run", quiet=True)
    grid = FakeGrid({10: 0, 11: 1, 12: 2})

    def faults(g):
        if g.trains == 4:  # the first train message of round 2: client 1's site has died
            g.dead.add(11)
        if g.trains == 6:  # it comes back as a new Flower node, identified at round 3
            g.add_node(21, 1)

    grid.on_train = faults
    summary = serve(grid, tmp_path / "run", FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert events(tmp_path / "run") == [{"event": "dropout", "round": 2, "phase": "train", "clients": [1]},
                                        {"event": "rejoin", "round": 3, "phase": "identify", "clients": [1]}]
    assert summary["rounds"] == 3 and (tmp_path / "run" / "done").exists()


def test_late_site_joins_and_min_sites_enforced(config, tmp_path):
    start_run_dir(config, tmp_path / "run", quiet=True)
    grid = FakeGrid({10: 0, 11: 1, 12: 2})
    grid.dead.add(11)  # gone before the run starts: the run starts with 2 of 3 sites after wait_timeout

    def back(g):
        if g.trains == 3:  # during round 2's push: the site is back as a new node for round 3
            g.add_node(21, 1)

    grid.on_train = back
    serve(grid, tmp_path / "run", FaultPolicy(min_sites=2, wait_timeout=0.5), quiet=True, log_events=False)
    assert events(tmp_path / "run") == [
        {"event": "dropout", "round": 1, "phase": "train", "clients": [1]},
        {"event": "dropout", "round": 2, "phase": "train", "clients": [1]},
        {"event": "join", "round": 3, "phase": "identify", "clients": [1]},
    ]

    start_run_dir(config, tmp_path / "strict", quiet=True)
    grid = FakeGrid({10: 0, 11: 1, 12: 2})
    grid.on_train = lambda g: g.dead.update({11, 12}) if g.trains == 4 else None
    with pytest.raises(SiteError, match="1 of the 3 sampled sites replied, fewer than --min-sites 2"):
        serve(grid, tmp_path / "strict", FaultPolicy(min_sites=2, wait_timeout=0.5), quiet=True, log_events=False)
    assert not (tmp_path / "strict" / "done").exists()


def test_a_raising_client_stops_the_run_with_its_error(config, tmp_path, monkeypatch):
    from fedstyle.algorithms.fedavg import FedAvg

    def broken(self, ctx, model, payload):
        raise RuntimeError("boom in local_train")

    monkeypatch.setattr(FedAvg, "local_train", broken)
    start_run_dir(config, tmp_path / "run", quiet=True)
    with pytest.raises(SiteError, match="boom in local_train"):
        serve(FakeGrid({10: 0, 11: 1, 12: 2}), tmp_path / "run", FaultPolicy(wait_timeout=1), quiet=True,
              log_events=False)


def test_partition_id_is_checked(config, tmp_path):
    start_run_dir(config, tmp_path / "run", quiet=True)
    with pytest.raises(SiteError, match="partition-id=7 but the run has clients 0..2"):
        serve(FakeGrid({10: 7}), tmp_path / "run", FaultPolicy(wait_timeout=1), quiet=True, log_events=False)


class ExchangeProbe(SharedExchangeProbe):
    """Every exchange hook and per-client state (tests/probes.py), plus a string in the broadcast and a
    number in the upload payload, so messages carry every record type."""

    name = "flower_exchange_probe"

    def setup_broadcast(self, uploads, server):
        return {**super().setup_broadcast(uploads, server), "note": "bank"}

    def upload_payload(self, ctx, model):
        return {**super().upload_payload(ctx, model), "steps": 2}


def test_every_exchange_hook_travels_as_messages(config, tmp_path, monkeypatch):
    monkeypatch.setitem(METHODS._items, ExchangeProbe.name, ExchangeProbe)  # registered for this test only
    config = config.updated(method=ExchangeProbe.name, partition="per_domain", clients=6, clients_per_round=4, rounds=2)
    run_experiment(config, tmp_path / "sim", quiet=True)
    start_run_dir(config, tmp_path / "flower", quiet=True)
    grid = FakeGrid({100 + c: c for c in range(6)})
    serve(grid, tmp_path / "flower", FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")  # incl. payload and setup bytes

    def setup_line(run_dir):
        line = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
        return {k: v for k, v in line.items() if "seconds" not in k and not k.endswith("_per_s")}

    assert setup_line(tmp_path / "flower") == setup_line(tmp_path / "sim")
    assert setup_line(tmp_path / "sim")["bank_entries"] == 36.0  # 6 clients x 6 entries, summed
    from fedstyle.runtimes.flower.clientapp import STATE
    from fedstyle.runtimes.flower.records import record_to_weights

    states = [record_to_weights(c.state.array_records[STATE]) for c in grid.contexts.values()]
    assert all(torch.equal(s["bank"], states[0]["bank"]) and len(s["bank"]) == 6 for s in states)
    assert sum("received" in s for s in states) >= 4  # every client sampled at least once trained with its payload


def test_a_site_that_rejoins_gets_the_setup_broadcast(config, tmp_path, monkeypatch):
    monkeypatch.setitem(METHODS._items, ExchangeProbe.name, ExchangeProbe)
    start_run_dir(config.updated(method=ExchangeProbe.name), tmp_path / "run", quiet=True)
    grid = FakeGrid({10: 0, 11: 1, 12: 2})

    def faults(g):
        if g.trains == 4:  # round 2: client 1's site dies ...
            g.dead.add(11)
        if g.trains == 6:  # ... and comes back empty-handed (fresh context.state) for round 3
            g.add_node(21, 1)

    grid.on_train = faults
    serve(grid, tmp_path / "run", FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    from fedstyle.runtimes.flower.clientapp import SETUP_STORED, STATE
    from fedstyle.runtimes.flower.records import record_to_weights

    fresh = grid.contexts[21].state
    assert SETUP_STORED in fresh.array_records  # the broadcast came with its first training message
    state = record_to_weights(fresh.array_records[STATE])
    assert torch.equal(state["bank"], record_to_weights(grid.contexts[10].state.array_records[STATE])["bank"])
    assert "received" in state  # and it trained in round 3 with its payload
