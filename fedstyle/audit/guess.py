"""The best uninformed guess: what the receiver could say about a sender's images without the payload.

A reconstruction leaks only what it gets right beyond what the attacker knew anyway, so every attack is
scored beside a guess that uses the same prior knowledge (public images of the sender's domain) and
nothing from the payload. A weak guess inflates the leak: one random public image scores about 3 dB
below the domain's mean image (issue 36: mnist 9.6 vs 12.4 dB), because the mean is the constant image
with the least expected squared error. So the guess is the best of a few uninformed candidates (the
mean public image and ``random_candidates`` random public images), each metric choosing its own, by
the average score on *held-out* public images: the choice never looks at the victim. This is the
"best constant predictor" baseline of attack evaluation (e.g. Balle, Cherubin & Hayes, IEEE S&P'22,
"Reconstructing Training Data with Informed Adversaries", which compare with the nearest public prior).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedstyle.audit.metrics import psnr, ssim
from fedstyle.errors import ConfigError

#: random public images tried beside the mean image
RANDOM_CANDIDATES = 4
#: held-out public images the candidates are scored on (at most)
HELD_OUT = 256


@dataclass
class Guess:
    """One image (C, H, W) in [0, 1] per metric, and what it is ("the mean public image", "a random public image")."""

    images: dict[str, torch.Tensor]
    names: dict[str, str]

    def batch(self, metric: str, count: int) -> torch.Tensor:
        """``count`` copies of the metric's guess, (count, C, H, W)."""
        return self.images[metric].unsqueeze(0).expand(count, *self.images[metric].shape).contiguous()


def best_uninformed_guess(pool: torch.Tensor, generator: torch.Generator,
                          random_candidates: int = RANDOM_CANDIDATES) -> Guess:
    """The best constant guess for images like ``pool`` (uint8 (N, C, H, W), public images of one domain).

    The pool is split in two random halves: candidates come from the first (its mean image and
    ``random_candidates`` of its images), and each is scored by mean PSNR and mean SSIM against (up to
    :data:`HELD_OUT` of) the second; per metric the best candidate is the guess. A pool of one image is
    its own guess. Images smaller than SSIM's 11-pixel window take the PSNR choice for SSIM too.
    """
    if not isinstance(pool, torch.Tensor) or pool.dim() != 4 or len(pool) == 0:
        raise ConfigError("the guess needs public images (N, C, H, W) of the sender's domain, N >= 1")
    x = pool.float().div(255) if not pool.is_floating_point() else pool.float()
    order = torch.randperm(len(x), generator=generator)
    half = len(x) // 2
    fit, held = (x, x) if half == 0 else (x[order[:half]], x[order[half:]][:HELD_OUT])
    candidates = [fit.mean(0)] + [fit[i] for i in range(min(int(random_candidates), len(fit)))]
    names = ["the mean public image"] + ["a random public image"] * (len(candidates) - 1)
    images, chosen = {}, {}
    for metric, score in (("psnr", psnr), ("ssim", ssim)):
        if metric == "ssim" and min(x.shape[-2:]) < 11:
            images[metric], chosen[metric] = images["psnr"], chosen["psnr"]
            continue
        means = [float(score(c.unsqueeze(0).expand_as(held), held).clamp(max=1e6).mean()) for c in candidates]
        best = max(range(len(candidates)), key=means.__getitem__)
        images[metric], chosen[metric] = candidates[best], names[best]
    return Guess(images, chosen)
