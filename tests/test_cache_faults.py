"""Issue 39, sections 2-4 and 7: a stylization cache that is damaged, on a full disk, or read-only; a full
disk at the checkpoint and at the run's other files. The filesystem faults are real where this process
may mount, else raised where the kernel raises them (tests/fs_faults.py)."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedstyle.data.rowstore import flush_all
from fs_faults import SmallDisk, fd_under, read_only_copy
from test_ccst import fresh_cache  # noqa: F401  (an empty cache per test)
from test_lazy_stylize import lazy_stores, simulator

HP = {"style_backend": "fake_tag", "k": 2}
OTHER = {**HP, "style_images": 12}  # another style sample: no client style file, no image entry in the cache


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    disk = SmallDisk(tmp_path / "disk", monkeypatch)
    yield disk
    disk.close()


def trained(hp, steps):
    sim = simulator("ccst", hp, steps=steps)
    info = sim.setup()
    sim.run_round(0)
    return sim, info


def same_weights(a, b) -> bool:
    return all(torch.equal(v, b.server.weights[k]) for k, v in a.server.weights.items())


def entries(root: Path) -> list[Path]:
    return sorted((root / "ccst").iterdir())


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- 2: a damaged entry is made again, never used ----------------------------------------------------
def test_damaged_rows_and_client_styles_are_made_again_never_trained_on(tmp_path, monkeypatch, capsys):
    """A flipped pixel in a made row, a row marked made whose pixels never reached the disk, and a client
    style whose tensor bytes were flipped but still parse: the run trains as on a fresh cache."""
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "fresh"))
    reference, _ = trained(HP, steps=3)
    flush_all()
    read_by_reference = {e.name: np.load(e / "made.npy") != 0 for e in entries(tmp_path / "fresh")}
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    trained(HP, steps=1)  # the cache to damage: the rows of one step
    flush_all()
    damaged = {}
    for entry in entries(tmp_path / "cache"):
        images = np.load(entry / "images.npy", mmap_mode="r+")
        made = np.load(entry / "made.npy", mmap_mode="r+")
        done = np.flatnonzero(made != 0)
        unwritten = np.setdiff1d(np.flatnonzero(read_by_reference[entry.name]), done)[0]  # read by 3 steps only
        images[done[0], 1, 2, 3] ^= 0x5A  # a flipped pixel in a made row
        made[unwritten] = made[done[1]]  # marked made, its pixels never written (zeros)
        images.flush(), made.flush()
        damaged[entry.name] = (done[0], unwritten)
    style = sorted((tmp_path / "cache" / "client_styles").glob("*.safetensors"))[0]
    data = bytearray(style.read_bytes())
    data[-2] ^= 0x40  # the float32 tag's top mantissa bit: it moves by a quarter or more, and still parses
    style.write_bytes(bytes(data))
    capsys.readouterr()

    again, _ = trained(HP, steps=3)
    assert same_weights(again, reference)  # before issue 39: trained on the damaged pixels and style
    from fedstyle.data.rowstore import row_sums

    flush_all()

    for entry in entries(tmp_path / "cache"):
        images, made = np.load(entry / "images.npy"), np.load(entry / "made.npy")
        rows = np.flatnonzero(made != 0)
        assert np.array_equal(row_sums(images[rows]), made[rows])  # the entry is whole again
        assert all(made[r] != 0 for r in damaged[entry.name])
    assert sum(s.count.repaired for s in lazy_stores(again)) == 2 * len(damaged)
    err = capsys.readouterr().err
    assert "does not match its checksum" in err and str(style) in err
    assert err.count("damaged image(s) in the style cache") == len(damaged)  # one line per entry, not per batch


def test_eager_setup_checks_every_row_and_remakes_the_damaged(tmp_path, monkeypatch):
    eager = {**HP, "stylize": "eager"}
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "fresh"))
    reference = simulator("ccst", eager)
    reference.setup()
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    simulator("ccst", eager).setup()
    for entry in entries(tmp_path / "cache"):
        images = np.load(entry / "images.npy", mmap_mode="r+")
        images[0, 0, 0, 0] ^= 1  # one bit
        images[5] = 0  # a power loss: the mark reached the disk, the pixels did not
        images.flush()
    again = simulator("ccst", eager)
    info = again.setup()
    for a, b in zip(reference.clients, again.clients):
        assert torch.equal(a.images, b.images)
    assert info["cache_hits"] == 3 and info["repaired_images"] == 2 * 3


def test_pixels_are_durable_before_the_marks_that_vouch_for_them(monkeypatch):
    """Rows are written with pwrite, and their marks only after an fdatasync of the pixels: every
    FLUSH_SECONDS (here: each batch) and when asked."""
    calls = []
    real_pwrite, real_sync = os.pwrite, os.fdatasync
    cache = os.environ["FEDSTYLE_CACHE"]
    # Only this test's cache counts: a store left by an earlier test in this worker may be collected
    # (and so flushed) while this one runs, which once put its sync and mark first in the record.
    gc.collect()
    flush_all()

    def record(kind, fd):
        if fd_under(fd, cache):
            calls.append((kind, Path(os.readlink(f"/proc/self/fd/{fd}")).name))

    def pwrite(fd, data, offset):
        record("write", fd)
        return real_pwrite(fd, data, offset)

    def fdatasync(fd):
        record("sync", fd)
        return real_sync(fd)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    import fedstyle.data.rowstore as rowstore

    monkeypatch.setattr(rowstore, "FLUSH_SECONDS", 0.0)
    trained(HP, steps=1)
    monkeypatch.setattr(rowstore, "FLUSH_SECONDS", 3600.0)
    trained(HP, steps=3)  # two more batches per client, their marks pending ...
    assert calls, "rows must be written with pwrite (a full disk raises), not through a shared memory map"
    assert calls[-1] == ("write", "images.npy")
    pending = len(calls)
    flush_all()  # ... until asked (or the process exits, or the store is collected)
    assert calls[pending:] and calls[pending] == ("sync", "images.npy") and calls[-1] == ("write", "made.npy")
    for i, call in enumerate(calls):
        if call == ("write", "made.npy"):  # a mark: the pixels before it are synced, none written since
            last_sync = max(j for j, c in enumerate(calls[:i]) if c == ("sync", "images.npy"))
            assert ("write", "images.npy") not in calls[last_sync:i]
            assert ("write", "images.npy") in calls[:last_sync]


# -- 3: a full disk ------------------------------------------------------------------------------------
def test_stylization_opens_no_writable_shared_map(monkeypatch):
    """A write through a shared memory map into a sparse file is a SIGBUS on a full disk: none is made."""
    import mmap

    real = mmap.mmap
    cache = os.environ["FEDSTYLE_CACHE"]

    def guarded(fileno, length, *args, access=mmap.ACCESS_DEFAULT, **kwargs):
        if access in (mmap.ACCESS_WRITE, mmap.ACCESS_DEFAULT) and fd_under(fileno, cache):
            raise AssertionError(f"a writable shared map of {os.readlink(f'/proc/self/fd/{fileno}')}")
        return real(fileno, length, *args, access=access, **kwargs)

    monkeypatch.setattr(mmap, "mmap", guarded)
    trained(HP, steps=2)
    simulator("ccst", {**HP, "stylize": "eager"}).setup()


def test_a_full_disk_during_stylization_is_one_line_naming_the_cache_and_the_room(small_disk, monkeypatch):
    from fedstyle.errors import FedstyleError

    monkeypatch.setenv("FEDSTYLE_CACHE", str(small_disk.path))
    sim = simulator("ccst", HP, steps=2)
    sim.setup()  # the client styles and the empty (sparse) entries
    small_disk.fill()
    with pytest.raises(FedstyleError) as lazy:  # before issue 39: SIGBUS, the process killed without a word
        sim.run_round(0)
    with pytest.raises(FedstyleError) as eager:  # eager mode: refused before any work when it cannot fit
        simulator("ccst", {**HP, "stylize": "eager"}).setup()
    for err in (lazy, eager):
        message = str(err.value)
        assert "\n" not in message and f"style cache {small_disk.path / 'ccst'}" in message
        assert "no space left on device" in message and "need up to" in message and "free" in message
    small_disk.free()
    again, _ = trained(HP, steps=2)  # room again: the same setting runs, and its rows are whole
    monkeypatch.setenv("FEDSTYLE_CACHE", str(small_disk.path.parent / "fresh"))
    assert same_weights(again, trained(HP, steps=2)[0])


@pytest.mark.parametrize("stylize", ["lazy", "eager"])
def test_a_full_disk_run_leaves_no_out_and_the_same_command_runs_after(stylize, tiny_root, tmp_path, small_disk,
                                                                       monkeypatch, capsys):
    from fedstyle.cli.main import main
    from fedstyle.experiments.build import build_experiment
    from fedstyle.experiments.config import RunConfig

    monkeypatch.setenv("FEDSTYLE_CACHE", str(small_disk.path))
    args = ["run", "--method", "ccst", "--hp", "style_backend=fft", "--hp", f"stylize={stylize}", "--dataset", "folder",
            "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey", "--rounds", "1",
            "--local-steps", "1", "--batch-size", "8", "--min-client-size", "2", "--quiet", "--out",
            str(tmp_path / "run")]
    build_experiment(RunConfig(dataset="folder", data_root=str(tiny_root), resolution=16, targets=["grey"],
                               min_client_size=2), progress=False)  # the dataset is in the cache already
    small_disk.fill(room=96 * 1024)
    capsys.readouterr()
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedstyle: error: no space left on device in the style cache "
                                                   f"{small_disk.path}"), lines
    assert not (tmp_path / "run").exists()  # nothing half-made that blocks the same command
    small_disk.free()
    assert main(args) == 0 and (tmp_path / "run" / "done").exists()


def test_a_full_disk_at_the_checkpoint_is_one_line_and_the_old_checkpoint_stays(small_disk):
    from fedstyle.experiments.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    run = small_disk.path / "run"
    run.mkdir()
    save_checkpoint(run, {"w": torch.arange(10.0)}, {"round": 1})
    before = (run / "checkpoint.safetensors").read_bytes()
    small_disk.fill()
    with pytest.raises(CheckpointError) as err:  # before issue 39: a SafetensorError traceback
        save_checkpoint(run, {"w": torch.arange(200_000.0)}, {"round": 2})
    message = str(err.value)
    assert "\n" not in message and f"checkpoint {run / 'checkpoint.safetensors'}" in message
    assert "no space left on device" in message and "800.0 kB" in message and f"--resume {run}" in message
    assert (run / "checkpoint.safetensors").read_bytes() == before and load_checkpoint(run)[1]["round"] == 1
    assert [p.name for p in run.iterdir()] == ["checkpoint.safetensors"]  # no temporary left


def test_no_space_left_on_device_names_the_file_it_was_writing(tmp_path):
    """A file object's write on a full disk raises "No space left on device" naming no file (/dev/full
    fails every write so): the run's own files name theirs, which the CLI's one line prints (section 7)."""
    from fedstyle.io import append_line, atomic_write

    full = open("/dev/full", "w")
    try:
        with pytest.raises(OSError) as err:  # metrics.jsonl's rows
            append_line(full, "{}\n")
        assert err.value.errno == errno.ENOSPC and err.value.filename == "/dev/full"
        summary = tmp_path / "summary.json"
        with pytest.raises(OSError) as err:  # config.json, summary.json, done, ...
            atomic_write(summary, lambda tmp: (full.write("{}"), full.flush()))
        assert err.value.errno == errno.ENOSPC and err.value.filename == str(summary)
        assert list(tmp_path.iterdir()) == []  # no temporary left
    finally:
        with contextlib.suppress(OSError):  # what is still buffered fails again
            full.close()


# -- 4: a read-only cache ------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["erofs", "eacces"])
def test_a_read_only_cache_is_read_and_what_it_lacks_made_in_memory(code, tmp_path, monkeypatch, capsys):
    """Lazy, with an entry (partly made) and without one (and without the client style's file): trained as on
    a writable cache, and nothing written."""
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "fresh"))
    reference, other_reference = trained(HP, steps=3)[0], trained(OTHER, steps=1)[0]
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    trained(HP, steps=1)  # an entry with the rows of one step
    flush_all()
    before = snapshot(tmp_path / "cache")
    capsys.readouterr()
    with read_only_copy(tmp_path / "cache", tmp_path / "ro", monkeypatch, code) as ro:
        monkeypatch.setenv("FEDSTYLE_CACHE", str(ro))
        with_entry, info = trained(HP, steps=3)  # before issue 39 (EROFS): OSError, the run failed
        without, _ = trained(OTHER, steps=1)
        after = snapshot(ro)
    assert info["cached_images"] > 0 and info["style_cache_hits"] == 3
    assert same_weights(with_entry, reference) and same_weights(without, other_reference)
    assert after == before  # nothing written
    err = capsys.readouterr().err
    assert err.count(f"the style cache {ro} cannot be written") == 1, err  # one line, not one per client


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["erofs", "eacces"])
def test_eager_stylization_into_a_read_only_cache_returns_the_images_it_made(code, tmp_path, monkeypatch):
    eager, other = {**HP, "stylize": "eager"}, {**OTHER, "stylize": "eager"}
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "fresh"))
    references = [simulator("ccst", hp) for hp in (eager, other)]
    for sim in references:
        sim.setup()
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    trained(HP, steps=1)  # an entry with a few rows made
    with read_only_copy(tmp_path / "cache", tmp_path / "ro", monkeypatch, code) as ro:
        monkeypatch.setenv("FEDSTYLE_CACHE", str(ro))
        runs = [simulator("ccst", hp) for hp in (eager, other)]  # with the entry, without it
        for sim in runs:
            sim.setup()
    for reference, run in zip(references, runs):
        for a, b in zip(reference.clients, run.clients):
            assert torch.equal(a.images, b.images)
