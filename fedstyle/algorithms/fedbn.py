"""FedBN (Li et al., ICLR'21): BatchNorm layers stay on each client.

For evaluation on an unseen domain there is no client BatchNorm to use, so clients also upload
their BatchNorm layers and the server's evaluation model holds their average; the server never
sends BatchNorm layers down (they are not counted in bytes down).

The shared layers are averaged with weights 1/K whatever the clients' sizes (``aggregation=uniform``, the
default): the paper's Algorithm 1 (Appendix), line 8, sets every non-BatchNorm layer to
(1/K) sum_k w_{t+1,k}, and the authors' code (med-air/FedBN, federated/fed_digits.py ``communication``,
lines 164-175, ``client_weights`` at line 247) does the same. The paper's experiments truncate every client
to one size, where 1/K and weighting by size agree; ``aggregation=size`` weights by sample count, as FedAvg.
``reference_code=true`` is kept for symmetry with the other methods and changes nothing here.

Its card, with hyperparameters, results and parity: docs/methods/fedbn.md.
"""

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method

#: reference_code=true: the public code's choices for the hyperparameters not given explicitly
REFERENCE = {"aggregation": "uniform"}


@register_method
class FedBN(Algorithm):
    name = "fedbn"
    family = "FL heterogeneity"
    shares = "weights except BatchNorm layers"
    label = "FedBN"
    summary = "FedAvg with client-local BatchNorm layers (evaluation model: averaged BatchNorm)"
    paper = "Li et al., FedBN: Federated learning on non-IID features via local batch normalization, ICLR 2021"
    #: Algorithm 1, line 8: w <- (1/K) sum_k w_k for every layer that is not BatchNorm
    DEFAULTS = {"local_bn": True, "aggregation": "uniform"}
    HPARAMS = (HParam("reference_code", False, "the authors' code's choices (aggregation=uniform, already the "
                      "default: the paper's Algorithm 1 averages with 1/K too)"),)

    @classmethod
    def resolve(cls, given):
        return apply_reference_code(super().resolve(given), given, REFERENCE)
