"""Issue 54: the cache's memory does not grow with the dataset, a per-class run writes only its pick,
a cache that cannot fit the disk is refused before anything is written, and worker processes build the
same bytes as one process."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedstyle.data import fashion4, folder
from fedstyle.data.cache import ChunkedImages, cached_dataset, decode_workers, ordered_map
from fedstyle.data.registry import load_dataset
from fedstyle.errors import ConfigError, DataError
from fs_faults import fd_under
from test_data_fashion4 import write_fashion


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDSTYLE_DECODE_WORKERS", raising=False)
    return tmp_path / "cache"


def entry_bytes(root: Path) -> dict[str, int]:
    """Bytes of image files per cache entry (allocated blocks: a sparse or reserved file counts as stored)."""
    return {entry.name: sum(f.stat().st_blocks * 512 for f in entry.glob("images_*.npy"))
            for entry in root.iterdir() if entry.is_dir()}


def test_chunk_writer_flushes_and_drops_every_k_rows(tmp_path, monkeypatch):
    synced, dropped = [], []
    real_sync = os.fdatasync
    # Count only this file's syncs: a cache store left by an earlier test may be collected (and flush) meanwhile.
    mine = str(tmp_path)
    monkeypatch.setattr(os, "fdatasync", lambda fd: (fd_under(fd, mine) and synced.append(fd)) or real_sync(fd))
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, start, length, advice:
                        fd_under(fd, mine) and dropped.append((start, length, advice)))
    rows = np.random.default_rng(0).integers(0, 256, (7, 3, 2, 5), dtype=np.uint8)
    out = ChunkedImages(tmp_path / "x.npy", 7, 2, 5, flush_every=3)
    for row in rows:
        out.append(row[None])
    assert out.flushes == 2 and len(synced) == 2  # after rows 3 and 6, not after each row
    array = out.close()
    assert out.flushes == 3  # the last row, on close
    row_bytes = 3 * 2 * 5
    assert [(s - out.offset) // row_bytes for s, _, _ in dropped] == [0, 3, 6]
    assert [length // row_bytes for _, length, _ in dropped] == [3, 3, 1]
    assert {advice for _, _, advice in dropped} == {os.POSIX_FADV_DONTNEED}
    np.testing.assert_array_equal(array, rows)
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), rows)


def test_chunk_writer_refuses_rows_beyond_its_count_and_an_unfinished_file(tmp_path):
    out = ChunkedImages(tmp_path / "x.npy", 2, 1, 1)
    with pytest.raises(ValueError, match="do not fit"):
        out.append(np.zeros((3, 3, 1, 1), np.uint8))
    out.append(np.zeros((1, 3, 1, 1), np.uint8))
    with pytest.raises(ValueError, match="1 of 2 rows"):
        out.close()


def test_a_cache_that_cannot_fit_is_refused_in_one_line_before_writing(fresh_cache, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 5_000_000, 5_000_000))
    built = []
    with pytest.raises(DataError) as caught:
        cached_dataset({"name": "toy", "version": 1}, lambda writer: built.append(1), progress=False,
                       expected_bytes=9_900_000_000, too_big_fix="pass --per-class N or a smaller --resolution")
    message = str(caught.value)
    assert "\n" not in message and not built
    assert "9.9 GB" in message and "5.0 MB" in message and str(fresh_cache) in message
    assert "--per-class" in message and "--resolution" in message and "FEDSTYLE_CACHE" in message
    assert not fresh_cache.exists()  # nothing written, not even the folder


def test_fashion4_refuses_a_224_px_cache_the_disk_cannot_hold(tmp_path, fresh_cache, monkeypatch):
    write_fashion(tmp_path / "fm", train=32, test=8)
    load_dataset("fashion4", data_root=str(tmp_path / "fm"), progress=False)  # the 32 px base fits
    Usage = namedtuple("Usage", "total used free")
    free = 40 * 3 * 224 * 224 - 1  # one byte short of the 40 images at 224 px
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - free, free))
    with pytest.raises(DataError, match=r"needs 6\.0 MB .* only 6\.0 MB is free.*--per-class N"):
        load_dataset("fashion4", data_root=str(tmp_path / "fm"), resolution=224, progress=False)
    assert len(entry_bytes(fresh_cache)) == 1  # only the base entry


def test_a_per_class_run_writes_only_its_pick(tmp_path, fresh_cache):
    write_fashion(tmp_path / "fm", train=160, test=40)  # 200 images, 5 per class and domain
    picked = load_dataset("fashion4", data_root=str(tmp_path / "fm"), resolution=64, per_class=2, progress=False)
    base_bytes, pick_bytes = sorted(entry_bytes(fresh_cache).values())  # two entries, nothing else
    slack = 4 * 8192  # a header and a partly used block per domain file
    # the 32 px base of all 200 images, and at 64 px the 4 domains x 10 classes x 2 images, not the 200
    assert 200 * 3 * 32 * 32 <= base_bytes <= 200 * 3 * 32 * 32 + slack
    assert 80 * 3 * 64 * 64 <= pick_bytes <= 80 * 3 * 64 * 64 + slack
    assert picked.info["per_class"] == 2 and all(picked.size(d) == 20 for d in picked.domains)
    # the same images as the full dataset's subset_per_class, resized
    full = load_dataset("fashion4", data_root=str(tmp_path / "fm"), resolution=64, progress=False)
    reference = full.subset_per_class(2)
    for domain in picked.domains:
        assert torch.equal(picked.labels[domain], reference.labels[domain])
        difference = (picked.images[domain].int() - reference.images[domain].int()).abs().max()
        assert difference <= 1  # resized in other chunks: at most a rounding step apart


def test_config_runs_load_only_their_pick(tmp_path, monkeypatch):
    from fedstyle.experiments.build import load_config_dataset
    from fedstyle.experiments.config import RunConfig

    write_fashion(tmp_path / "fm", train=160, test=40)
    seen = []
    real = fashion4.build_resized
    monkeypatch.setattr(fashion4, "build_resized", lambda w, base, rows, *a: seen.append(sum(map(len, rows)))
                        or real(w, base, rows, *a))
    config = RunConfig(dataset="fashion4", data_root=str(tmp_path / "fm"), resolution=48, per_class=1)
    dataset = load_config_dataset(config, progress=False)
    assert seen == [40] and sum(dataset.size(d) for d in dataset.domains) == 40


def solid_tree(root: Path, per_class: int) -> None:
    rng = np.random.default_rng(0)
    for domain in ("dom_a", "dom_b"):
        for name in ("cat", "dog", "owl"):
            (root / domain / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / domain / name / f"{i:03d}.png")


def test_folder_per_class_decodes_only_its_pick(tmp_path, monkeypatch):
    solid_tree(tmp_path / "tree", per_class=4)
    decoded = []
    real = folder._decode_block
    monkeypatch.setattr(folder, "_decode_block", lambda block, resolution: decoded.extend(block)
                        or real(block, resolution))
    picked = load_dataset("folder", data_root=str(tmp_path / "tree"), resolution=8, per_class=2, progress=False)
    assert len(decoded) == 2 * 3 * 2  # 2 domains x 3 classes x 2, not the 24 images
    full = load_dataset("folder", data_root=str(tmp_path / "tree"), resolution=8, progress=False)
    reference = full.subset_per_class(2)
    for domain in full.domains:
        assert torch.equal(picked.images[domain], reference.images[domain])  # PIL decodes each image alike
        assert torch.equal(picked.labels[domain], reference.labels[domain])


def entry_files(root: Path) -> dict[str, bytes]:
    return {f"{f.parent.name}/{f.name}": f.read_bytes() for f in sorted(root.rglob("*.npy"))}


def test_worker_processes_build_the_same_bytes_as_one(tmp_path, monkeypatch):
    write_fashion(tmp_path / "fm", train=160, test=40)
    solid_tree(tmp_path / "tree", per_class=5)
    monkeypatch.setattr(fashion4, "RESIZE_CHUNK", 7)  # several chunks per domain
    monkeypatch.setattr(folder, "DECODE_BLOCK", 4)
    caches = {}
    for workers in (1, 2):
        monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / f"cache{workers}"))
        monkeypatch.setenv("FEDSTYLE_DECODE_WORKERS", str(workers))
        load_dataset("fashion4", data_root=str(tmp_path / "fm"), resolution=40, progress=False)
        load_dataset("folder", data_root=str(tmp_path / "tree"), resolution=12, progress=False)
        caches[workers] = entry_files(tmp_path / f"cache{workers}")
    # fashion4's base and 40 px entries (4 domains x 2 files each) and the folder's (2 domains x 2 files)
    assert len(caches[1]) == 2 * 8 + 4 and caches[1] == caches[2]


def test_ordered_map_keeps_order_and_worker_count_is_checked(monkeypatch):
    assert list(ordered_map(abs, range(-9, 0), 2)) == list(range(9, 0, -1))
    monkeypatch.setenv("FEDSTYLE_DECODE_WORKERS", "3")
    assert decode_workers() == 3 and decode_workers(1) == 1
    monkeypatch.setenv("FEDSTYLE_DECODE_WORKERS", "many")
    with pytest.raises(ConfigError, match="FEDSTYLE_DECODE_WORKERS"):
        decode_workers()


def test_input_resolution_caches_the_small_side_and_trains_at_the_large_one(tmp_path):
    """--resolution 16 --input-resolution 32: the cache holds 16 px images, the model gets 32 px batches."""
    from fedstyle.experiments.build import build_experiment
    from fedstyle.experiments.config import RunConfig

    write_fashion(tmp_path / "fm", train=160, test=40)
    config = RunConfig(dataset="fashion4", data_root=str(tmp_path / "fm"), resolution=16, input_resolution=32,
                       per_class=2, targets=["sketch"], backbone="convnet", batch_size=4, local_steps=1, rounds=1)
    exp = build_experiment(config, progress=False)
    assert tuple(exp.dataset.images["photo"].shape[-2:]) == (16, 16)
    seen = []
    exp.model.register_forward_pre_hook(lambda module, inputs: seen.append(tuple(inputs[0].shape[-2:])))
    exp.simulator.run_round(0)
    assert seen and set(seen) == {(32, 32)}


def test_a_small_domain_is_cut_into_enough_blocks_for_every_decode_worker():
    """A domain of 2,500 images in 512-image blocks gave 2 workers 3 rounds for 5 blocks (1.52x, not 2x):
    each worker now gets at least BLOCKS_PER_WORKER blocks, never below MIN_DECODE_BLOCK images."""
    assert folder.decode_block_size(2500, 1) == folder.DECODE_BLOCK  # one process: no tail to shorten
    size = folder.decode_block_size(2500, 2)
    assert -(-2500 // size) >= 2 * folder.BLOCKS_PER_WORKER and size >= folder.MIN_DECODE_BLOCK
    assert folder.decode_block_size(10**6, 2) == folder.DECODE_BLOCK  # a large domain keeps full blocks
    assert folder.decode_block_size(40, 4) == folder.MIN_DECODE_BLOCK


def test_a_bad_image_late_in_a_domain_is_found_alike_whatever_the_block_size(tmp_path, monkeypatch):
    """Two workers cut a domain into small blocks, one worker into one: the unreadable image is named, and the
    kept rows and labels are the same, so the offsets of each block's results follow the block size used."""
    solid_tree(tmp_path / "tree", per_class=7)
    (tmp_path / "tree" / "dom_b" / "owl" / "005.png").write_bytes(b"not a png")  # row 19 of 21: block 6 of 7
    monkeypatch.setattr(folder, "MIN_DECODE_BLOCK", 1)
    monkeypatch.setattr(folder, "BLOCKS_PER_WORKER", 4)
    assert folder.decode_block_size(21, 2) == 3 and folder.decode_block_size(21, 1) == folder.DECODE_BLOCK
    loaded = {}
    for workers in (1, 2):
        monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / f"cache{workers}"))
        monkeypatch.setenv("FEDSTYLE_DECODE_WORKERS", str(workers))
        with pytest.warns(UserWarning, match="skipped 1 unreadable"):
            loaded[workers] = load_dataset("folder", data_root=str(tmp_path / "tree"), resolution=8,
                                           skip_bad_images=True, progress=False)
    one, two = loaded[1], loaded[2]
    assert [Path(path).name for path, _ in two.info["bad_images"]] == ["005.png"]
    assert one.info["bad_images"] == two.info["bad_images"]
    assert two.size("dom_b") == 20 and two.class_counts("dom_b").tolist() == [7, 7, 6]
    for domain in one.domains:
        assert torch.equal(one.images[domain], two.images[domain])
        assert torch.equal(one.labels[domain], two.labels[domain])
