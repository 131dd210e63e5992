"""Many clients on one machine: the client-state store (memory budget, files, checkpoints), clients
as rows of one shared sample pool, and ``--data-copies``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedstyle.data.client import ClientData, SamplePool
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import resume_experiment, run_experiment
from fedstyle.federation.star import StarSimulator
from fedstyle.federation.states import (
    MANIFEST_KEY,
    STATES_DIR,
    TENSOR_OVERHEAD,
    ClientStates,
    StateFileError,
    machine_memory,
    parse_budget,
    state_nbytes,
)
from tiny import SETTINGS, TRANSFORM, make_clients, make_model  # tests/tiny.py (not tests.tiny: autorank installs a top-level "tests" package)

#: one state of this test: 1000 float32 values (4,000 bytes) + one tensor's overhead
STATE_BYTES = 4000 + TENSOR_OVERHEAD


def _state(cid: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((1000,), float(cid))}


def _resident_bytes(store: ClientStates, skip: int | None = None) -> int:
    """The bytes of the dicts in memory, counted from outside the store's own bookkeeping."""
    return sum(state_nbytes(store._memory[c]) for c in store.resident_clients if c != skip)


# -- the store --------------------------------------------------------------------------------------
def test_parse_budget():
    assert parse_budget("512MB") == 512 * 10**6
    assert parse_budget("2GiB") == 2 * 2**30
    assert parse_budget("1.5kb") == 1500
    assert parse_budget("0") == 0 and parse_budget("1000") == 1000
    assert parse_budget("unlimited") is None
    assert parse_budget("auto") == int(0.1 * machine_memory()) > 0
    for bad in ("banana", "-1MB", "12 parsecs", "nanMB", ""):
        with pytest.raises(ConfigError, match="--state-budget .* is not a size"):
            parse_budget(bad)


def test_least_recently_used_states_leave_memory_within_the_budget(tmp_path):
    store = ClientStates(10, budget=3 * STATE_BYTES, directory=tmp_path)
    for cid in range(10):
        store[cid].update(_state(cid))
        store.settle()
        assert _resident_bytes(store) <= 3 * STATE_BYTES
    assert store.resident_clients == [7, 8, 9]  # the three most recently used
    assert store.on_disk == 7 and store.spilled == 7
    assert sorted(p.name.split(".")[0] for p in tmp_path.glob("*.safetensors")) == sorted(map(str, range(7)))
    # client 2 comes back from disk, bitwise, and pushes out the least recently used (7)
    assert torch.equal(store[2]["w"], torch.full((1000,), 2.0))
    store.settle()
    assert store.resident_clients == [8, 9, 2] and store.loaded == 1
    # while a client's phase runs, the others fit the budget (its own state is not counted yet)
    state = store[5]
    state["w"] = torch.zeros(5000)  # grows during its phase
    assert _resident_bytes(store, skip=5) <= 3 * STATE_BYTES
    store.settle()
    assert store.resident_clients == []  # its 20,256 bytes exceed the budget alone: everyone leaves
    assert torch.equal(store[5]["w"], torch.zeros(5000))


def test_states_round_trip_bitwise_through_memory_mapped_files(tmp_path):
    original = {
        "f32": torch.randn(3, 5),
        "cl": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "i64": torch.arange(5) * 10**12,
        "u8": torch.arange(3, dtype=torch.uint8),
        "flag": torch.tensor([True, False]),
        "scalar": torch.ones(()),
        "empty": torch.zeros(0, 4),
    }
    store = ClientStates(2, budget=0, directory=tmp_path)
    store[0].update({k: v.clone() for k, v in original.items()})
    store.settle()
    assert store.resident_clients == [] and store.on_disk == 1
    (path,) = tmp_path.glob("0.*.safetensors")
    loaded = store[0]
    assert set(loaded) == set(original)
    for key, value in original.items():
        assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape and torch.equal(loaded[key], value)
    if Path("/proc/self/maps").exists():
        assert str(path) in Path("/proc/self/maps").read_text()  # mapped, not read into memory
    # an in-place change never reaches the file (a private mapping); leaving memory writes a new file
    loaded["f32"].add_(1.0)
    assert torch.equal(load_file(str(path))["f32"], original["f32"])
    store.settle()
    assert not path.exists()  # the old file is no checkpoint's: dropped
    assert torch.equal(store[0]["f32"], original["f32"] + 1.0)


