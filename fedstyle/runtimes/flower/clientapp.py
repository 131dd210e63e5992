"""The Flower ClientApp: one site (one client of the run's partition) answering the ServerApp.

The handlers are thin: ``identify`` answers from the node config alone (no torch, no data — a
deployment runs every message in a fresh process, and the identify exchange at the start would
otherwise import torch and rebuild the run on every site just to say which client it holds); the
others hand the message to :mod:`.site`, which rebuilds the run, loads the client's persistent
state from the site's state folder and runs the simulator's client procedure (see there).
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedstyle.allocator import keep_freed_memory
from fedstyle.runtimes.flower import quiet_flower_noise
from fedstyle.runtimes.flower.node_config import client_id_of
from fedstyle.runtimes.flower.processes import die_with_owner

_META = "fedstyle"  # = records.META (records imports torch)

quiet_flower_noise()  # also in Ray's actors, which import this module to run the ClientApp
die_with_owner()  # a local site's ClientApp process stops with `fedstyle deploy` (it writes the site's state)
keep_freed_memory()  # the site's training reuses its freed activations (fedstyle/allocator.py)
app = ClientApp()


@app.query("identify")
def identify(message: Message, context: Context) -> Message:
    """Which client this node holds (the ServerApp maps node ids to client ids with it)."""
    meta = message.content.config_records[_META]
    cid = client_id_of(context, int(meta["num_clients"]))
    reply = RecordDict({_META: ConfigRecord({"client_id": cid, "round": int(meta["round"])})})
    return Message(reply, reply_to=message)


@app.query("setup_upload")
def setup_upload(message: Message, context: Context) -> Message:
    started = time.perf_counter()
    from fedstyle.runtimes.flower import site

    return site.setup_upload(message, context, started)


@app.query("setup_download")
def setup_download(message: Message, context: Context) -> Message:
    started = time.perf_counter()
    from fedstyle.runtimes.flower import site

    return site.setup_download(message, context, started)


@app.query("round_query")
def round_query(message: Message, context: Context) -> Message:
    started = time.perf_counter()
    from fedstyle.runtimes.flower import site

    return site.round_query(message, context, started)


@app.train()
def train(message: Message, context: Context) -> Message:
    started = time.perf_counter()
    from fedstyle.runtimes.flower import site

    return site.train(message, context, started)
