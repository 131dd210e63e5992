"""FedProx (Li et al., MLSys'20): local loss + (mu/2)·||w − w_global||² (Eq. 2 of the paper).

The proximal term is a :meth:`~fedstyle.algorithms.base.Algorithm.weight_penalty` (a function of the
weights alone), so FedProx keeps FedAvg's step and trains batched under ``--client-batching``.

Its card, with hyperparameters, results and parity: docs/methods/fedprox.md.
"""

import torch

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method


@register_method
class FedProx(Algorithm):
    name = "fedprox"
    label = "FedProx"
    summary = "FedAvg with a proximal term pulling local weights to the downloaded model"
    paper = "Li et al., Federated optimization in heterogeneous networks, MLSys 2020"
    HPARAMS = (HParam("mu", 0.01, "weight of the proximal term (mu/2)||w - w_global||^2", low=0.0),)

    def weight_penalty(self, params, global_weights):
        if self.hp["mu"] == 0:
            return None
        prox = sum(torch.sum((p - global_weights[name]) ** 2) for name, p in params.items())
        return 0.5 * self.hp["mu"] * prox
