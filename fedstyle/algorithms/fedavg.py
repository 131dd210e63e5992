"""FedAvg (McMahan et al., AISTATS'17): local SGD, sample-size weighted averaging.

Its card, with hyperparameters, results and parity: docs/methods/fedavg.md.
"""

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.registry import register_method


@register_method
class FedAvg(Algorithm):
    """Plain federated averaging; the base class already implements it."""

    name = "fedavg"
    label = "FedAvg"
    summary = "federated averaging of locally trained models (size-weighted)"
    paper = "McMahan et al., Communication-efficient learning of deep networks from decentralized data, AISTATS 2017"
