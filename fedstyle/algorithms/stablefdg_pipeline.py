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

``reference_code=true``: the public code's OMA and style_insert (see :mod:`fedstyle.algorithms.stablefdg`):
the first B/2 samples get scikit-learn's k-means cluster centres' styles and the rest draws around the
received style (sigma' clamped at 0); oversampling (as exploration) only at the first firing exploration
stage (none when no stage fires), in the code's level order, the exploration centre over the original
batch; unbiased per-sample variances; normalising statistics that keep their gradients; signed mixing.
Every random draw goes through :class:`PipelineDraws`.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Mapping

import torch

from fedstyle.models.attention import same_class_partners
from fedstyle.style.fused import MixWeights, explore_and_mix, random_permutation
from fedstyle.style.mixstyle import fires
from fedstyle.style.oversample import level_order_indices, oversample_features, oversample_indices
from fedstyle.style.selection import select_by_kmeans, selective_shift, sklearn_kmeans_centres
from fedstyle.style.shift import StyleSummary, standard_normal


class PipelineDraws:
    """Every random draw of one mini-batch's pipeline, in one place (tests replace it to force the
    authors' draws: tests/test_parity_stablefdg.py).

    Paper mode: torch's global generators, drawn as the style ops always drew them. ``reference``:
    the public code's samplers — scikit-learn's k-means (style_insert.py:72-81; its random_state drawn
    from torch's generator, so a seeded run repeats) and the level-by-level order of the oversampled
    extras (oma.py:133-155) — and the same torch draws for the rest.
    """

    def __init__(self, mix_weights: MixWeights, reference: bool = False):
        self._mix_weights, self.reference = mix_weights, reference

    def fires(self, p: float) -> bool:
        return fires(p)

    def normal(self, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        return standard_normal(shape, like)

    def kmeans(self, points: torch.Tensor, k: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(keep mask or None, the k centres)."""
        if self.reference:
            return None, sklearn_kmeans_centres(points, k, int(torch.randint(2**31 - 1, (1,))))
        return select_by_kmeans(points, k)

    def oversample(self, labels: torch.Tensor, count: int, num_classes: int, balanced: bool) -> torch.Tensor:
        if self.reference and balanced:
            return level_order_indices(labels, count)
        return oversample_indices(labels, count, num_classes, balanced)

    def mix_weights(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        return self._mix_weights(batch, like)

    def permutation(self, n: int, device: torch.device) -> torch.Tensor:
        return random_permutation(n, device)

    def partners(self, labels: torch.Tensor, mode: str) -> torch.Tensor:
        return same_class_partners(labels, mode)


class FeaturePipeline:
    """The hook of one mini-batch's ``forward_stages``: shifting, oversampling, exploration, MixStyle.

    ``hp``: StableFDG's resolved hyperparameters; ``labels``: the batch's, extended by the oversampled
    part's (read :attr:`labels` after the forward); ``received``: the style to shift to (None: no
    shift); ``draws``: the random draws (:class:`PipelineDraws`); ``timed(name)`` times each part.
    """

    def __init__(self, hp: Mapping[str, Any], num_classes: int, explore_stages: list[str], labels: torch.Tensor,
                 received: StyleSummary | None, draws: PipelineDraws, timed: Callable[[str], ContextManager]):
        self.hp, self.num_classes, self.explore_stages = hp, num_classes, explore_stages
        self.draws, self.timed = draws, timed
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
            idx = self.draws.oversample(self.labels, count, self.num_classes, self.hp["oversample_balanced"])
            x, self.labels = oversample_features(x, self.labels, count, self.num_classes, indices=idx)
        return x

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        hp, reference, draws = self.hp, self.hp["reference_code"], self.draws
        if name == hp["share_stage"]:
            if self.received is not None and draws.fires(hp["shift_p"]):
                x = selective_shift(x, self.received, "centres" if reference else hp["select"], self.timed,
                                    kmeans=draws.kmeans, normal=draws.normal, unbiased=reference,
                                    sigma_floor=0.0 if reference else 1e-6)
                self.shifted = True
            if hp["oversample"] and not reference:
                x = self._oversample(x)
        if name in self.explore_stages and (hp["explore"] or hp["mixstyle"] or reference) \
                and draws.fires(hp["explore_p"]):
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
                                        mix_weights=draws.mix_weights if hp["mixstyle"] else None,
                                        permutation=draws.permutation, reference=reference)
                self.explored = self.explored or explore
        return x
