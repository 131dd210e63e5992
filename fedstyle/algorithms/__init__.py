"""Federated learning methods, one file each, registered in :data:`METHODS`.

Adding a method: write ``fedstyle/algorithms/<name>.py`` with an :class:`Algorithm` subclass
decorated by :func:`register_method`, and import it below. The CLI, ``fedstyle methods`` and the
parametrized test matrix pick it up from the registry.
"""

# registry entries: importing a module registers its method
from fedstyle.algorithms import dsgd, dsu, fedavg, fedbn, feddyn, fedprox, mixstyle  # noqa: E402,F401
from fedstyle.algorithms import ccst, feddg_fft  # noqa: E402,F401  (setup-phase style exchanges, issue 3)
from fedstyle.algorithms import styleddg  # noqa: E402,F401  (peer-to-peer style sharing, issue 13)
from fedstyle.algorithms import fedsam, fedsr, moon  # noqa: E402,F401  (FedGCA's baselines, issue 12)
from fedstyle.algorithms import feddg_ga, fedgma, pardon  # noqa: E402,F401  (issue 11: PARDON and its baselines)
from fedstyle.algorithms import stablefdg  # noqa: E402,F401  (per-round style sharing + attention neck, issue 10)
from fedstyle.algorithms import fedgca  # noqa: E402,F401  (single-source FedDG, issue 12)
from fedstyle.algorithms import fedadg  # noqa: E402,F401  (FedGCA's FedADG baseline, issue 25)
from fedstyle.algorithms import fpl  # noqa: E402,F401  (cluster and unbiased prototypes, PARDON's baseline, issue 25)
from fedstyle.algorithms import jigen  # noqa: E402,F401  (JiGen inside each client, issue 25)
from fedstyle.algorithms import rsc  # noqa: E402,F401  (RSC inside each client, issue 25)
from fedstyle.algorithms import fedccrl, fediir, fedomg  # noqa: E402,F401  (FedDG of 2023-2025, issue 38)
from fedstyle.algorithms import gperxan  # noqa: E402,F401  (assembled, personalised normalization, issue 38)
from fedstyle.algorithms.base import PEER_TO_PEER, STAR, Algorithm, ClientResult
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import METHODS, register_method

__all__ = ["Algorithm", "ClientResult", "HParam", "METHODS", "PEER_TO_PEER", "STAR", "register_method"]
