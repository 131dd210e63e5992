"""A site's per-client state store (fedstyle.runtimes.site_state): snapshots by step, loading the newest
before a message, pruning by session and checkpoint, atomic writes. No Flower, no processes."""

from __future__ import annotations

import pytest
import torch

from fedstyle.runtimes.site_state import (
    ClientStateStore,
    Session,
    StateStoreError,
    default_state_root,
    round_of,
    run_key,
    same_state,
    step_of,
)

A = Session("aaaa", start_round=0, durable_round=0)


def state(value: float) -> dict[str, torch.Tensor]:
    """A state like FedDyn's plus FedBN's local layers: float, int and bool tensors."""
    return {"grad": torch.full((2, 3), value), "local/bn.num_batches_tracked": torch.tensor(int(value)),
            "meta/initialised": torch.ones(()), "mask": torch.tensor([True, value > 1])}


def names(store: ClientStateStore) -> list[str]:
    return [s.path.name for s in store.snapshots()]


def test_steps_order_the_messages_of_a_client():
    order = [step_of("setup_upload", -1), step_of("setup_download", -1), step_of("round_query", 0),
             step_of("train", 0), step_of("round_query", 1), step_of("train", 1), step_of("train", 7)]
    assert order == [-2, -1, 0, 1, 2, 3, 15]
    assert [round_of(s) for s in order] == [-1, -1, 0, 0, 1, 1, 7]


def test_layout_and_run_key(tmp_path, monkeypatch):
    store = ClientStateStore.open(tmp_path, '{"method": "feddyn", "seed": 0}', 3)
    assert store.folder == tmp_path / run_key('{"method": "feddyn", "seed": 0}') / "client-3"
    assert run_key('{"seed": 0}') != run_key('{"seed": 1}') and run_key("x").startswith("run-") and len(run_key("x")) == 20
    monkeypatch.setenv("FEDSTYLE_SITE_STATE", str(tmp_path / "here"))
    assert default_state_root() == tmp_path / "here"
    monkeypatch.delenv("FEDSTYLE_SITE_STATE")
    assert default_state_root().name == "sites" and "fedstyle" in str(default_state_root())


