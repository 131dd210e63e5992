"""Local MixStyle (Zhou et al., ICLR'21) inside each client at stages 1-3 with p = 0.5, on FedAvg.

Statistics are mixed within each client's own mini-batches (no style leaves a client), as the
"MixStyle" rows of the CCST and StableFDG tables. ``--hp local_bn=true`` gives FedBN + MixStyle.
"""

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.registry import register_method


@register_method
class LocalMixStyle(Algorithm):
    name = "mixstyle"
    label = "MixStyle"
    summary = "FedAvg with MixStyle inside each client (stages 1-3, p=0.5)"
    paper = "Zhou et al., Domain generalization with MixStyle, ICLR 2021"
    DEFAULTS = {"style": "mixstyle"}
