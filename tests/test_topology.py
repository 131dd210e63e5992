"""Peer-to-peer graphs and gossip weights: invariants and hand-computed values."""

from __future__ import annotations

import math

import networkx as nx
import pytest
import torch

from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.federation.topology import (
    TOPOLOGIES,
    build_graph,
    consensus_distance,
    graph_summary,
    metropolis_hastings,
    mix,
    save_graph_png,
    spectral_gap,
)


@pytest.mark.parametrize("name", TOPOLOGIES.names())
@pytest.mark.parametrize("n", [1, 2, 5, 12])
@pytest.mark.parametrize("seed", [0, 7])
def test_metropolis_hastings_is_symmetric_doubly_stochastic(name, n, seed):
    graph = build_graph(name, n, seed)
    assert sorted(graph.nodes) == list(range(n))
    assert nx.is_connected(graph)
    weights = metropolis_hastings(graph)
    assert weights.dtype == torch.float64 and weights.shape == (n, n)
    ones = torch.ones(n, dtype=torch.float64)
    torch.testing.assert_close(weights, weights.T)
    torch.testing.assert_close(weights.sum(dim=0), ones)
    torch.testing.assert_close(weights.sum(dim=1), ones)
    assert (weights >= 0).all()
    # Non-zero off-diagonal entries are exactly the edges.
    off_diagonal = (weights - torch.diag(torch.diag(weights))) > 0
    expected = torch.zeros(n, n, dtype=torch.bool)
    for i, j in graph.edges:
        expected[i, j] = expected[j, i] = True
    assert torch.equal(off_diagonal, expected)


def test_metropolis_hastings_path_graph_by_hand():
    weights = metropolis_hastings(nx.path_graph(3))  # degrees 1, 2, 1
    expected = torch.tensor(
        [[2 / 3, 1 / 3, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 1 / 3, 2 / 3]], dtype=torch.float64
    )
    torch.testing.assert_close(weights, expected)


def test_metropolis_hastings_rejects_nodes_other_than_range():
    graph = nx.Graph([("a", "b")])
    with pytest.raises(ConfigError, match="0..n-1"):
        metropolis_hastings(graph)


def test_ring_and_complete_degrees():
    assert [d for _, d in build_graph("ring", 6, 0).degree] == [2] * 6
    assert [d for _, d in build_graph("complete", 6, 0).degree] == [5] * 6
    two_ring = build_graph("ring", 2, 0)
    assert list(two_ring.edges) == [(0, 1)]
    single = build_graph("ring", 1, 0)
    assert single.number_of_nodes() == 1 and single.number_of_edges() == 0
    torch.testing.assert_close(metropolis_hastings(single), torch.ones(1, 1, dtype=torch.float64))


@pytest.mark.parametrize("name", ["rgg", "erdos_renyi"])
def test_random_graphs_are_deterministic_per_seed(name):
    first = build_graph(name, 15, seed=3, radius=0.5, p=0.3)
    again = build_graph(name, 15, seed=3, radius=0.5, p=0.3)
    assert sorted(first.edges) == sorted(again.edges)
    others = {tuple(sorted(build_graph(name, 15, seed=s, radius=0.5, p=0.3).edges)) for s in range(4, 8)}
    assert len(others | {tuple(sorted(first.edges))}) > 1


def test_rgg_positions_in_unit_square_and_edges_within_radius():
    radius = 0.5
    graph = build_graph("rgg", 12, seed=1, radius=radius)
    positions = nx.get_node_attributes(graph, "pos")
    assert all(0 <= x <= 1 and 0 <= y <= 1 for x, y in positions.values())
    for i in graph.nodes:
        for j in graph.nodes:
            if i < j:
                close = math.dist(positions[i], positions[j]) <= radius
                assert graph.has_edge(i, j) == close


def test_disconnected_random_graph_raises_with_fix():
    with pytest.raises(ConfigError, match=r"stayed disconnected.*raise --radius.*lower the number of clients"):
        build_graph("rgg", 10, seed=0, radius=0.01)
    with pytest.raises(ConfigError, match=r"stayed disconnected.*raise --p"):
        build_graph("erdos_renyi", 10, seed=0, p=0.01)


def test_bad_arguments():
    with pytest.raises(UnknownNameError, match="ring"):
        build_graph("torus", 4, 0)
    with pytest.raises(ConfigError, match="at least 1 client"):
        build_graph("ring", 0, 0)
    with pytest.raises(ConfigError, match="--radius"):
        build_graph("rgg", 4, 0, radius=0.0)
    with pytest.raises(ConfigError, match="--p"):
        build_graph("erdos_renyi", 4, 0, p=1.5)


def test_consensus_distance_by_hand():
    stacked = torch.tensor([[0.0, 0.0], [2.0, 0.0], [4.0, 3.0]])  # mean (2, 1)
    # squared distances: 4 + 1 = 5, 0 + 1 = 1, 4 + 4 = 8  -> (5 + 1 + 8) / 3
    assert consensus_distance(stacked) == pytest.approx(14 / 3)
    assert consensus_distance(stacked[:1]) == 0.0
    # Trailing dimensions count as one flat parameter vector per device.
    assert consensus_distance(stacked.reshape(3, 2, 1)) == pytest.approx(14 / 3)


def test_mix_preserves_average_and_contracts_consensus():
    generator = torch.Generator().manual_seed(0)
    weights = metropolis_hastings(build_graph("ring", 6, 0))
    stacked = torch.randn(6, 4, 5, generator=generator, dtype=torch.float32)
    mixed = mix(weights, stacked)
    assert mixed.shape == stacked.shape and mixed.dtype == torch.float32
    torch.testing.assert_close(mixed.mean(dim=0), stacked.mean(dim=0))
    assert consensus_distance(mixed) < consensus_distance(stacked)
    # Row i of the result is sum_j W_ij theta_j.
    expected_first = sum(weights[0, j].item() * stacked[j] for j in range(6))
    torch.testing.assert_close(mixed[0], expected_first)


def test_mix_on_complete_graph_reaches_consensus_in_one_step():
    stacked = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    mixed = mix(metropolis_hastings(build_graph("complete", 4, 0)), stacked)
    torch.testing.assert_close(mixed, stacked.mean(dim=0).expand(4, 3))
    assert consensus_distance(mixed) == pytest.approx(0.0, abs=1e-24)


def test_mix_rejects_mismatched_stack():
    with pytest.raises(ValueError, match="does not match"):
        mix(torch.eye(3, dtype=torch.float64), torch.zeros(4, 2))


def test_spectral_gap():
    assert spectral_gap(metropolis_hastings(build_graph("complete", 5, 0))) == pytest.approx(1.0)
    # Path 0-1-2: eigenvalues of the MH matrix are 1, 2/3, 0.
    assert spectral_gap(metropolis_hastings(nx.path_graph(3))) == pytest.approx(1 / 3)
    ring_gaps = [spectral_gap(metropolis_hastings(build_graph("ring", n, 0))) for n in (4, 8, 16)]
    assert ring_gaps == sorted(ring_gaps, reverse=True)  # bigger rings mix more slowly
    assert spectral_gap(torch.ones(1, 1, dtype=torch.float64)) == 1.0


def test_graph_summary_and_png(tmp_path):
    graph = build_graph("ring", 6, 0)
    assert graph_summary(graph) == {"n": 6, "edges": 6, "degrees": [2] * 6, "diameter": 3}
    path = save_graph_png(build_graph("rgg", 8, 0), tmp_path / "sub" / "graph.png")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 1000
    assert sorted(p.name for p in path.parent.iterdir()) == ["graph.pdf", "graph.png"]  # no temporary left
