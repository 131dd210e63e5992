"""Evaluation protocols: domain roles, stratified train/val split, determinism and errors."""

import math

import numpy as np
import pytest
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.partition import PROTOCOLS, make_split
from fedstyle.partition.protocols import stratified_val_counts


def make_dataset(labels_per_domain: dict[str, list[int] | int], num_classes: int = 3, seed: int = 0) -> DomainDataset:
    """Tiny dataset; a domain given as an int gets that many random labels."""
    g = torch.Generator().manual_seed(seed)
    labels = {
        d: torch.randint(0, num_classes, (y,), generator=g) if isinstance(y, int) else torch.tensor(y, dtype=torch.long)
        for d, y in labels_per_domain.items()
    }
    images = {d: torch.randint(0, 256, (len(y), 3, 2, 2), generator=g, dtype=torch.uint8) for d, y in labels.items()}
    return DomainDataset("toy", list(labels), [f"c{k}" for k in range(num_classes)], images, labels)


@pytest.fixture
def pacs_like():
    return make_dataset({"photo": 50, "art": 40, "cartoon": 30, "sketch": 20})


def assert_disjoint_complete(split, dataset):
    for d in split.sources:
        train, val = split.train[d], split.val[d]
        assert train.dtype == val.dtype == torch.int64
        assert torch.equal(train, train.sort().values) and torch.equal(val, val.sort().values)
        merged = torch.cat([train, val]).sort().values
        assert torch.equal(merged, torch.arange(dataset.size(d)))  # disjoint and complete
    for d, idx in split.heldout.items():
        assert torch.equal(idx, torch.arange(dataset.size(d)))


def test_registry_lists_the_protocols():
    assert PROTOCOLS.names() == ["all", "lodo", "ltdo", "single_source"]  # sorted


def test_lodo_one_and_several_targets(pacs_like):
    split = make_split(pacs_like, "lodo", targets=["sketch"])
    assert split.sources == ["photo", "art", "cartoon"] and split.targets == ["sketch"] and split.val_domain is None
    assert set(split.heldout) == {"sketch"} and split.protocol == "lodo"
    assert_disjoint_complete(split, pacs_like)

    split = make_split(pacs_like, "lodo", targets=["art", "sketch"])
    assert split.sources == ["photo", "cartoon"] and set(split.heldout) == {"art", "sketch"}
    assert split.num_train == sum(len(split.train[d]) for d in ("photo", "cartoon"))


def test_lodo_accepts_a_single_string_target(pacs_like):
    assert make_split(pacs_like, "lodo", targets="photo").targets == ["photo"]


def test_ltdo_holds_out_target_and_validation_domain(pacs_like):
    # Bai et al.'s PACS "ac-p-s": train A, C; validation domain P; test S.
    split = make_split(pacs_like, "ltdo", targets=["sketch"], val_domain="photo")
    assert split.sources == ["art", "cartoon"] and split.targets == ["sketch"] and split.val_domain == "photo"
    assert set(split.heldout) == {"sketch", "photo"}
    assert_disjoint_complete(split, pacs_like)


