"""Local MixStyle (Zhou et al., ICLR'21) inside each client at stages 1-3 with p = 0.5, on FedAvg.

Statistics are mixed within each client's own mini-batches (no style leaves a client), as the
"MixStyle" rows of the CCST and StableFDG tables. ``--hp local_bn=true`` gives FedBN + MixStyle.

``reference_code=true``: the authors' MixStyle (KaiyangZhou/mixstyle-release ``reid/models/mixstyle.py``
:85-122; Dassl's ``dassl/modeling/ops/mixstyle.py`` computes the same), i.e. sigma from ``torch.var``'s
unbiased variance (1/(HW - 1), mixstyle.py:95) instead of the paper's 1/HW. The factor HW / (HW - 1) is
common to sigma and sigma[perm], so it cancels in sigma_mix / sigma and changes the output only through eps
(a relative 7e-8 on 5 x 5 maps): both modes match the authors' code to float precision. Everything else (detached
statistics, lambda ~ Beta(alpha, alpha) per sample, a random permutation, firing with probability p per
call) is the same in both modes. ``tests/test_parity_mixstyle.py`` checks it against the authors' module
and their ResNet (``reid/models/resnet_ms.py``) with every draw fixed.

Not reproduced: the authors' "crossdomain" mixing (mixstyle.py:107-113: the batch split in two halves
that swap partners; a client here holds one domain); how the draws are made (Python's
``random.random()`` for firing and ``torch.distributions.Beta`` for lambda there, torch's generators
here: the same distributions, other streams).

Its card, with hyperparameters, results and parity: docs/methods/mixstyle.md.
"""

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.style.mixstyle import MixStyle


@register_method
class LocalMixStyle(Algorithm):
    name = "mixstyle"
    label = "MixStyle"
    summary = "FedAvg with MixStyle inside each client (stages 1-3, p=0.5)"
    paper = "Zhou et al., Domain generalization with MixStyle, ICLR 2021"
    DEFAULTS = {"style": "mixstyle"}
    HPARAMS = (
        HParam("reference_code", False, "the authors' code: MixStyle's sigma from the unbiased variance over H x W "
                                        "(torch.var, 1/(HW-1)) instead of the paper's 1/HW"),
    )

    def configure_model(self, model):
        super().configure_model(model)
        if self.hp["reference_code"]:
            for module in model.modules():
                if isinstance(module, MixStyle):
                    module.unbiased = True
