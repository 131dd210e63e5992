"""Local DSU (Li et al., ICLR'22) inside each client at stages 1-3 with p = 0.5, on FedAvg.

``--hp local_bn=true`` gives FedBN + DSU.

The op (:class:`fedstyle.style.dsu.DSU`) computes what the authors' ``DistributionUncertainty`` does
(lixiaotong97/DSU ``dsu.py``:52-68): unbiased variances over H x W and over the batch, eps 1e-6 inside
both square roots, one N(0, 1) draw per sample and channel for the mean and then one for the standard
deviation, nothing detached. ``reference_code=true`` also places it where the authors' ``UResNet`` does
(dsu.py:166-171, 227-243): after the stem (their ``pertubration1``, after the max-pooling) and after each
of layer1-4 (those of these stages the backbone has: the ConvNet has no stem), unless ``style_stages``
is given. ``tests/test_parity_dsu.py`` checks the op and a ResNet
step against the authors' code with every draw fixed.

Not reproduced: the authors' first DSU, between ``conv1`` and ``bn1`` (``pertubration0``, dsu.py:166
and 229; there is no stage boundary there in fedstyle's ResNet); the firing draw (NumPy's global
``np.random.random()`` there, torch's CPU generator here). A batch of one sample, or a 1 x 1 map (layer4
on small inputs), passes through unchanged here; the authors' unbiased variance of one value is NaN
(dsu.py:48 and 57), which makes their output NaN.

Its card, with hyperparameters, results and parity: docs/methods/dsu.md.
"""

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method

#: reference_code=true: the authors' UResNet positions fedstyle's stages can hold
REFERENCE = {"style_stages": "stem,layer1,layer2,layer3,layer4"}


@register_method
class LocalDSU(Algorithm):
    name = "dsu"
    label = "DSU"
    summary = "FedAvg with DSU style uncertainty inside each client (stages 1-3, p=0.5)"
    paper = "Li et al., Uncertainty modeling for out-of-distribution generalization, ICLR 2022"
    DEFAULTS = {"style": "dsu"}
    HPARAMS = (
        HParam("reference_code", False, "the authors' UResNet positions: DSU after the stem and after layer1-4 "
                                        "(unless style_stages is given)"),
    )

    def __init__(self, hparams=None, *, num_classes, num_clients):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        self._reference_stages = self.hp["reference_code"] and "style_stages" not in (hparams or {})

    @classmethod
    def resolve(cls, given):
        return apply_reference_code(super().resolve(given), given, REFERENCE)

    def configure_model(self, model):
        if self._reference_stages:  # the reference positions this backbone has
            have = model.backbone.stage_names
            self.hp["style_stages"] = ",".join(s for s in REFERENCE["style_stages"].split(",") if s in have)
        super().configure_model(model)
