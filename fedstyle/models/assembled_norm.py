"""Explicitly assembled normalization (XAN, Le et al. CVPR'24, gPerXAN): BatchNorm and InstanceNorm side by side.

One layer normalises its input twice, with the batch's statistics (BatchNorm, running statistics at test time)
and with each image's own (InstanceNorm), and returns their convex combination with two learnable scores:

    XAN(x) = a_BN * BN(x) + a_IN * IN(x),     (a_BN, a_IN) = softmax(s_BN, s_IN),   s_BN = s_IN = 1 at start

Both branches carry their own affine weight and bias. ``assemble_norms`` swaps every ``BatchNorm2d`` of a model
for an :class:`AssembledNorm` whose BatchNorm branch *is* the old layer (a pretrained backbone keeps its ImageNet
statistics and affine parameters there) and whose InstanceNorm branch starts from the same affine parameters
(torch's ones and zeros on a from-scratch model, so the pair starts as the authors' fresh
``nn.InstanceNorm2d(C, affine=True)``). State keys: ``<layer>.batchnorm.*``, ``<layer>.instancenorm.*``,
``<layer>.score_batchnorm``, ``<layer>.score_instancenorm`` (the names of the authors' ``eXplicitOptimizedNorm2d``,
source/models/modules/normalization.py:4-39, so their state dicts and these line up key for key).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AssembledNorm(nn.Module):
    """a_BN * BN(x) + a_IN * IN(x) with (a_BN, a_IN) = softmax of two learnable scores (module docstring)."""

    def __init__(self, batchnorm: nn.BatchNorm2d):
        super().__init__()
        channels = batchnorm.num_features
        self.batchnorm = batchnorm
        self.score_batchnorm = nn.Parameter(torch.ones(1, dtype=batchnorm.weight.dtype))
        self.instancenorm = nn.InstanceNorm2d(channels, affine=True)  # eps 1e-5, no running statistics: the code's
        with torch.no_grad():
            self.instancenorm.weight.copy_(batchnorm.weight)
            self.instancenorm.bias.copy_(batchnorm.bias)
        self.score_instancenorm = nn.Parameter(torch.ones(1, dtype=batchnorm.weight.dtype))

    def branch_weights(self) -> torch.Tensor:
        """(a_BN, a_IN): the softmax of the two scores."""
        return F.softmax(torch.cat([self.score_batchnorm, self.score_instancenorm]), dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch_weights()
        if x[0, 0].numel() == 1:  # one value per channel: x - its own mean is 0 (torch refuses such an input)
            normalised = self.instancenorm.bias.view(1, -1, 1, 1).expand_as(x)
        else:
            normalised = self.instancenorm(x)
        return a[0] * self.batchnorm(x) + a[1] * normalised


def assemble_norms(model: nn.Module) -> list[str]:
    """Replace every ``BatchNorm2d`` inside ``model`` by an :class:`AssembledNorm` around it; returns the replaced
    layers' names (in ``named_modules`` order). An :class:`AssembledNorm` already there is left as it is."""
    replaced = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.BatchNorm2d) and not isinstance(module, AssembledNorm):
                setattr(module, child_name, AssembledNorm(child))
                replaced.append(f"{name}.{child_name}" if name else child_name)
    return replaced


def assembled_norms(model: nn.Module) -> dict[str, AssembledNorm]:
    """The model's :class:`AssembledNorm` layers by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, AssembledNorm)}
