"""The ServerApp's round logic and fault policy, in-process: a fake Flower grid (tests/flower_grid.py) that
hands every message, serialised to Flower's wire format and back, to the real ClientApp (no processes, a few
seconds). The process-level tests are in test_flower_deploy.py."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs fedstyle[flower] (flwr not installed)")

from fedstyle.algorithms import METHODS  # noqa: E402
from probes import ExchangeProbe as SharedExchangeProbe  # noqa: E402
from fedstyle.experiments.runner import run_experiment, start_run_dir  # noqa: E402
from fedstyle.runtimes.flower.serverapp import FaultPolicy, SiteError, serve  # noqa: E402
from run_records import evaluations  # noqa: E402
from flower_grid import FakeGrid, server_task_identity  # noqa: E402  (every message over Flower's wire format)


def events(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("event")
            in ("dropout", "rejoin", "join")]


@pytest.fixture(autouse=True)
def task_identity():
    """Flower stamps messages with the process's task identity, which a real ServerApp process has set."""
    with server_task_identity():
        yield


@pytest.fixture(autouse=True)
def site_state(tmp_path, monkeypatch):
    """The sites' state folder of this test (the FakeGrid's nodes have no state-dir node config)."""
    monkeypatch.setenv("FEDSTYLE_SITE_STATE", str(tmp_path / "site-state"))
    return tmp_path / "site-state"


def stored_states(run_dir, num_clients: int) -> list[dict[str, torch.Tensor]]:
    """Each client's newest persisted state on its site."""
    from fedstyle.runtimes.site_state import ClientStateStore, default_state_root

    config_json = json.dumps(json.loads((run_dir / "config.json").read_text()), sort_keys=True)
    return [ClientStateStore.open(default_state_root(), config_json, c).load(10**9)[0] for c in range(num_clients)]


def snapshot_names(run_dir, client: int) -> list[str]:
    from fedstyle.runtimes.site_state import ClientStateStore, default_state_root

    config_json = json.dumps(json.loads((run_dir / "config.json").read_text()), sort_keys=True)
    return [s.path.name.split(".")[0] for s in ClientStateStore.open(default_state_root(), config_json, client).snapshots()]


def snapshot_sessions(run_dir, client: int) -> list[str]:
    from fedstyle.runtimes.site_state import ClientStateStore, default_state_root

    config_json = json.dumps(json.loads((run_dir / "config.json").read_text()), sort_keys=True)
    return [s.session for s in ClientStateStore.open(default_state_root(), config_json, client).snapshots()]


@pytest.fixture
def config(tiny_config):
    return tiny_config.updated(lr_schedule="constant", rounds=3)  # 3 clients (one per source domain)


