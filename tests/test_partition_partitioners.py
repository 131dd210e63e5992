"""Client partitioners: completeness, hand-computed lambda counts, Dirichlet minimum size, skew, seeds."""

import numpy as np
import pytest
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.partition import (
    PARTITIONERS,
    ClientSpec,
    lambda_counts,
    make_partition,
    make_split,
)


def make_dataset(sizes: dict[str, int], num_classes: int = 4, seed: int = 0) -> DomainDataset:
    g = torch.Generator().manual_seed(seed)
    labels = {d: torch.randint(0, num_classes, (n,), generator=g) for d, n in sizes.items()}
    images = {d: torch.randint(0, 256, (n, 3, 2, 2), generator=g, dtype=torch.uint8) for d, n in sizes.items()}
    return DomainDataset("toy", list(sizes), [f"c{k}" for k in range(num_classes)], images, labels)


@pytest.fixture(scope="module")
def dataset():
    return make_dataset({"a": 240, "b": 160, "c": 120, "t": 30})


@pytest.fixture(scope="module")
def lodo(dataset):
    return make_split(dataset, "lodo", targets=["t"])


@pytest.fixture(scope="module")
def single(dataset):
    return make_split(dataset, "single_source", source="a")


def client_domain_matrix(clients: list[ClientSpec], domains: list[str]) -> np.ndarray:
    return np.array([[c.domain_counts().get(d, 0) for d in domains] for c in clients])


CASES = {
    "domain": dict(),
    "per_domain": dict(num_clients=6),
    "dirichlet": dict(num_clients=7, alpha=0.5),
    "lambda": dict(num_clients=7, lam=0.3),
    "label_dirichlet": dict(num_clients=5, alpha=0.3),
}


def test_every_registered_partitioner_is_tested():
    assert set(CASES) == set(PARTITIONERS.names())


@pytest.mark.parametrize("name", sorted(CASES))
def test_partition_is_disjoint_and_complete(name, dataset, lodo, single):
    split = single if name == "label_dirichlet" else lodo
    clients = make_partition(name, split, dataset, seed=1, **CASES[name])
    expected_clients = CASES[name].get("num_clients", len(split.sources))
    assert len(clients) == expected_clients and all(c.size > 0 for c in clients)
    for d in split.sources:
        parts = [c.indices[d] for c in clients if d in c.indices]
        assert all(p.dtype == torch.int64 and torch.equal(p, p.sort().values) for p in parts)
        merged = torch.cat(parts).sort().values
        assert torch.equal(merged, split.train[d])  # every train index in exactly one client
    assert sum(c.size for c in clients) == split.num_train


@pytest.mark.parametrize("name", ["per_domain", "dirichlet", "lambda", "label_dirichlet"])
def test_partition_is_seeded(name, dataset, lodo, single):
    split = single if name == "label_dirichlet" else lodo

    def flat(clients):
        return [{d: t.tolist() for d, t in c.indices.items()} for c in clients]

    first = make_partition(name, split, dataset, seed=5, **CASES[name])
    again = make_partition(name, split, dataset, seed=5, **CASES[name])
    other = make_partition(name, split, dataset, seed=6, **CASES[name])
    assert flat(first) == flat(again)
    assert flat(first) != flat(other)


def test_domain_partition_is_one_client_per_source(dataset, lodo):
    clients = make_partition("domain", lodo, dataset, num_clients=3)
    assert [c.domains for c in clients] == [["a"], ["b"], ["c"]]
    with pytest.raises(ConfigError, match="one client per source domain"):
        make_partition("domain", lodo, dataset, num_clients=4)


def test_per_domain_splits_each_domain_evenly(dataset, lodo):
    clients = make_partition("per_domain", lodo, dataset, num_clients=9)
    assert [c.domains for c in clients] == [["a"]] * 3 + [["b"]] * 3 + [["c"]] * 3
    for k, d in enumerate(lodo.sources):
        sizes = [c.size for c in clients[3 * k : 3 * k + 3]]
        assert sum(sizes) == len(lodo.train[d]) and max(sizes) - min(sizes) <= 1
    with pytest.raises(ConfigError, match="multiple of 3"):
        make_partition("per_domain", lodo, dataset, num_clients=10)