def test_single_source_defaults_to_all_other_targets(pacs_like):
    split = make_split(pacs_like, "single_source", source="photo")
    assert split.sources == ["photo"] and split.targets == ["art", "cartoon", "sketch"]
    split = make_split(pacs_like, "single_source", source="photo", targets=["sketch"])
    assert split.targets == ["sketch"] and set(split.heldout) == {"sketch"}
    assert_disjoint_complete(split, pacs_like)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(protocol="lodo"), "--target"),
        (dict(protocol="lodo", targets=["photo", "art", "cartoon", "sketch"]), "no source"),
        (dict(protocol="lodo", targets=["watercolor"]), "photo, art, cartoon, sketch"),
        (dict(protocol="lodo", targets=["art", "art"]), "twice"),
        (dict(protocol="lodo", targets=["art"], val_domain="photo"), "ltdo"),
        (dict(protocol="lodo", targets=["art"], source="photo"), "single_source"),
        (dict(protocol="ltdo", targets=["sketch"]), "--val-domain"),
        (dict(protocol="ltdo", targets=["sketch", "art"], val_domain="photo"), "exactly one"),
        (dict(protocol="ltdo", targets=["sketch"], val_domain="sketch"), "differ"),
        (dict(protocol="ltdo", targets=["sketch"], val_domain="oil"), "photo, art"),
        (dict(protocol="single_source"), "--source"),
        (dict(protocol="single_source", source="photo", targets=["photo"]), "--source"),
        (dict(protocol="single_source", source="paint"), "photo, art"),
        (dict(protocol="lodo", targets=["art"], val_fraction=1.0), "[0, 1)"),
        (dict(protocol="lodo", targets=["art"], val_fraction=-0.1), "[0, 1)"),
        (dict(protocol="lodo", targets=["art"], val_fraction=math.nan), "[0, 1)"),
    ],
)
def test_protocol_errors_name_the_fix(pacs_like, kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        make_split(pacs_like, **kwargs)
    assert fragment in str(info.value)


def test_unknown_protocol_lists_valid_names(pacs_like):
    with pytest.raises(UnknownNameError, match="lodo, ltdo, single_source"):
        make_split(pacs_like, "leave_all_out", targets=["art"])


def test_stratified_val_counts_by_hand():
    # round half up; at least one when n_c >= 2; at most n_c - 1.
    assert stratified_val_counts(np.array([25, 10, 2, 1, 0, 14]), 0.1).tolist() == [3, 1, 1, 0, 0, 1]
    assert stratified_val_counts(np.array([25, 10, 2, 1]), 0.0).tolist() == [0, 0, 0, 0]
    assert stratified_val_counts(np.array([10, 3, 1]), 0.95).tolist() == [9, 2, 0]


def test_split_is_stratified_per_class():
    labels = [0] * 25 + [1] * 10 + [2] * 2 + [3] * 1
    ds = make_dataset({"src": labels, "tgt": 5}, num_classes=4)
    split = make_split(ds, "lodo", targets=["tgt"], val_fraction=0.1)
    val_counts = torch.bincount(ds.labels["src"][split.val["src"]], minlength=4).tolist()
    train_counts = torch.bincount(ds.labels["src"][split.train["src"]], minlength=4).tolist()
    assert val_counts == [3, 1, 1, 0]
    assert train_counts == [22, 9, 1, 1]
    assert_disjoint_complete(split, ds)

    no_val = make_split(ds, "lodo", targets=["tgt"], val_fraction=0.0)
    assert no_val.val["src"].numel() == 0 and no_val.train["src"].numel() == len(labels)


def test_split_is_seeded_and_independent_of_the_fold(pacs_like):
    a = make_split(pacs_like, "lodo", targets=["sketch"], seed=3)
    b = make_split(pacs_like, "lodo", targets=["sketch"], seed=3)
    c = make_split(pacs_like, "lodo", targets=["sketch"], seed=4)
    assert all(torch.equal(a.val[d], b.val[d]) for d in a.sources)
    assert any(not torch.equal(a.val[d], c.val[d]) for d in a.sources)
    # A domain's train/val split does not depend on which other domain is held out.
    other_fold = make_split(pacs_like, "lodo", targets=["cartoon"], seed=3)
    assert torch.equal(a.val["photo"], other_fold.val["photo"])


def test_protocol_all_trains_on_every_domain_and_holds_none_out(pacs_like):
    """The model to deploy once a method is chosen: every domain a source, split as in any fold, nothing held out."""
    split = make_split(pacs_like, "all", seed=3)
    assert split.sources == pacs_like.domains and split.targets == [] and split.heldout == {}
    assert_disjoint_complete(split, pacs_like)
    lodo = make_split(pacs_like, "lodo", targets=["sketch"], seed=3)
    for d in lodo.sources:  # a domain's split is the same in every fold, this one included
        assert torch.equal(split.train[d], lodo.train[d]) and torch.equal(split.val[d], lodo.val[d])
    with pytest.raises(ConfigError, match="protocol 'all' trains on every domain and holds none out; drop --target"):
        make_split(pacs_like, "all", targets=["sketch"])
    with pytest.raises(ConfigError, match="--source 'photo' is not used by protocol 'all'"):
        make_split(pacs_like, "all", source="photo")
