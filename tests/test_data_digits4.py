"""The built-in digits4 dataset (small per-class caps keep the builds to a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from fedstyle.data import digits4
from fedstyle.data.digits4 import (
    blend_mnistm,
    contrasting_colours,
    load_digits4,
    load_mnist_5k,
    resize_uint8,
    stratified_split,
)

PER_CLASS = 6


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDSTYLE_CACHE", str(tmp_path_factory.mktemp("digits4-cache")))
    yield load_digits4(per_class=PER_CLASS, progress=False)
    mp.undo()


def test_domains_classes_shapes_and_balance(small):
    assert small.domains == ["mnist", "mnistm", "optdigits", "syn"]
    assert small.classes == [str(d) for d in range(10)]
    assert small.resolution == 32 and small.augment == "crop"
    for domain in small.domains:
        assert small.images[domain].shape == (10 * PER_CLASS, 3, 32, 32)
        assert small.class_counts(domain).tolist() == [PER_CLASS] * 10


def test_mnist_and_mnistm_use_disjoint_digit_images(small):
    raw, raw_labels = load_mnist_5k()
    sources = small.info["mnist_source_indices"]
    mnist, mnistm = np.asarray(sources["mnist"]), np.asarray(sources["mnistm"])
    assert not set(mnist) & set(mnistm)
    assert not {raw[i].tobytes() for i in mnist} & {raw[i].tobytes() for i in mnistm}
    np.testing.assert_array_equal(raw_labels[mnist], small.labels["mnist"].numpy())
    np.testing.assert_array_equal(raw_labels[mnistm], small.labels["mnistm"].numpy())
    # the mnist domain is exactly those digits, resized and grey
    expected = resize_uint8(raw[mnist][:, None], 32)[:, 0]
    images = small.images["mnist"].numpy()
    np.testing.assert_array_equal(images[:, 0], expected)
    assert (images[:, 0] == images[:, 1]).all() and (images[:, 1] == images[:, 2]).all()


def test_domains_look_different(small):
    def saturation(x):
        x = x.astype(np.float32)
        return float((x.max(axis=1) - x.min(axis=1)).mean())

    assert saturation(small.images["mnist"].numpy()) == 0
    assert saturation(small.images["optdigits"].numpy()) == 0
    assert saturation(small.images["mnistm"].numpy()) > 10
    assert saturation(small.images["syn"].numpy()) > 10


def test_full_split_is_stratified_halves():
    _, labels = load_mnist_5k()
    halves = stratified_split(labels, 2, np.random.default_rng(0))
    assert len(halves[0]) == len(halves[1]) == 2500
    assert np.bincount(labels[halves[0]]).tolist() == [250] * 10
    assert len(np.union1d(halves[0], halves[1])) == 5000


def test_stratified_split_by_hand():
    labels = np.array([0, 0, 0, 1, 1, 1, 1])
    parts = stratified_split(labels, 2, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(7))
    counts = [np.bincount(labels[part], minlength=2).tolist() for part in parts]
    assert sorted(counts) == [[1, 2], [2, 2]]  # class 0 (3 samples) splits 2 + 1, class 1 splits 2 + 2


def test_mnistm_is_absolute_difference_with_photo(monkeypatch):
    photo = np.full((40, 50, 3), 100, dtype=np.uint8)
    photo[..., 2] = 30
    monkeypatch.setattr(digits4, "load_photos", lambda: [photo])
    digits = np.array([[[0, 255], [100, 130]]], dtype=np.uint8)
    out = blend_mnistm(digits, np.random.default_rng(0))
    assert out.shape == (1, 3, 2, 2)
    assert out[0, 0].tolist() == [[100, 155], [0, 30]]
    assert out[0, 2].tolist() == [[30, 225], [70, 100]]


def test_syn_colours_contrast():
    fg, bg = contrasting_colours(500, np.random.default_rng(0))
    luma = np.array([0.299, 0.587, 0.114])
    assert (np.abs((fg - bg) @ luma) >= 0.35).all()


def test_deterministic_given_seed():
    a = digits4.syn_images(np.random.default_rng(0), 2)
    b = digits4.syn_images(np.random.default_rng(0), 2)
    c = digits4.syn_images(np.random.default_rng(1), 2)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    assert a[1].tolist() == np.repeat(np.arange(10), 2).tolist()


def test_resolution_option(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path))
    dataset = load_digits4(per_class=1, resolution=20, progress=False)
    assert dataset.resolution == 20 and dataset.images["syn"].shape == (10, 3, 20, 20)
