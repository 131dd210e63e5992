"""fashion4 from tiny synthetic idx files, and the idx reader."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from fedstyle.data import fashion4
from fedstyle.data.fashion4 import CLASSES, DOMAINS, load_fashion4
from fedstyle.data.idx import read_idx, write_idx
from fedstyle.errors import DataError

NAMES = {key: name for key, (name, _) in fashion4.FASHION_MNIST_FILES.items()}


def garments(count: int, rng: np.random.Generator) -> np.ndarray:
    """Bright textured rectangles on black, like Fashion-MNIST's dark backgrounds."""
    images = np.zeros((count, 28, 28), dtype=np.uint8)
    for i in range(count):
        top, left = rng.integers(2, 8, size=2)
        bottom, right = rng.integers(20, 26, size=2)
        images[i, top:bottom, left:right] = rng.integers(60, 255, size=(bottom - top, right - left))
    return images


def write_fashion(root, train: int = 32, test: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(10, dtype=np.uint8), (train + test) // 10 + 1)[: train + test]
    images = garments(train + test, rng)
    root.mkdir(parents=True, exist_ok=True)
    write_idx(root / NAMES["train_images"], images[:train])
    write_idx(root / NAMES["train_labels"], labels[:train])
    write_idx(root / NAMES["test_images"], images[train:])
    write_idx(root / NAMES["test_labels"], labels[train:])
    return images, labels.astype(np.int64)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def test_four_disjoint_stratified_domains(tmp_path):
    images, labels = write_fashion(tmp_path / "fm")
    dataset = load_fashion4(data_root=str(tmp_path / "fm"), progress=False)
    assert dataset.domains == DOMAINS and dataset.classes == CLASSES
    assert dataset.augment == "crop_flip" and dataset.resolution == 32
    sources = dataset.info["source_indices"]
    seen = np.concatenate([sources[d] for d in DOMAINS])
    assert sorted(seen.tolist()) == list(range(40))  # every image in exactly one domain
    for domain in DOMAINS:
        assert dataset.images[domain].shape == (10, 3, 32, 32)
        assert dataset.class_counts(domain).tolist() == [1] * 10
        np.testing.assert_array_equal(labels[sources[domain]], dataset.labels[domain].numpy())


def test_domain_styles_are_distinct(tmp_path):
    write_fashion(tmp_path / "fm", train=160, test=40)
    dataset = load_fashion4(data_root=str(tmp_path / "fm"), progress=False)
    x = {d: dataset.images[d].numpy().astype(np.float32) for d in DOMAINS}
    colourfulness = {d: float((v.max(axis=1) - v.min(axis=1)).mean()) for d, v in x.items()}
    assert colourfulness["sketch"] == 0  # grey pencil
    assert min(colourfulness["photo"], colourfulness["art"], colourfulness["cartoon"]) > 10
    corner = {d: v[:, :, :3, :3].mean() for d, v in x.items()}
    assert corner["sketch"] > 230  # white paper around the drawing
    ink = {d: float((v.max(axis=1) < 30).mean()) for d, v in x.items()}
    assert ink["cartoon"] > 0.05  # dark outlines
    # per-domain mean images differ clearly
    means = np.stack([v.mean(axis=(0, 2, 3)) for v in x.values()])
    gaps = np.abs(means[:, None] - means[None]).sum(-1)
    assert gaps[~np.eye(4, dtype=bool)].min() > 5


def test_deterministic_and_seeded(tmp_path):
    write_fashion(tmp_path / "fm")
    files = fashion4.find_source_files(tmp_path / "fm")
    a = fashion4.build_fashion4(files, seed=0)
    b = fashion4.build_fashion4(files, seed=0)
    c = fashion4.build_fashion4(files, seed=1)
    for d in DOMAINS:
        np.testing.assert_array_equal(a.images[d], b.images[d])
    assert any(not np.array_equal(a.images[d], c.images[d]) for d in DOMAINS)


def test_cache_is_keyed_by_file_content(tmp_path, monkeypatch):
    write_fashion(tmp_path / "one")
    write_fashion(tmp_path / "two")
    calls = []
    real = fashion4.build_fashion4
    monkeypatch.setattr(fashion4, "build_fashion4", lambda *a, **k: calls.append(1) or real(*a, **k))
    load_fashion4(data_root=str(tmp_path / "one"), progress=False)
    load_fashion4(data_root=str(tmp_path / "two"), progress=False)  # same bytes elsewhere
    assert len(calls) == 1
    write_fashion(tmp_path / "two", seed=1)
    load_fashion4(data_root=str(tmp_path / "two"), progress=False)
    assert len(calls) == 2


def test_missing_files_say_how_to_get_them(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="dataset-fashion-mnist") as err:
        load_fashion4(data_root=str(tmp_path / "empty"), progress=False)
    assert "--data-root" in str(err.value) and "train-images-idx3-ubyte.gz" in str(err.value)
    monkeypatch.setattr(fashion4, "DEFAULT_ROOT", tmp_path / "empty")
    with pytest.raises(DataError, match="apt install dataset-fashion-mnist"):
        load_fashion4(progress=False)


def test_truncated_files_are_reported(tmp_path):
    write_fashion(tmp_path / "fm")
    path = tmp_path / "fm" / NAMES["train_images"]
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(DataError, match="truncated") as err:
        load_fashion4(data_root=str(tmp_path / "fm"), progress=False)
    assert NAMES["train_images"] in str(err.value)
    path.write_bytes(gzip.compress(raw)[:-50])  # a cut-off download
    with pytest.raises(DataError, match="not a complete gzip file"):
        load_fashion4(data_root=str(tmp_path / "fm"), progress=False)


def test_mismatched_label_count(tmp_path):
    write_fashion(tmp_path / "fm")
    write_idx(tmp_path / "fm" / NAMES["test_labels"], np.zeros(3, dtype=np.uint8))
    with pytest.raises(DataError, match="do not match"):
        load_fashion4(data_root=str(tmp_path / "fm"), progress=False)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    array = (np.arange(24).reshape(2, 3, 4) - (0 if dtype == np.uint8 else 5)).astype(dtype)
    write_idx(tmp_path / f"a.idx{suffix}", array)
    back = read_idx(tmp_path / f"a.idx{suffix}")
    assert back.dtype == np.dtype(dtype) and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_idx_header_by_hand(tmp_path):
    # magic 0x00000801 (ubyte, 1 dim), size 3, data 7 8 9
    (tmp_path / "l.idx").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
    assert read_idx(tmp_path / "l.idx").tolist() == [7, 8, 9]
    (tmp_path / "bad.idx").write_bytes(bytes([1, 2, 3, 4, 0, 0, 0, 3]))
    with pytest.raises(DataError, match="bad magic"):
        read_idx(tmp_path / "bad.idx")
    (tmp_path / "long.idx").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 1, 5, 6]))
    with pytest.raises(DataError, match="longer than its header"):
        read_idx(tmp_path / "long.idx")
    (tmp_path / "head.idx").write_bytes(bytes([0, 0, 8, 3, 0, 0]))
    with pytest.raises(DataError, match="truncated"):
        read_idx(tmp_path / "head.idx")
    with pytest.raises(DataError, match="does not exist"):
        read_idx(tmp_path / "missing.idx")


