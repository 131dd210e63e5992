"""FedBN (Li et al., ICLR'21): BatchNorm layers stay on each client.

For evaluation on an unseen domain there is no client BatchNorm to use, so clients also upload
their BatchNorm layers and the server's evaluation model holds their average; the server never
sends BatchNorm layers down (they are not counted in bytes down).

Its card, with hyperparameters, results and parity: docs/methods/fedbn.md.
"""

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.registry import register_method


@register_method
class FedBN(Algorithm):
    name = "fedbn"
    label = "FedBN"
    summary = "FedAvg with client-local BatchNorm layers (evaluation model: averaged BatchNorm)"
    paper = "Li et al., FedBN: Federated learning on non-IID features via local batch normalization, ICLR 2021"
    DEFAULTS = {"local_bn": True}