def test_save_then_load_the_newest_before_a_step(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    assert store.load(step_of("train", 0)) == ({}, None)  # nothing yet: a fresh client
    store.save(step_of("setup_download", -1), "aaaa", state(0.0))
    store.save(step_of("train", 0), "aaaa", state(1.0))
    store.save(step_of("train", 2), "aaaa", state(3.0))  # not sampled in round 1
    assert names(store) == ["setup-download.aaaa.safetensors", "r000000-train.aaaa.safetensors",
                            "r000002-train.aaaa.safetensors"]
    loaded, snap = store.load(step_of("train", 2))  # redoing round 2: the state after round 0
    assert snap.step == 1 and same_state(loaded, state(1.0))
    assert all(loaded[k].dtype == v.dtype for k, v in state(1.0).items())  # bitwise, dtypes kept
    assert same_state(store.load(step_of("train", 1))[0], state(1.0))
    assert same_state(store.load(step_of("round_query", 3))[0], state(3.0))
    assert same_state(store.load(step_of("train", 0))[0], state(0.0))  # round 0 sees what the setup left
    assert store.load(step_of("setup_download", -1)) == ({}, None)


def test_query_and_train_of_one_round_are_two_steps(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    store.save(step_of("train", 0), "aaaa", state(1.0))
    store.save(step_of("round_query", 1), "aaaa", state(2.0))
    assert same_state(store.load(step_of("train", 1))[0], state(2.0))  # training sees the query's change
    assert same_state(store.load(step_of("round_query", 1))[0], state(1.0))


def test_a_resumed_coordinator_abandons_the_future_it_redoes(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    for step, value in [(-2, -2.0), (-1, -1.0), (1, 1.0), (3, 2.0), (5, 3.0), (7, 4.0)]:
        store.save(step, "aaaa", state(value))
    # session bbbb resumed from the checkpoint after round 2 (rounds 0, 1 done): rounds 2, 3 are redone
    b = Session("bbbb", start_round=2, durable_round=2)
    removed = store.prune(b, durable=False)
    assert sorted(p.name for p in removed) == ["r000002-train.aaaa.safetensors", "r000003-train.aaaa.safetensors"]
    assert same_state(store.load(step_of("train", 2), "bbbb")[0], state(2.0))  # after round 1, not round 2's
    store.save(step_of("train", 2), "bbbb", state(30.0))
    assert same_state(store.load(step_of("train", 3), "bbbb")[0], state(30.0))
    # its later messages prune again: its own snapshots stay
    assert store.prune(Session("bbbb", 2, 2), durable=False) == []
    # a later session that starts over (a new run with the same config) drops every round of the others
    store.prune(Session("cccc", 0, 0), durable=False)
    assert names(store) == ["setup-upload.aaaa.safetensors", "setup-download.aaaa.safetensors"]


def test_durable_round_keeps_only_what_a_resume_can_need(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    for step, value in [(-2, -2.0), (-1, -1.0), (1, 1.0), (3, 2.0), (7, 4.0), (9, 5.0)]:
        store.save(step, "aaaa", state(value))
    # the setup exchange never prunes with the durable round (a resumed one reruns from step -2)
    assert store.prune(Session("aaaa", 0, 4), durable=False) == []
    store.prune(Session("aaaa", 0, 4))  # checkpoint after round 4: the newest before it is round 3's
    assert names(store) == ["r000003-train.aaaa.safetensors", "r000004-train.aaaa.safetensors"]
    assert same_state(store.load(step_of("train", 4))[0], state(4.0))  # a resume from round 4 still works
    store.prune(Session("aaaa", 0, 9))
    assert names(store) == ["r000004-train.aaaa.safetensors"]  # nothing newer: the last one stays


def test_writes_are_atomic(tmp_path, monkeypatch):
    import safetensors.torch

    store = ClientStateStore(tmp_path / "c")
    store.save(step_of("train", 0), "aaaa", state(1.0))
    real = safetensors.torch.save_file

    def dies_halfway(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(10)  # a partial file ...
        raise OSError("disk full")  # ... and the write fails

    monkeypatch.setattr(safetensors.torch, "save_file", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        store.save(step_of("train", 0), "bbbb", state(9.0))
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert names(store) == ["r000000-train.aaaa.safetensors"]  # the old snapshot, intact; no partial one
    assert same_state(store.load(step_of("train", 1))[0], state(1.0))
    assert not list(store.folder.glob(".*.tmp"))
    # a write killed before its rename leaves a temporary file: never read, removed by the next prune
    (store.folder / ".r000001-train.aaaa.safetensors.x1.tmp").write_bytes(b"half")
    assert names(store) == ["r000000-train.aaaa.safetensors"]
    store.prune(A)
    assert not list(store.folder.glob(".*.tmp"))


def test_same_step_replaces_and_prefers_the_current_session(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    store.save(-1, "aaaa", state(1.0))
    store.save(-1, "bbbb", state(1.0))  # a resumed coordinator reruns the setup exchange
    assert names(store) == ["setup-download.bbbb.safetensors"]
    # two of a step (a kill between a write and the removal of the old one): the current session's wins
    store.save(1, "aaaa", state(5.0))
    (store.folder / "r000000-train.bbbb.safetensors").write_bytes((store.folder / "r000000-train.aaaa.safetensors").read_bytes())
    assert store.latest_before(2, "bbbb").session == "bbbb" and store.latest_before(2, "aaaa").session == "aaaa"


def test_unreadable_snapshot_names_the_folder(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    store.folder.mkdir(parents=True)
    (store.folder / "r000000-train.aaaa.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(StateStoreError, match="delete .*client's state afresh"):
        store.load(step_of("train", 1))


def test_same_state_is_bitwise():
    assert same_state(state(1.0), state(1.0))
    assert not same_state(state(1.0), state(2.0))
    assert not same_state({"a": torch.zeros(2)}, {"a": torch.zeros(2, dtype=torch.float64)})
    assert not same_state({"a": torch.zeros(2)}, {"a": torch.zeros(2), "b": torch.zeros(1)})
    assert same_state({}, {})


def test_loaded_tensors_are_aligned_like_torchs_own():
    """A CPU dot product rounds differently at another alignment (BLAS peels leading elements): loaded state
    must sit where torch itself would allocate it, or FedDyn's <grad, w> drifts from the simulator's."""
    from fedstyle.io import aligned

    torch.manual_seed(0)
    a, b = torch.randn(100003), torch.randn(100003)
    buffer = torch.empty(100003 + 1)
    shifted = buffer[1:]
    shifted.copy_(a)
    assert shifted.data_ptr() % 64 and aligned(shifted).data_ptr() % 64 == 0
    assert torch.equal(aligned(shifted), a) and torch.dot(aligned(shifted), b).item() == torch.dot(a, b).item()
    assert aligned(a) is a  # no copy when already aligned


def test_store_loads_aligned_tensors(tmp_path):
    store = ClientStateStore(tmp_path / "c")
    store.save(1, "aaaa", {f"t{i}": torch.randn(5 + i) for i in range(6)})  # odd sizes: unaligned offsets in the file
    loaded, _ = store.load(2)
    assert all(v.data_ptr() % 64 == 0 for v in loaded.values())