def test_fake_grid_reproduces_the_simulator(config, tmp_path):
    config = config.updated(method="fedbn", rounds=2)  # per-client state (local BatchNorm) lives on the sites
    run_experiment(config, tmp_path / "sim", quiet=True)
    start_run_dir(config, tmp_path / "flower", quiet=True)
    grid = FakeGrid({101: 2, 102: 0, 103: 1})  # node ids unrelated to client ids
    serve(grid, tmp_path / "flower", FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")
    # in each site's state folder, not in the SuperNode's memory; the simulator's checkpoint holds the same
    from safetensors.torch import load_file

    sim_states = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    for cid, state in enumerate(stored_states(tmp_path / "flower", 3)):
        assert any(k.startswith("local/") for k in state)
        assert all(torch.equal(v, sim_states[f"client/{cid}/{k}"]) for k, v in state.items())
        assert snapshot_names(tmp_path / "flower", cid) == ["r000000-train", "r000001-train"]
    assert not any(c.state.array_records for c in grid.contexts.values())  # nothing kept in Flower's memory


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
    states = stored_states(tmp_path / "flower", 6)
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
    from fedstyle.runtimes.flower.site import SETUP_STORED

    assert SETUP_STORED in grid.contexts[21].state.array_records  # the broadcast came with its first training message
    states = stored_states(tmp_path / "run", 3)
    assert torch.equal(states[1]["bank"], states[0]["bank"])
    assert "received" in states[1]  # and it trained in round 3 with its payload
    # the restarted site's state from round 1 survived on disk (round 3's training left it as it was)
    assert snapshot_names(tmp_path / "run", 1) == ["r000000-train"]


@pytest.mark.parametrize("method", ["feddyn", "fedbn"])
def test_resumed_coordinator_and_restarted_sites_continue_exactly(config, tmp_path, method):
    """The coordinator stops in round 4 while its checkpoint is round 2's and the sites already hold round 3's
    state; everything restarts (new Flower run: empty context.state, new nodes, fresh processes) and resumes
    from the checkpoint: the sites redo round 3 from the state they had before it, the run ends as the
    simulator's, bitwise."""
    from fedstyle.experiments.checkpoint import load_checkpoint
    from fedstyle.runtimes.flower import site

    config = config.updated(method=method, rounds=4, eval_every=2)
    run_experiment(config, tmp_path / "sim", quiet=True)
    out = tmp_path / "flower"
    start_run_dir(config, out, quiet=True)
    grid = FakeGrid({10: 0, 11: 1, 12: 2})

    def crash(g):
        if g.trains == 10:  # round 4's first training message (3 clients per round)
            raise KeyboardInterrupt

    grid.on_train = crash
    with pytest.raises(KeyboardInterrupt):
        serve(grid, out, FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert load_checkpoint(out)[1]["round"] == 2
    assert all(snapshot_names(out, c)[-1] == "r000002-train" for c in range(3))  # ahead of the checkpoint

    site._SITES.clear()  # fresh processes
    serve(FakeGrid({20: 0, 21: 1, 22: 2}), out, FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert evaluations(out) == evaluations(tmp_path / "sim")
    from safetensors.torch import load_file

    sim, flower = load_file(str(tmp_path / "sim" / "checkpoint.safetensors")), load_file(str(out / "checkpoint.safetensors"))
    assert all(torch.equal(v, flower[k]) for k, v in sim.items() if not k.startswith("client/"))
    for cid, state in enumerate(stored_states(out, 3)):
        assert state and all(torch.equal(v, sim[f"client/{cid}/{k}"]) for k, v in state.items())
        # what a resume from the last checkpoint it saw (round 2) needs: round 2's, and the redone rounds;
        # the abandoned round-3 snapshot was replaced by the resumed session's
        assert snapshot_names(out, cid) == ["r000001-train", "r000002-train", "r000003-train"]
        first, redone, last = snapshot_sessions(out, cid)
        assert first != redone == last


def test_deploy_site_passes_its_state_folder(tmp_path, monkeypatch, site_state):
    """`fedstyle deploy site` starts the SuperNode with the partition, the state folder (--state-dir, else
    $FEDSTYLE_SITE_STATE / the per-user one) and the data root in its node config, running this fedstyle."""
    import os
    import sys
    from pathlib import Path

    import fedstyle
    from fedstyle.cli.main import main

    started = []
    monkeypatch.setattr(os, "execv", lambda path, argv: started.append((argv, os.environ["PYTHONPATH"])))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")  # restored after the test (the command sets it)
    assert main(["deploy", "site", "--superlink", "coord:9093", "--insecure", "--partition-id", "2",
                 "--state-dir", str(tmp_path / "st"), "--data-root", str(tmp_path / "data")]) == 0
    assert main(["deploy", "site", "--superlink", "coord:9093", "--insecure", "--partition-id", "0"]) == 0
    (first, pythonpath), (second, _) = started
    if sys.platform.startswith("linux"):  # a warm site around the SuperNode (runtimes/flower/warm_site.py)
        assert first[:3] == [sys.executable, "-m", "fedstyle.runtimes.flower.warm_site"]
    assert "flower-supernode" in first[3 if sys.platform.startswith("linux") else 0]
    config = first[first.index("--node-config") + 1]
    assert config == f'partition-id=2 state-dir="{tmp_path / "st"}" data-root="{tmp_path / "data"}"'
    assert second[second.index("--node-config") + 1] == f'partition-id=0 state-dir="{site_state}"'
    assert pythonpath == os.pathsep.join([str(Path(fedstyle.__file__).resolve().parent.parent), "/elsewhere"])
