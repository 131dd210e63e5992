"""FedBN (Li et al., ICLR'21): BatchNorm layers stay on each client.

For evaluation on an unseen domain there is no client BatchNorm to use, so clients also upload
their BatchNorm layers and the server's evaluation model holds their average; the server never
sends BatchNorm layers down (they are not counted in bytes down).

The authors' code (med-air/FedBN, federated/fed_digits.py ``communication``, lines 164-175) averages the
shared entries with weights 1/K whatever the clients' sizes (``client_weights``, line 247);
``reference_code=true`` does the same (``aggregation=uniform``). fedstyle's default averages by size, as FedAvg.

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
    DEFAULTS = {"local_bn": True}
    HPARAMS = (HParam("reference_code", False, "the authors' code's choice: the shared layers averaged with weights "
                      "1/K, not by client size (aggregation=uniform)"),)

    @classmethod
    def resolve(cls, given):
        return apply_reference_code(super().resolve(given), given, REFERENCE)
