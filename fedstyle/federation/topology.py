"""Communication graphs and gossip mixing weights for peer-to-peer (decentralized) federated runs.

Each round every device replaces its parameters by a weighted average of its neighbours',
``theta_i <- sum_j W_ij theta_j`` (decentralized SGD / gossip averaging, e.g. Lian et al. 2017;
Koloskova et al. 2020). ``W`` comes from :func:`metropolis_hastings` on a graph from
:func:`build_graph`; :func:`consensus_distance` and :func:`spectral_gap` measure how far the
devices are from agreement and how fast gossip on ``W`` contracts that distance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import networkx as nx
import numpy as np
import torch

from fedstyle.errors import ConfigError
from fedstyle.figures import save_figure
from fedstyle.registry import Registry

MAX_CONNECTION_ATTEMPTS = 100


@dataclass(frozen=True)
class Topology:
    """A graph family: ``build(n, seed, radius, p)`` returns a graph on nodes ``0..n-1``.

    ``density_option`` names the option ("radius" or "p") that makes a random family denser, so
    a disconnected draw can be retried and reported; ``None`` for deterministic families, which
    are connected by construction.
    """

    build: Callable[[int, int, float, float], nx.Graph]
    density_option: str | None = None


TOPOLOGIES: Registry[Topology] = Registry("topology")


def _complete(n: int, seed: int, radius: float, p: float) -> nx.Graph:
    return nx.complete_graph(n)


def _ring(n: int, seed: int, radius: float, p: float) -> nx.Graph:
    graph = nx.cycle_graph(n)
    # cycle_graph(1) is a node with a self-loop; a device is not its own neighbour.
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))
    return graph


def _random_geometric(n: int, seed: int, radius: float, p: float) -> nx.Graph:
    if not radius > 0:
        raise ConfigError(f"--radius must be > 0 for the rgg topology, got {radius}")
    # Nodes uniform in the unit square, joined when closer than `radius`; positions kept in "pos".
    return nx.random_geometric_graph(n, radius, seed=seed)


def _erdos_renyi(n: int, seed: int, radius: float, p: float) -> nx.Graph:
    if not 0 < p <= 1:
        raise ConfigError(f"--p (edge probability) must be in (0, 1] for erdos_renyi, got {p}")
    return nx.gnp_random_graph(n, p, seed=seed)


TOPOLOGIES.add("complete", Topology(_complete))
TOPOLOGIES.add("ring", Topology(_ring))
TOPOLOGIES.add("rgg", Topology(_random_geometric, density_option="radius"))
TOPOLOGIES.add("erdos_renyi", Topology(_erdos_renyi, density_option="p"))


def _attempt_seed(seed: int, attempt: int) -> int:
    """Independent, reproducible seed for the ``attempt``-th draw of a random graph."""
    return int(np.random.SeedSequence([seed, attempt]).generate_state(1)[0])


def build_graph(name: str, n: int, seed: int, radius: float = 0.8, p: float = 0.5) -> nx.Graph:
    """The connected communication graph ``name`` on ``n`` devices (nodes ``0..n-1``).

    Random families are redrawn, deterministically from ``seed``, until connected (at most
    ``MAX_CONNECTION_ATTEMPTS`` draws): gossip on a disconnected graph never reaches consensus.
    """
    topology = TOPOLOGIES.get(name)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(f"a {name} topology needs at least 1 client, got n={n!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"the graph seed must be a non-negative integer, got {seed!r}")
    n, seed = int(n), int(seed)
    attempts = MAX_CONNECTION_ATTEMPTS if topology.density_option else 1
    for attempt in range(attempts):
        graph = topology.build(n, _attempt_seed(seed, attempt), radius, p)
        if nx.is_connected(graph):
            graph.graph.update(topology=name, seed=seed, attempts=attempt + 1)
            return graph
    option = topology.density_option
    if option is None:  # a deterministic family that is not connected is a bug here
        raise AssertionError(f"the {name} topology on {n} nodes is disconnected")
    value = {"radius": radius, "p": p}[option]
    raise ConfigError(
        f"the {name} graph on {n} clients (--{option} {value}) stayed disconnected after "
        f"{attempts} draws from seed {seed}; raise --{option} or lower the number of clients"
    )


def _adjacency(graph: nx.Graph) -> torch.Tensor:
    """0/1 float64 adjacency matrix without self-loops; nodes must be ``0..n-1``."""
    n = graph.number_of_nodes()
    if set(graph.nodes) != set(range(n)):
        raise ConfigError("the communication graph's nodes must be the integers 0..n-1")
    adjacency = torch.from_numpy(nx.to_numpy_array(graph, nodelist=range(n), weight=None, dtype=np.float64))
    adjacency.fill_diagonal_(0.0)
    return (adjacency != 0).to(torch.float64)


def metropolis_hastings(graph: nx.Graph) -> torch.Tensor:
    """Metropolis-Hastings gossip weights (Xiao & Boyd 2004), an ``n x n`` float64 matrix.

    ``W_ij = 1 / (1 + max(deg_i, deg_j))`` for each edge ``(i, j)``, ``W_ii = 1 - sum_{j != i} W_ij``,
    0 otherwise. ``W`` is symmetric and doubly stochastic, so gossip preserves the average model.
    """
    adjacency = _adjacency(graph)
    degree = adjacency.sum(dim=1)
    weights = adjacency / (1.0 + torch.maximum(degree[:, None], degree[None, :]))
    weights += torch.diag(1.0 - weights.sum(dim=1))
    return weights


def mix(weights_matrix: torch.Tensor, stacked: torch.Tensor) -> torch.Tensor:
    """One gossip step ``theta_i <- sum_j W_ij theta_j`` for a stack ``[n, ...]`` of device parameters.

    Runs as a single matmul on ``stacked``'s device and in its dtype (``W`` is cast to match).
    """
    n = stacked.shape[0] if stacked.dim() > 0 else 0
    if weights_matrix.shape != (n, n):
        raise ValueError(
            f"mixing matrix of shape {tuple(weights_matrix.shape)} does not match {n} stacked devices"
        )
    if not stacked.is_floating_point():
        raise TypeError(f"gossip averaging needs floating-point parameters, got {stacked.dtype}")
    weights = weights_matrix.to(device=stacked.device, dtype=stacked.dtype)
    return (weights @ stacked.reshape(n, -1)).reshape(stacked.shape)


def consensus_distance(stacked: torch.Tensor) -> float:
    """Consensus distance ``(1/n) sum_i ||theta_i - theta_bar||^2`` of a stack ``[n, ...]``.

    ``theta_bar`` is the mean over devices; this is the quantity bounded in decentralized-SGD
    analyses (e.g. Koloskova et al. 2020). The sum of squares accumulates in float64.
    """
    deviation = stacked - stacked.mean(dim=0, keepdim=True)
    return float(deviation.pow(2).sum(dtype=torch.float64) / stacked.shape[0])


def spectral_gap(weights_matrix: torch.Tensor) -> float:
    """``1 - |lambda_2|``, the second largest eigenvalue modulus of ``W`` subtracted from 1.

    Gossip on a doubly stochastic ``W`` shrinks the consensus distance by about ``|lambda_2|^2``
    per step, so a larger gap means faster agreement. A single device has gap 1 by convention.
    """
    weights = weights_matrix.detach().to(device="cpu", dtype=torch.float64)
    if weights.shape[0] < 2:
        return 1.0
    if torch.allclose(weights, weights.T):
        moduli = torch.linalg.eigvalsh(weights).abs()
    else:
        moduli = torch.linalg.eigvals(weights).abs()
    return float(1.0 - moduli.sort(descending=True).values[1])


def graph_summary(graph: nx.Graph) -> dict:
    """JSON-ready description for run logs: node count, edge count, degrees, diameter."""
    n = graph.number_of_nodes()
    connected = n > 0 and nx.is_connected(graph)
    return {
        "n": n,
        "edges": graph.number_of_edges(),
        "degrees": [int(graph.degree(node)) for node in sorted(graph.nodes)],
        "diameter": int(nx.diameter(graph)) if connected else None,
    }


def save_graph_png(graph: nx.Graph, path: str | os.PathLike) -> Path:
    """Draw ``graph`` to a PNG at ``path`` (written to a temporary file, then renamed into place).

    Random geometric graphs are drawn at their positions in the unit square, others on a circle.
    """
    from matplotlib.figure import (
        Figure,  # Figure without pyplot: no global backend/state
    )

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    positions = nx.get_node_attributes(graph, "pos")
    if len(positions) != graph.number_of_nodes():
        positions = nx.circular_layout(graph)
    figure = Figure(figsize=(4, 4))
    axes = figure.add_subplot()
    nx.draw_networkx(graph, pos=positions, ax=axes, node_color="#4c72b0", font_color="white", node_size=300)
    summary = graph_summary(graph)
    axes.set_title(f"{graph.graph.get('topology', 'graph')}: n={summary['n']}, edges={summary['edges']}")
    axes.set_axis_off()
    return save_figure(figure, path, bbox_inches="tight")
