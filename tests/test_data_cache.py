"""The dataset cache: one build per recipe, atomic writes, memory-mapped tensors."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from fedstyle.data.cache import (
    DecodedArrays,
    cache_dir,
    cached_dataset,
    entry_dir,
    recipe_key,
)
from fedstyle.errors import ConfigError


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def make_arrays(seed: int = 0) -> DecodedArrays:
    rng = np.random.default_rng(seed)
    return DecodedArrays(
        domains=["alpha", "Real World"],
        classes=["a", "b", "c"],
        images={
            "alpha": rng.integers(0, 256, (5, 3, 4, 4), dtype=np.uint8),
            "Real World": rng.integers(0, 256, (3, 3, 4, 4), dtype=np.uint8),
        },
        labels={"alpha": np.array([0, 1, 2, 2, 1]), "Real World": np.array([2, 0, 1])},
        mean=(0.1, 0.2, 0.3),
        std=(0.4, 0.5, 0.6),
        augment="crop_flip",
        info={"source": "test"},
    )


class CountingBuilder:
    def __init__(self, seed: int = 0):
        self.calls = 0
        self.seed = seed

    def __call__(self, writer) -> DecodedArrays:
        self.calls += 1
        return make_arrays(self.seed)


RECIPE = {"name": "toy", "version": 1, "seed": 0}


def test_cache_dir_follows_environment(fresh_cache, monkeypatch):
    assert cache_dir() == fresh_cache
    monkeypatch.delenv("FEDSTYLE_CACHE")
    assert cache_dir().name == "fedstyle"


def test_recipe_key_is_canonical():
    assert recipe_key({"a": 1, "b": [1, 2]}) == recipe_key({"b": [1, 2], "a": 1})
    assert recipe_key({"a": 1}) != recipe_key({"a": 2})
    assert len(recipe_key({"a": 1})) == 16


def test_round_trip_and_second_load_does_not_build(fresh_cache, monkeypatch):
    build = CountingBuilder()
    first = cached_dataset(RECIPE, build, progress=False)
    expected = make_arrays()
    assert build.calls == 1
    assert first.domains == expected.domains and first.classes == expected.classes
    assert first.mean == (0.1, 0.2, 0.3) and first.std == (0.4, 0.5, 0.6) and first.augment == "crop_flip"
    assert first.info["source"] == "test"
    for domain in expected.domains:
        assert first.images[domain].dtype == torch.uint8
        assert first.labels[domain].dtype == torch.int64
        np.testing.assert_array_equal(first.images[domain].numpy(), expected.images[domain])
        np.testing.assert_array_equal(first.labels[domain].numpy(), expected.labels[domain])

    modes = []
    real_load = np.load

    def spy_load(*args, **kwargs):
        modes.append(kwargs.get("mmap_mode"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy_load)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns on read-only memmaps
        second = cached_dataset(RECIPE, build, progress=False)
    assert build.calls == 1
    assert modes == ["c"] * 4  # images and labels of both domains, mapped, not read
    np.testing.assert_array_equal(second.images["Real World"].numpy(), expected.images["Real World"])
    assert entry_dir(RECIPE).parent == fresh_cache
    assert entry_dir(RECIPE).name.startswith("toy-")


def test_changing_the_recipe_rebuilds():
    build = CountingBuilder()
    cached_dataset(RECIPE, build, progress=False)
    cached_dataset({**RECIPE, "version": 2}, build, progress=False)
    cached_dataset({**RECIPE, "seed": 1}, build, progress=False)
    assert build.calls == 3
    cached_dataset(dict(reversed(list(RECIPE.items()))), build, progress=False)
    assert build.calls == 3


def test_in_memory_edits_never_reach_the_cache():
    dataset = cached_dataset(RECIPE, CountingBuilder(), progress=False)
    dataset.images["alpha"][0].fill_(7)  # copy-on-write mapping: allowed, but private
    again = cached_dataset(RECIPE, CountingBuilder(), progress=False)
    np.testing.assert_array_equal(again.images["alpha"].numpy(), make_arrays().images["alpha"])


def test_failed_build_leaves_nothing_behind(fresh_cache):
    def broken(writer):
        writer.empty_images(0, 2, 4, 4)
        raise RuntimeError("decoder crashed")

    with pytest.raises(RuntimeError, match="decoder crashed"):
        cached_dataset(RECIPE, broken, progress=False)
    assert list(fresh_cache.iterdir()) == []
    build = CountingBuilder()
    cached_dataset(RECIPE, build, progress=False)
    assert build.calls == 1
    assert [p.name for p in fresh_cache.iterdir()] == [entry_dir(RECIPE).name]


def test_incomplete_entry_is_rebuilt():
    build = CountingBuilder()
    cached_dataset(RECIPE, build, progress=False)
    (entry_dir(RECIPE) / "meta.json").unlink()
    dataset = cached_dataset(RECIPE, build, progress=False)
    assert build.calls == 2
    assert dataset.size("alpha") == 5


@pytest.mark.parametrize("damage", ["truncate images", "delete labels", "garble meta"])
def test_a_damaged_entry_is_decoded_again(damage):
    """A cut-short .npy raised numpy's "EOF" ValueError, a deleted one a bare "No such file": the entry is now
    decoded again, with a warning naming the file."""
    build = CountingBuilder()
    cached_dataset(RECIPE, build, progress=False)
    entry = entry_dir(RECIPE)
    if damage == "truncate images":
        path = entry / "images_0.npy"
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "delete labels":
        path = entry / "labels_1.npy"
        path.unlink()
    else:  # an unreadable meta.json marks the entry incomplete: rebuilt as one, silently
        path = entry / "meta.json"
        path.write_text("{not json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = cached_dataset(RECIPE, build, progress=False)
    assert build.calls == 2 and dataset.size("alpha") == 5 and dataset.size("Real World") == 3
    said = [str(w.message) for w in caught]
    if damage != "garble meta":
        assert len(said) == 1 and f"is damaged ({path.name}: " in said[0] and said[0].endswith("decoding it again")


def test_setting_a_damaged_entry_aside_spares_one_another_process_mended(monkeypatch):
    """Workers that find the damage together: the first moves it aside and rebuilds; a later one must neither
    delete that fresh entry nor fail because the damaged one is gone."""
    import fedstyle.data.cache as cache

    build = CountingBuilder()
    cached_dataset(RECIPE, build, progress=False)
    entry = entry_dir(RECIPE)
    cache._set_aside(entry)  # a sound entry (mended meanwhile): kept
    assert cache._is_complete(entry) and build.calls == 1
    (entry / "images_0.npy").write_bytes(b"")
    cache._set_aside(entry)  # damaged: moved aside and deleted, nothing left beside it
    assert not entry.exists() and list(entry.parent.iterdir()) == []
    cache._set_aside(entry)  # already gone: nothing to do
    assert cached_dataset(RECIPE, build, progress=False).size("alpha") == 5 and build.calls == 2


def test_an_entry_that_stays_damaged_is_one_error(monkeypatch):
    """When decoding again does not mend it (a disk that cuts files), the second failure is the error."""
    import fedstyle.data.cache as cache
    from fedstyle.errors import DataError

    cached_dataset(RECIPE, CountingBuilder(), progress=False)
    real_build = cache._build_entry

    def build_and_cut(recipe, build, target):
        real_build(recipe, build, target)
        (target / "images_0.npy").write_bytes(b"")

    monkeypatch.setattr(cache, "_build_entry", build_and_cut)
    (entry_dir(RECIPE) / "images_0.npy").write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataError, match=r"is damaged \(images_0.npy: .*`fedstyle cache clear datasets`"):
            cached_dataset(RECIPE, CountingBuilder(), progress=False)


def test_writer_arrays_and_shrinking():
    def build(writer):
        images = writer.empty_images(0, 4, 2, 2)
        images[:] = np.arange(4, dtype=np.uint8)[:, None, None, None]
        images = writer.keep_images(0, np.array([0, 2, 3]))
        return DecodedArrays(["d"], ["x"], {"d": images}, {"d": np.zeros(3, dtype=np.int64)}, (0.5,) * 3, (0.5,) * 3)

    dataset = cached_dataset(RECIPE, build, progress=False)
    assert dataset.images["d"][:, 0, 0, 0].tolist() == [0, 2, 3]
    assert not any(p.name.endswith(".partial.npy") for p in entry_dir(RECIPE).iterdir())


def test_recipe_needs_name_and_version():
    with pytest.raises(ConfigError, match="version"):
        cached_dataset({"name": "toy"}, CountingBuilder(), progress=False)
    with pytest.raises(ConfigError, match="JSON"):
        cached_dataset({"name": "toy", "version": 1, "bad": object()}, CountingBuilder(), progress=False)


def test_stale_staging_folders_are_cleaned(fresh_cache):
    target = entry_dir(RECIPE)
    fresh_cache.mkdir(parents=True)
    stale = fresh_cache / f".{target.name}.abc.tmp"
    young = fresh_cache / f".{target.name}.def.tmp"  # maybe another process building right now
    stale.mkdir()
    young.mkdir()
    os.utime(stale, (0, 0))
    cached_dataset(RECIPE, CountingBuilder(), progress=False)
    assert not stale.exists() and young.exists()


def test_cache_usage_and_clear_by_kind(tmp_path, monkeypatch, capsys):
    from fedstyle.cli.main import main
    from fedstyle.data.cache import cache_usage, clear_cache
    from fedstyle.errors import ConfigError

    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "c"))
    for folder, size in (("digits4-abc/images", 100), ("ccst/k1/images.npy", 300), ("ccst/k2/images.npy", 50)):
        path = tmp_path / "c" / folder
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    assert cache_usage() == {"ccst": (2, 350), "datasets": (1, 100)}
    with pytest.raises(ConfigError, match="unknown cache kind"):
        clear_cache(["stylized"])
    assert main(["cache", "clear", "ccst"]) == 0 and "freed" in capsys.readouterr().out
    assert cache_usage() == {"datasets": (1, 100)}
    assert main(["cache"]) == 0 and "datasets" in capsys.readouterr().out
    assert main(["cache", "clear", "--all"]) == 0 and cache_usage() == {}


def test_a_full_disk_while_building_is_one_line_not_a_sigbus(tmp_path, monkeypatch):
    """A builder writes into memory-mapped files: their space is reserved first, so a full disk is one line
    naming the cache folder and the space needed (issue 39: a SIGBUS killed the process), and a rebuild
    with room works."""
    from fs_faults import SmallDisk

    from fedstyle.errors import DataError

    disk = SmallDisk(tmp_path / "disk", monkeypatch, size="1m")
    try:
        monkeypatch.setenv("FEDSTYLE_CACHE", str(disk.path / "cache"))

        def build(writer):
            images = writer.empty_images(0, 1000, 16, 16)  # 768 kB
            images[:] = 7  # a SIGBUS here when the space was not reserved
            return DecodedArrays(["d"], ["a"], {"d": images}, {"d": np.zeros(1000, np.int64)}, (0.5,) * 3, (0.5,) * 3)

        disk.fill(room=200_000)
        with pytest.raises(DataError) as err:
            cached_dataset(RECIPE, build, progress=False)
        message = str(err.value)
        assert "\n" not in message and f"dataset cache {disk.path / 'cache'}" in message
        assert "no space left on device" in message and "768.0 kB more needed" in message
        assert list((disk.path / "cache").iterdir()) == []  # no staging folder left
        disk.free()
        assert (cached_dataset(RECIPE, build, progress=False).images["d"] == 7).all()
    finally:
        disk.close()