def test_lambda_counts_hand_computed_c_at_least_d():
    # D = 2, N = (100, 60), C = 3, lambda = 0.5. Main clients: one each; the extra client goes to
    # argmax(100/1, 60/1) = domain 0, so S = (2, 1) and main domains (0, 0, 1).
    # n_{i,0} for i = 0, 1: 100 (0.5/2 + 0.5/3) = 41.67 -> 41; client 2: 100 (0.5/3) = 16.67 -> 16.
    # Remainder 100 - 98 = 2 to clients 0 and 1: (42, 42, 16).
    # n_{i,1} for i = 0, 1: 60 (0.5/3) = 10; client 2: 60 (0.5 + 0.5/3) = 40; remainder 0.
    assert lambda_counts([100, 60], 3, 0.5).tolist() == [[42, 10], [42, 10], [16, 40]]


def test_lambda_counts_exact_integers_are_not_floored_down():
    # N = (10, 30), C = 3, lambda = 0.3: extra client to argmax(10, 30) = domain 1, S = (1, 2),
    # main domains (0, 1, 1). Client 0: a 10 (0.7 + 0.1) = 8, b 30 (0.1) = 3 (2.9999... in floats).
    # Clients 1, 2: a 10 (0.1) = 1, b 30 (0.35 + 0.1) = 13.5 -> 13. Remainder of b (1) to client 0.
    assert lambda_counts([10, 30], 3, 0.3).tolist() == [[8, 4], [1, 13], [1, 13]]


def test_lambda_zero_remainders_stay_in_the_main_domain_clients():
    # N = (100, 61), C = 5, S = (3, 2): b gives 30.5 each -> 30, 30 and its remainder goes to the
    # first b client (3), not to client 0 as the public code does (that would mix domains).
    assert lambda_counts([100, 61], 5, 0.0).tolist() == [[34, 0], [33, 0], [33, 0], [0, 31], [0, 30]]


def test_lambda_counts_hand_computed_c_less_than_d():
    # D = 3, N = (50, 30, 20), C = 2, lambda = 0.5. Greedy, largest domain first, to the smallest
    # client: 50 -> client 0; 30 -> client 1; 20 -> client 1 (30 < 50). greedy = [[50,0,0],[0,30,20]].
    # n = 0.5 N/2 + 0.5 greedy: client 0 (37.5, 7.5, 5), client 1 (12.5, 22.5, 15), floored
    # (37, 7, 5), (12, 22, 15); remainders (1, 1, 0) to client 0.
    assert lambda_counts([50, 30, 20], 2, 0.5).tolist() == [[38, 8, 5], [12, 22, 15]]
    # lambda = 0: whole domains; lambda = 1: even split.
    assert lambda_counts([50, 30, 20], 2, 0.0).tolist() == [[50, 0, 0], [0, 30, 20]]
    assert lambda_counts([50, 30, 20], 2, 1.0).tolist() == [[25, 15, 10], [25, 15, 10]]


def test_lambda_zero_gives_single_domain_clients():
    # N = (100, 60), C = 5: extras to argmax N/S: 100 -> S=(2,1); 60 > 50 -> (2,2); 50 > 30 -> (3,2).
    assert lambda_counts([100, 60], 5, 0.0).tolist() == [[34, 0], [33, 0], [33, 0], [0, 30], [0, 30]]
    ds = make_dataset({"a": 300, "b": 110, "c": 70, "t": 10})
    split = make_split(ds, "lodo", targets=["t"])
    clients = make_partition("lambda", split, ds, num_clients=11, lam=0.0)
    assert all(len(c.domains) == 1 for c in clients)
    assert {d for c in clients for d in c.domains} == {"a", "b", "c"}


def test_lambda_one_gives_identical_domain_mixtures(dataset, lodo):
    clients = make_partition("lambda", lodo, dataset, num_clients=8, lam=1.0)
    counts = client_domain_matrix(clients, lodo.sources)
    assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()  # equal up to rounding
    # each client's counts are floor(N_d / C) or one more, so mixtures agree within 1 / client size
    mixtures = counts / counts.sum(axis=1, keepdims=True)
    assert np.abs(mixtures - mixtures.mean(axis=0)).max() < 1.5 / counts.sum(axis=1).min()


