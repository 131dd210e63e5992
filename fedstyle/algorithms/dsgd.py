"""DSGD: decentralized SGD on a peer-to-peer graph with Metropolis–Hastings weights.

theta_i <- sum_j P_ij theta_j - lr * g_i (StyleDDG's Eq. 14 without style sharing); the
simulator in ``fedstyle.federation.p2p`` does the mixing. ``--hp style=mixstyle`` or
``--hp style=dsu`` gives the DSGD + MixStyle / DSU baselines of the StyleDDG paper.

Its card, with hyperparameters, results and parity: docs/methods/dsgd.md.
"""

from fedstyle.algorithms.base import PEER_TO_PEER, Algorithm
from fedstyle.algorithms.registry import register_method


@register_method
class DSGD(Algorithm):
    name = "dsgd"
    label = "DSGD"
    summary = "decentralized SGD with Metropolis-Hastings mixing (peer-to-peer only)"
    paper = "Lian et al., Can decentralized algorithms outperform centralized algorithms?, NeurIPS 2017"
    topologies = PEER_TO_PEER
