"""StableFDG's feature pipeline of one mini-batch (Park et al., NeurIPS'23, Section 3.1 steps 2-5): the
hook of ``model.backbone.forward_stages`` that shifts, oversamples, explores and mixes the features,
driven by the method's hyperparameters (:mod:`fedstyle.algorithms.stablefdg`). The feature-level
operations are the style layer's; this module decides when each one runs.

**Per mini-batch of B samples:**

1. *Selective style shifting* (step 2), after ``share_stage`` with probability ``shift_p``:
   k = floor(B/2) samples are selected by one iteration of k-means++ on the styles [mu, sigma]
   (:mod:`fedstyle.style.selection`: seeding, one Lloyd step, each cluster's member nearest its
   centre) and keep their style; the other B - k are AdaIN-ed to the received style with noise,
   sigma' = sigma_n' + eps_sigma, mu' = mu_n' + eps_mu, eps ~ N(0, Sigma_n') (source statistics
   detached, as MixStyle's; a draw of sigma' below 1e-6 is floored there). B = 1: nothing to
   select, the sample is shifted (:func:`~fedstyle.style.selection.selective_shift`).
2. *Feature-level oversampling* (step 3): M = round(``oversample_ratio`` B) extra samples (paper: B),
   class-balanced with minority classes first (:mod:`fedstyle.style.oversample`), appended to the
   batch right after ``share_stage`` — on every mini-batch, after steps 1-2 ("a mini-batch of
   features ... obtained after Steps 1 and 2"), so that the oversampled part s~ exists at every
   exploration stage; their labels follow.
3. *Style exploration* (step 4, Eq. 4-5) ONCE per mini-batch: the stages of ``explore_stages``
   (layer1-3) fire independently with probability ``explore_p``, and the first one that fires
   explores: mu_new = mu + alpha (mu - mean mu), sigma_new likewise, means over the enlarged batch
   [s, s~], applied by AdaIN to s~ only; alpha = 3. The paper applies Eq. 4-5 once to s~ (and the
   public code explores only at the first firing stage); exploring again at every later firing
   stage would move an extra (1 + alpha)^k from the batch centre after k firings (64x at alpha = 3,
   k = 3), a batch whose BatchNorm statistics those outliers dominate. That compounding reading is
   kept as ``explore_repeat=every_firing_stage``; the default is ``once``. With alpha = 3 a
   sigma below 3/4 of the mean turns negative; the paper does not say what then, and Eq. 5 is kept
   as written (``negative_sigma=keep``: AdaIN's negative scale mirrors the normalised map);
   ``negative_sigma=clamp`` floors it at 1e-6 (the channel becomes flat).
4. *MixStyle* (step 5) over the enlarged batch at every firing stage (lambda ~ Beta(0.1, 0.1),
   random partner, statistics detached; later firing stages do MixStyle only). Where exploration
   and MixStyle fire together they are applied as one AdaIN: after exploration MixStyle would
   measure (mu_new, |sigma_new|) and a normalised map sign(sigma_new) times the original's, so one
   restyle gives the same features (up to the 1e-6 inside sigma)
   (:func:`~fedstyle.style.fused.explore_and_mix`).

``reference_code=true``: the first B/2 samples get the k-means cluster centres' styles and the rest
draws around the received style; oversampling (as exploration) only at the first firing exploration
stage (none when no stage fires), the exploration centre over the original batch.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Mapping

import torch

from fedstyle.style.fused import MixWeights, explore_and_mix
from fedstyle.style.mixstyle import fires
from fedstyle.style.oversample import oversample_features
from fedstyle.style.selection import selective_shift
from fedstyle.style.shift import StyleSummary


class FeaturePipeline:
    """The hook of one mini-batch's ``forward_stages``: shifting, oversampling, exploration, MixStyle.

    ``hp``: StableFDG's resolved hyperparameters; ``labels``: the batch's, extended by the oversampled
    part's (read :attr:`labels` after the forward); ``received``: the style to shift to (None: no
    shift); ``mix_weights``: MixStyle's lambda sampler; ``timed(name)`` times each part.
    """

    def __init__(self, hp: Mapping[str, Any], num_classes: int, explore_stages: list[str], labels: torch.Tensor,
                 received: StyleSummary | None, mix_weights: MixWeights, timed: Callable[[str], ContextManager]):
        self.hp, self.num_classes, self.explore_stages = hp, num_classes, explore_stages
        self.mix_weights, self.timed = mix_weights, timed
        self.labels = labels
        self.original = labels.shape[0]
        self.extra_start: int | None = None  # where the oversampled part s~ begins
        self.received = received
        self.shifted = False
        self.explored = False
        self.fired_before = False

    def _oversample(self, x: torch.Tensor) -> torch.Tensor:
        """[s, s~]: M = round(oversample_ratio * B) extra samples (step 3); their labels follow."""
        with self.timed("oversample"):
            self.extra_start = x.shape[0]
            count = int(round(self.hp["oversample_ratio"] * self.labels.shape[0]))
            x, self.labels = oversample_features(x, self.labels, count, self.num_classes,
                                                 self.hp["oversample_balanced"])
        return x

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        hp, reference = self.hp, self.hp["reference_code"]
        if name == hp["share_stage"]:
            if self.received is not None and fires(hp["shift_p"]):
                x = selective_shift(x, self.received, "centres" if reference else hp["select"], self.timed)
                self.shifted = True
            if hp["oversample"] and not reference:
                x = self._oversample(x)
        if name in self.explore_stages and (hp["explore"] or hp["mixstyle"] or reference) \
                and fires(hp["explore_p"]):
            first = not self.fired_before
            self.fired_before = True
            if reference and first and hp["oversample"]:
                x = self._oversample(x)
            # Eq. 4-5 once per mini-batch (the paper; later firing stages: MixStyle only) unless the
            # compounding reading is asked for
            again = hp["explore_repeat"] == "every_firing_stage" and not reference
            explore = (hp["explore"] and self.extra_start is not None and self.extra_start < x.shape[0]
                       and (first or again))
            if explore or hp["mixstyle"]:
                with self.timed("explore_mixstyle"):
                    x = explore_and_mix(x, self.extra_start if explore else None, hp["alpha"],
                                        center_count=self.original if reference else None,
                                        min_sigma=1e-6 if hp["negative_sigma"] == "clamp" else None,
                                        mix_weights=self.mix_weights if hp["mixstyle"] else None)
                self.explored = self.explored or explore
        return x