def test_unlimited_budget_never_writes(tmp_path):
    store = ClientStates(50, budget=None, directory=tmp_path)
    for cid in range(50):
        store[cid].update(_state(cid))
        store.settle()
    assert len(store.resident_clients) == 50 and store.spilled == 0 and not list(tmp_path.iterdir())
    assert store.peak_bytes == 50 * STATE_BYTES
    tensors = store.checkpoint_tensors()  # in memory: the checkpoint holds the states, as before the store
    assert MANIFEST_KEY not in tensors and torch.equal(tensors["client/7/w"], torch.full((1000,), 7.0))


def test_checkpoint_files_survive_until_a_later_checkpoint_and_restore_verifies_them(tmp_path):
    store = ClientStates(4, budget=STATE_BYTES, directory=tmp_path)
    for cid in range(4):
        store[cid].update(_state(cid))
        store.settle()
    tensors = store.checkpoint_tensors()  # writes the resident (changed) state too
    assert set(tensors) == {MANIFEST_KEY}
    manifest = json.loads(bytes(tensors[MANIFEST_KEY].numpy()))
    assert sorted(manifest["files"]) == ["0", "1", "2", "3"]
    store.checkpoint_saved()
    listed = {entry[0] for entry in manifest["files"].values()}
    assert {p.name for p in tmp_path.glob("*.safetensors")} == listed

    # after the checkpoint, clients 0 and 1 take turns (1 changes twice): the checkpoint's files stay,
    # and beside them only each client's latest (client 1's in-between file is gone)
    for value in (10.0, 11.0):
        store[1]["w"] = torch.full((1000,), value)
        store.settle()
        store[0]  # handed out: taken as changed, written when it leaves
        store.settle()
    names = {p.name for p in tmp_path.glob("*.safetensors")}
    assert listed <= names and len(names - listed) == 2
    assert sorted(name.split(".")[0] for name in names - listed) == ["0", "1"]
    assert store.spilled == 3 + 3  # 0, 1, 2 before the checkpoint; then 1, 0, 1

    # a resumed process restores the checkpoint: the file written after it is deleted, the states are the checkpoint's
    fresh = ClientStates(4, budget=STATE_BYTES, directory=tmp_path)
    fresh.restore(tensors)
    assert {p.name for p in tmp_path.glob("*.safetensors")} == listed
    assert [float(fresh[c]["w"][0]) for c in range(4)] == [0.0, 1.0, 2.0, 3.0]

    # a damaged file is refused, naming the client
    victim = tmp_path / manifest["files"]["2"][0]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(StateFileError, match="client 2's state file .* is damaged"):
        ClientStates(4, budget=STATE_BYTES, directory=tmp_path).restore(tensors)
    victim.unlink()
    with pytest.raises(StateFileError, match="client 2's state file .* is missing"):
        ClientStates(4, budget=STATE_BYTES, directory=tmp_path).restore(tensors)


# -- the simulator ----------------------------------------------------------------------------------
def _train(method: str, hp: dict, budget: int | None, rounds: int = 3, watch=None):
    clients = make_clients(6)
    algo, model = make_model(method, hp, n_clients=6)
    settings = SETTINGS.__class__(**{**SETTINGS.__dict__, "rounds": rounds, "clients_per_round": 2})
    sim = StarSimulator(algo, model, clients, settings, seed=0, device=torch.device("cpu"), state_budget=budget)
    if watch is not None:
        original = algo.local_train

        def local_train(ctx, model, payload):
            watch(sim, ctx.client_id)
            return original(ctx, model, payload)

        algo.local_train = local_train
    sim.setup()
    for r in range(rounds):
        sim.run_round(r)
        if budget is not None:
            assert _resident_bytes(sim.client_states) <= budget  # between rounds
    return sim


@pytest.mark.parametrize("method,hp", [("feddyn", {}), ("fedbn", {"style": "mixstyle"})])
def test_spilling_states_to_disk_changes_no_bit(method, hp):
    reference = _train(method, hp, budget=None)
    one_state = max(state_nbytes(reference.client_states[c]) for c in reference.client_states.resident_clients)
    budget = one_state + 1  # room for one client's state between phases

    def watch(sim, cid):  # during a client's phase, the others fit the budget
        assert _resident_bytes(sim.client_states, skip=cid) <= budget

    spilled = _train(method, hp, budget=budget, watch=watch)
    assert spilled.client_states.spilled > 0 and spilled.client_states.loaded > 0
    for key, value in reference.server.weights.items():
        assert torch.equal(value, spilled.server.weights[key]), key
    for cid in range(6):  # every client's state, wherever it lives
        mine, theirs = reference.client_states[cid], spilled.client_states[cid]
        assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


# -- runs -------------------------------------------------------------------------------------------
def _evaluations(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows if "event" not in r]


