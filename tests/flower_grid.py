"""An in-process Flower grid (not collected: no test_ prefix): the real ServerApp (``serve``) and the real
ClientApp, every message handed over as bytes in Flower's wire format, no processes.

Shared by the ServerApp's fault-policy tests (test_flower_policy.py) and the methods' tests "under Flower
equals the simulator": a method's queries, payloads, setup exchange and per-client state travel through the
same ServerApp, ClientApp, records and site state folder as in a deployment (``fedstyle deploy``) and in
``--backend flower-sim``, serialised to Flower's protobuf messages and parsed back as a SuperLink and a
SuperNode do. What this leaves out is the process machinery around those apps, tested on its own and
method-independent: Ray's simulation engine (test_flower_sim.py, test_flower_cluster.py) and real
SuperLink / SuperNode processes with TLS, node authentication, kills and resumes (test_flower_deploy.py).
A method test through this grid takes seconds; the same test on Ray took 15-25 s of wall time and twice
that in CPU (actor processes importing torch) on the 2-core CPU.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage

CLIENT_APP_RAISED_EXCEPTION, NODE_UNAVAILABLE = 2, 5  # flwr.common.constant.ErrorCode


def over_the_wire(message: Message) -> Message:
    """``message`` serialised to bytes in Flower's protobuf format and parsed back (what crosses gRPC)."""
    data = message_to_proto(message).SerializeToString()
    proto = ProtoMessage()
    proto.ParseFromString(data)
    return message_from_proto(proto)


class FakeGrid:
    """Nodes by id with their partition id; ``on_train`` hooks change the federation between messages.

    ``wire`` (default on) passes every message and reply through :func:`over_the_wire`; off, the ClientApp
    gets the ServerApp's own objects (the fault-policy tests' former behaviour)."""

    def __init__(self, partitions: dict[int, int], wire: bool = True):
        from fedstyle.runtimes.flower.clientapp import app as client_app

        self.client_app = client_app
        self.wire = wire
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
                received = over_the_wire(message) if self.wire else message
                try:
                    reply = self.client_app(message=received, context=self.contexts[node])
                except Exception as ex:  # what flwr-clientapp does with an exception
                    reply = Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(ex)}:<'{ex}'>"),
                                    reply_to=received)
                if self.wire:
                    reply = over_the_wire(reply)
            self.replies[message.object_id] = reply
            ids.append(message.object_id)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


@contextmanager
def server_task_identity() -> Iterator[None]:
    """Flower stamps messages with the process's task identity, which a real ServerApp process has set."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def run_under_flower(config, out: Path, state_dir: Path | None = None) -> dict[str, Any]:
    """Run ``config`` into ``out`` through Flower's ServerApp and ClientApp on a :class:`FakeGrid` (one node
    per client, node ids unrelated to client ids, every message over the wire); the summary.

    The sites keep their clients' state in ``state_dir`` (default ``out``/flower/state, where a local
    deployment and flower-sim keep it)."""
    from fedstyle.experiments.runner import start_run_dir
    from fedstyle.runtimes.flower.serverapp import FaultPolicy, serve
    from fedstyle.runtimes.site_state import STATE_DIR_ENV

    experiment = start_run_dir(config, out, quiet=True)
    grid = FakeGrid({1000 + 7 * c: c for c in range(len(experiment.client_specs))})
    state = Path(state_dir) if state_dir is not None else out / "flower" / "state"
    old = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(state)
    try:
        with server_task_identity():
            return serve(grid, out, FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    finally:
        if old is None:
            os.environ.pop(STATE_DIR_ENV, None)
        else:
            os.environ[STATE_DIR_ENV] = old
