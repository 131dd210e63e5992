"""FedProx (Li et al., MLSys'20): local loss + (mu/2)·||w − w_global||² (Eq. 2 of the paper)."""

import torch
import torch.nn.functional as F

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

    def training_loss(self, ctx, model, x, y, payload):
        loss = F.cross_entropy(model(x), y)
        if self.hp["mu"] == 0:
            return loss
        prox = sum(
            torch.sum((p - ctx.global_weights[name]) ** 2) for name, p in model.named_parameters() if p.requires_grad
        )
        return loss + 0.5 * self.hp["mu"] * prox
