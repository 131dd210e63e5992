"""Batched, seeded image augmentations of the normalised float batch, on the training device.

RandConv (:mod:`.randconv`), AugMix as tensor ops (:mod:`.augmix`), multi-scale texture corruption
(:mod:`.texture`) and FedGCA's style-complement module combining them (:mod:`.complement`), all
registered in :data:`BATCH_AUGMENTATIONS` and selected by the local option ``--hp augment=NAME``
every method accepts (see ``fedstyle.algorithms.base``). Conventions (normalisation, where random
numbers come from) are in :mod:`.common`.
"""

from fedstyle.data.augment.augmix import AugMix
from fedstyle.data.augment.common import Augmentation, Draws, Normalization, apply_groups
from fedstyle.data.augment.complement import StyleComplement
from fedstyle.data.augment.randconv import RandConv
from fedstyle.data.augment.registry import (BATCH_AUGMENTATIONS, augment_labelled, augmentation_label,
                                           build_augmentation, parse_options)
from fedstyle.data.augment.texture import TextureCorruption

__all__ = ["AugMix", "Augmentation", "BATCH_AUGMENTATIONS", "Draws", "Normalization", "RandConv", "StyleComplement",
           "TextureCorruption", "apply_groups", "augment_labelled", "augmentation_label", "build_augmentation",
           "parse_options"]