def test_lambda_through_make_partition_matches_the_counts():
    ds = make_dataset({"a": 100, "b": 60, "t": 5})
    split = make_split(ds, "lodo", targets=["t"], val_fraction=0.0)
    clients = make_partition("lambda", split, ds, num_clients=3, lam=0.5)
    assert client_domain_matrix(clients, ["a", "b"]).tolist() == [[42, 10], [42, 10], [16, 40]]


def test_lambda_fewer_clients_than_domains(dataset, lodo):
    clients = make_partition("lambda", lodo, dataset, num_clients=2, lam=0.0)
    n = {d: len(lodo.train[d]) for d in lodo.sources}  # a > b > c: a -> client 0, b and c -> client 1
    assert client_domain_matrix(clients, lodo.sources).tolist() == [[n["a"], 0, 0], [0, n["b"], n["c"]]]


def test_lambda_errors():
    ds = make_dataset({"a": 3, "b": 3, "t": 3})
    split = make_split(ds, "lodo", targets=["t"], val_fraction=0.0)
    with pytest.raises(ConfigError, match="without samples"):  # 3 samples of a over 4 main clients
        make_partition("lambda", split, ds, num_clients=8, lam=0.0)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        make_partition("lambda", split, ds, num_clients=2, lam=1.5)
    with pytest.raises(ConfigError, match="--clients"):
        make_partition("lambda", split, ds, lam=0.5)


def test_dirichlet_respects_min_size(dataset, lodo):
    unconstrained = make_partition("dirichlet", lodo, dataset, num_clients=10, alpha=0.3, min_size=1, seed=2)
    assert min(c.size for c in unconstrained) < 15  # so the first draw is rejected below
    clients = make_partition("dirichlet", lodo, dataset, num_clients=10, alpha=0.3, min_size=15, seed=2)
    assert min(c.size for c in clients) >= 15
    # small alpha: domain mixtures differ between clients
    mixtures = client_domain_matrix(clients, lodo.sources) / np.array([[c.size] for c in clients])
    assert mixtures.std(axis=0).max() > 0.2


def test_dirichlet_impossible_min_size_errors(dataset, lodo):
    with pytest.raises(ConfigError, match="--clients"):  # 468 training samples < 50 clients x 10
        make_partition("dirichlet", lodo, dataset, num_clients=50, min_size=10)
    with pytest.raises(ConfigError, match="--alpha"):  # feasible in total, but alpha 0.005 never balances
        make_partition("dirichlet", lodo, dataset, num_clients=10, alpha=0.005, min_size=40)
    with pytest.raises(ConfigError, match="--alpha > 0"):
        make_partition("dirichlet", lodo, dataset, num_clients=10, alpha=0.0)


def test_label_dirichlet_skews_classes():
    ds = make_dataset({"a": 800, "t": 10}, num_classes=5)
    split = make_split(ds, "single_source", source="a")

    def class_spread(alpha):
        clients = make_partition("label_dirichlet", split, ds, num_clients=6, alpha=alpha, seed=0)
        hist = np.stack([torch.bincount(ds.labels["a"][c.indices["a"]], minlength=5).numpy() for c in clients])
        shares = hist / hist.sum(axis=1, keepdims=True)
        return np.abs(shares - hist.sum(0) / hist.sum()).sum(axis=1).mean() / 2  # mean total variation

    assert class_spread(0.1) > 0.4
    assert class_spread(1000.0) < 0.1


def test_label_dirichlet_requires_one_source(dataset, lodo):
    with pytest.raises(ConfigError, match="single_source"):
        make_partition("label_dirichlet", lodo, dataset, num_clients=5, alpha=0.3)


@pytest.mark.parametrize("num_clients", [0, -2, 2.5])
def test_bad_client_numbers(dataset, lodo, num_clients):
    with pytest.raises(ConfigError, match="positive integer"):
        make_partition("dirichlet", lodo, dataset, num_clients=num_clients)


def test_unknown_partitioner(dataset, lodo):
    with pytest.raises(UnknownNameError, match="dirichlet, domain, label_dirichlet, lambda, per_domain"):
        make_partition("iid", lodo, dataset, num_clients=3)
