"""FedGCA's style-complement module: augmented views drawn from several generators.

FedGCA (Sec. 2.3) builds X+ = {x, x'_1, ..., x'_J} from "variants that combine Random Texture
[RandConv], a Mixing Variant of the AugMix strategy, and Multi-scale Texture Corruption"; how the
generators are combined is not stated. ``pick="cycle"`` (default): view j comes from
``ops[j mod len(ops)]``, so J = 3 gives one RandConv, one AugMix and one texture view, each with
fresh random parameters (RandConv: a new filter per view, the paper's "random repetitions").
``pick="sample"``: every sample of every view draws its generator uniformly. A single call
(``augment_views=0``, in-place augmentation) always draws per sample.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from fedstyle.data.augment.common import Augmentation, Draws, apply_groups, check_choice
from fedstyle.errors import ConfigError

PICKS = ("cycle", "sample")


class StyleComplement(Augmentation):
    name = "complement"
    label = "Complement"
    #: generator names this module may combine (filled by the registry: every registered augmentation but itself)
    MEMBERS: dict[str, type[Augmentation]] = {}
    OPTIONS = {
        "ops": (("randconv", "augmix", "texture"), "generators combined, e.g. randconv/augmix/texture"),
        "pick": ("cycle", "cycle: view j uses ops[j mod n]; sample: each sample of each view draws one"),
    }

    def __init__(self, mean: Sequence[float], std: Sequence[float],
                 ops: Sequence[str] = ("randconv", "augmix", "texture"), pick: str = "cycle",
                 suboptions: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__(mean, std)
        self.ops = check_choice("complement ops", ops, sorted(self.MEMBERS))
        if len(set(self.ops)) != len(self.ops):
            raise ConfigError(f"complement ops lists a generator twice: {'/'.join(self.ops)}")
        self.pick = check_choice("complement pick", (pick,), PICKS)[0]
        suboptions = dict(suboptions or {})
        for name in suboptions:
            if name not in self.ops:
                raise ConfigError(f"augment_args sets options of {name!r}, which is not among the complement ops "
                                  f"{'/'.join(self.ops)}")
        self.members = [self.MEMBERS[name](mean, std, **suboptions.get(name, {})) for name in self.ops]

    def apply(self, x: torch.Tensor, draws: Draws) -> torch.Tensor:
        choice = draws.integers(len(self.members), x.shape[0])
        return apply_groups(x, choice, [lambda sub, idx, m=m: m.apply(sub, draws) for m in self.members])

    def views(self, x: torch.Tensor, n: int, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        if self.pick == "sample":
            return super().views(x, n, generator)
        return [self.members[j % len(self.members)](x, generator) for j in range(n)]