def _interrupt_at(monkeypatch, round_index: int):
    original = StarSimulator.run_round

    def interrupted(self, r):
        if r == round_index:
            raise KeyboardInterrupt
        return original(self, r)

    monkeypatch.setattr(StarSimulator, "run_round", interrupted)
    return lambda: monkeypatch.setattr(StarSimulator, "run_round", original)


@pytest.fixture
def feddyn_config(tiny_config):
    return tiny_config.updated(method="feddyn", partition="per_domain", clients=6, clients_per_round=2, rounds=5,
                               lr_schedule="constant")


def test_resume_with_states_on_disk_equals_uninterrupted(feddyn_config, tmp_path, monkeypatch):
    full = run_experiment(feddyn_config.updated(state_budget="unlimited"), tmp_path / "full", quiet=True)
    # states spill after every phase; a checkpoint every second round, the kill after round 3 (spilled
    # after the round-2 checkpoint: those files must not leak into the resumed run)
    config = feddyn_config.updated(state_budget="0", eval_every=2)
    restore = _interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", quiet=True)
    restore()
    resumed = resume_experiment(tmp_path / "cut", quiet=True)
    assert resumed["targets"] == full["targets"]
    assert _evaluations(tmp_path / "cut") == [r for r in _evaluations(tmp_path / "full") if r["round"] in (2, 4, 5)]

    inline = load_file(str(tmp_path / "full" / "checkpoint.safetensors"))
    spilled = load_file(str(tmp_path / "cut" / "checkpoint.safetensors"))
    for key in (k for k in inline if k.startswith("global/") or k.startswith("server/")):
        assert torch.equal(inline[key], spilled[key]), key
    # the in-memory run's checkpoint holds the states; the spilling run's lists their files
    assert not any(k.startswith("client/") for k in spilled) and MANIFEST_KEY in spilled
    manifest = json.loads(bytes(spilled[MANIFEST_KEY].numpy()))
    states = tmp_path / "cut" / STATES_DIR
    assert {p.name for p in states.iterdir()} == {entry[0] for entry in manifest["files"].values()}  # nothing else
    for cid, (name, _, _) in manifest["files"].items():
        on_disk = load_file(str(states / name))
        assert set(on_disk) == {k.split("/", 2)[2] for k in inline if k.startswith(f"client/{cid}/")}
        assert all(torch.equal(v, inline[f"client/{cid}/{k}"]) for k, v in on_disk.items())


def test_resume_may_change_the_state_budget(feddyn_config, tmp_path, monkeypatch):
    full = run_experiment(feddyn_config, tmp_path / "full", quiet=True)
    restore = _interrupt_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(feddyn_config, tmp_path / "cut", quiet=True)
    restore()
    resumed = resume_experiment(tmp_path / "cut", quiet=True, state_budget="0")  # in memory -> on disk
    assert resumed["targets"] == full["targets"]
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["state_budget"] == "auto"  # the run's own
    with pytest.raises(ConfigError, match="resuming cannot change 'clients'"):
        resume_experiment(tmp_path / "cut", quiet=True, clients=3)


def test_settings_are_checked_before_anything_is_written(tiny_config, tmp_path):
    cases = [
        (dict(state_budget="lots"), "--state-budget 'lots' is not a size"),
        (dict(ray_address="auto"), "--ray-address only apply to --backend flower-sim"),
        (dict(client_cpus=2.0, client_gpus=0.5), "--client-cpus, --client-gpus only apply to --backend flower-sim"),
        (dict(backend="flower-sim", ray_address="my cluster"), "is not auto, local or HOST:PORT"),
        (dict(backend="flower-sim", client_cpus=0.0), "--client-cpus must be positive"),
        (dict(data_copies=0), "--data-copies must be at least 1"),
    ]
    for changes, message in cases:
        with pytest.raises(ConfigError, match=message):
            run_experiment(tiny_config.updated(**changes), tmp_path / "x", quiet=True)
        assert not (tmp_path / "x").exists()