def test_official_urls_are_listed():
    assert len(fashion4.FASHION_MNIST_URLS) == 8
    assert all(url.endswith("-ubyte.gz") for url in fashion4.FASHION_MNIST_URLS)


def test_download_checks_md5_and_falls_back_to_the_next_mirror(tmp_path, monkeypatch):
    source = tmp_path / "mirror"
    write_fashion(source)
    files = {key: (name, fashion4.md5_of(source / name)) for key, name in NAMES.items()}
    monkeypatch.setattr(fashion4, "FASHION_MNIST_FILES", files)
    mirrors = ((tmp_path / "absent").as_uri() + "/", source.as_uri() + "/")
    monkeypatch.setattr(fashion4, "FASHION_MNIST_MIRRORS", mirrors)
    dest = fashion4.download_fashion_mnist(tmp_path / "dest")
    for name in NAMES.values():
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == sorted(NAMES.values())  # no temporary files left
    assert load_fashion4(data_root=str(dest), progress=False).size("photo") == 10

    files["train_labels"] = (NAMES["train_labels"], "0" * 32)
    with pytest.raises(DataError, match="MD5"):
        fashion4.download_fashion_mnist(tmp_path / "dest2")
    assert not (tmp_path / "dest2" / NAMES["train_labels"]).exists()
