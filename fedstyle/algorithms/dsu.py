"""Local DSU (Li et al., ICLR'22) inside each client at stages 1-3 with p = 0.5, on FedAvg.

``--hp local_bn=true`` gives FedBN + DSU.
"""

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.registry import register_method


@register_method
class LocalDSU(Algorithm):
    name = "dsu"
    label = "DSU"
    summary = "FedAvg with DSU style uncertainty inside each client (stages 1-3, p=0.5)"
    paper = "Li et al., Uncertainty modeling for out-of-distribution generalization, ICLR 2022"
    DEFAULTS = {"style": "dsu"}