# -- data -------------------------------------------------------------------------------------------
def test_clients_are_rows_of_one_shared_pool(tiny_config):
    from fedstyle.experiments.build import build_experiment

    exp = build_experiment(tiny_config.updated(partition="dirichlet", clients=5, alpha=1.0), progress=False)
    clients = exp.simulator.clients
    pool = clients[0].pool
    assert all(c.pool is pool for c in clients)
    assert len(pool) == sum(len(idx) for idx in exp.split.train.values())  # the training samples, once
    for data, spec in zip(clients, exp.client_specs):
        # what each client used to copy for itself: its images, domain by domain, in index order
        images = torch.cat([exp.dataset.images[d][idx] for d, idx in spec.indices.items()])
        labels = torch.cat([exp.dataset.labels[d][idx] for d, idx in spec.indices.items()])
        domains = torch.cat([torch.full((len(idx),), exp.dataset.domains.index(d)) for d, idx in spec.indices.items()])
        assert torch.equal(data.images, images) and torch.equal(data.labels, labels)
        assert torch.equal(data.domains, domains)
        assert data.rows.dtype == torch.long and len(data) == len(images)
        own = [v for v in vars(data).values() if isinstance(v, torch.Tensor)]
        assert own == [data.rows]  # the client keeps its row indices, no image copy
        # and its batches are those of a client owning a copy, bit for bit
        copy = ClientData(images, labels, domains, data.transform)
        for (x, y, d), (x2, y2, d2) in zip(data.batches(4, torch.Generator().manual_seed(1), torch.device("cpu"), 5),
                                           copy.batches(4, torch.Generator().manual_seed(1), torch.device("cpu"), 5)):
            assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(d, d2)


def test_pool_clients_replace_and_views_stay_their_own():
    pool = SamplePool(torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 2, 2).contiguous(),
                      torch.arange(10), torch.zeros(10, dtype=torch.long))
    a = ClientData.from_pool(pool, torch.tensor([7, 2, 2]), TRANSFORM)
    b = ClientData.from_pool(pool, torch.tensor([1, 3]), TRANSFORM)
    assert a.labels.tolist() == [7, 2, 2] and a.images[:, 0, 0, 0].tolist() == [7, 2, 2]
    a.set_view("v", a.images + 100)
    a.replace(torch.full((2, 3, 2, 2), 50, dtype=torch.uint8), torch.tensor([2, 0]))  # CCST-style
    assert a.labels.tolist() == [2, 7] and a.views["v"][:, 0, 0, 0].tolist() == [102, 107]
    assert a.rows is None and a.pool is not pool
    assert b.labels.tolist() == [1, 3] and pool.images[:, 0, 0, 0].tolist() == list(range(10))  # untouched
    with pytest.raises(ConfigError, match=r"client rows must lie in \[0, 10\)"):
        ClientData.from_pool(pool, torch.tensor([10]), TRANSFORM)


def test_take_gathers_the_asked_samples_of_pool_and_owned_clients():
    pool = SamplePool(torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 2, 2).contiguous(),
                      torch.arange(10) + 100, torch.zeros(10, dtype=torch.long))
    client = ClientData.from_pool(pool, torch.tensor([7, 2, 2, 9, 4]), TRANSFORM)
    images, labels = client.take(slice(1, 4))
    assert images[:, 0, 0, 0].tolist() == [2, 2, 9] and labels.tolist() == [102, 102, 109]
    images, labels = client.take(torch.tensor([4, 0]))
    assert images[:, 0, 0, 0].tolist() == [4, 7] and labels.tolist() == [104, 107]
    owned = ClientData(pool.images, pool.labels, pool.domains, TRANSFORM)
    images, labels = owned.take(slice(8, 20))  # a slice past the end stops at the last sample, as images[8:20]
    assert images[:, 0, 0, 0].tolist() == [8, 9] and labels.tolist() == [108, 109]


def test_data_copies_deal_every_training_sample_k_times(tiny_config):
    from fedstyle.data import load_dataset
    from fedstyle.partition import make_partition, make_split

    dataset = load_dataset("folder", data_root=tiny_config.data_root, resolution=16, progress=False)
    split = make_split(dataset, "lodo", targets=["grey"], val_fraction=0.1, seed=0)
    default = make_partition("lambda", split, dataset, num_clients=4, seed=3)
    one_copy = make_partition("lambda", split, dataset, num_clients=4, seed=3, copies=1)
    assert all(a.indices.keys() == b.indices.keys() and all(torch.equal(a.indices[d], b.indices[d]) for d in a.indices)
               for a, b in zip(default, one_copy))
    train = sum(len(idx) for idx in split.train.values())
    with pytest.raises(ConfigError, match="more --data-copies"):
        make_partition("lambda", split, dataset, num_clients=train + 10, seed=3)
    specs = make_partition("lambda", split, dataset, num_clients=train + 10, seed=3, copies=3)
    assert len(specs) == train + 10 and all(s.size >= 1 for s in specs)
    for domain, idx in split.train.items():
        dealt = torch.cat([s.indices[domain] for s in specs if domain in s.indices])
        assert torch.equal(torch.bincount(dealt, minlength=int(idx.max()) + 1)[idx], torch.full((len(idx),), 3))
