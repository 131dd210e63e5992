"""Reconstruction attacks on one payload, each scored against the sender's true images and the best guess.

Two attacks, both minimising the statistic-matching loss of :func:`fedstyle.audit.invert.invert_statistics`:

- ``inversion``: from uniform noise (feature-statistics matching, DeepInversion-style: Yin et al. CVPR'20).
- ``retrieval``: from the public images whose contributions lie nearest the payload (standardised
  Euclidean distance; per-image payloads: one image per shared row, set payloads: the images nearest
  the set's mean contribution), then optimised the same way. Starting from a natural image of the right
  style is the public-prior attack of Balle, Cherubin & Hayes (IEEE S&P'22); retrieval alone is the
  nearest-neighbour baseline of every reconstruction study.

The receiver keeps, per payload, the attack whose loss is lower: a choice it can make without the truth.
Scores (per reconstructed image, so that intervals can be drawn): PSNR / SSIM against the image the
row describes (per-image payloads) or the best-matching member (set payloads), and the run's
classifier's accuracy on them; the same for the uninformed guess (:mod:`fedstyle.audit.guess`): per-image
payloads, the best constant image of the domain; set payloads, random public images of the domain, each
matched to its best member among up to ``max_set`` of them, exactly as the reconstruction is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from fedstyle.audit.guess import RANDOM_CANDIDATES, best_uninformed_guess
from fedstyle.audit.invert import Inversion, invert_statistics
from fedstyle.audit.metrics import best_match, psnr, ssim
from fedstyle.audit.surfaces import Surface
from fedstyle.style.privacy import clip_rows

#: public images the retrieval attack searches (all domains pooled, at most this many)
BANK_LIMIT = 2048
#: PSNR of an exact copy (inf) is scored as this, so that means and intervals stay finite
PSNR_CAP = 100.0


@dataclass
class PublicBank:
    """Public images (float (N, C, H, W) in [0, 1]) and their contributions, standardised (mean, scale)."""

    images: torch.Tensor
    vectors: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor

    def nearest(self, queries: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Images nearest each query row (Q, D): (Q, C, H, W); or, with ``count``, the ``count`` images
        nearest the single query (count, C, H, W)."""
        q = (queries.double().to(self.vectors.device) - self.mean) / self.scale
        d = torch.cdist(q.reshape(-1, q.shape[-1]), self.vectors)
        if count is None:
            return self.images[d.argmin(1).cpu()]
        return self.images[d[0].argsort()[: min(int(count), len(self.images))].cpu()]


def public_bank(surface: Surface, images: list[torch.Tensor], generator: torch.Generator) -> PublicBank:
    """The retrieval attack's search space: up to :data:`BANK_LIMIT` public images of every domain, their
    contributions clipped as the payload's are (the receiver knows C)."""
    pool = torch.cat(images)
    pool = pool[torch.randperm(len(pool), generator=generator)[:BANK_LIMIT]]
    clip = surface.privacy.clip if surface.privacy is not None else 0.0
    vectors = clip_rows(torch.cat([surface.image_vectors(pool[s:s + 256]).double() for s in range(0, len(pool), 256)]),
                        clip)
    mean, std = vectors.mean(0), vectors.std(0, unbiased=False)
    scale = torch.where(std > 1e-12, std, torch.ones_like(std))
    return PublicBank(pool.float().div(255), (vectors - mean) / scale, mean, scale)


@dataclass
class AttackInputs:
    """What an attack gets: the payload (``target``), the images to produce (``shape``), the public bank,
    the uninformed guess (for tests that feed it back), the step budget and a seed."""

    surface: Surface
    target: torch.Tensor
    shape: tuple[int, ...]
    bank: PublicBank
    guess: torch.Tensor
    steps: int
    seed: int


def inversion_attack(a: AttackInputs) -> Inversion:
    return invert_statistics(a.surface.statistic, a.target.float(), a.shape, steps=a.steps, seed=a.seed,
                             device=a.target.device)


def retrieval_attack(a: AttackInputs) -> Inversion:
    if a.surface.per_image:
        start = a.bank.nearest(a.target)
    else:
        start = a.bank.nearest(a.surface.set_mean(a.target).unsqueeze(0), count=a.shape[0])
        if len(start) < a.shape[0]:  # a small bank: repeat its nearest images
            start = start[torch.arange(a.shape[0]) % len(start)]
    return invert_statistics(a.surface.statistic, a.target.float(), a.shape, steps=a.steps, seed=a.seed,
                             device=a.target.device, init=start)


#: name -> attack; the receiver keeps the one with the lower loss
ATTACKS: dict[str, Callable[[AttackInputs], Inversion]] = {"inversion": inversion_attack, "retrieval": retrieval_attack}


def score_images(images: torch.Tensor, truth01: torch.Tensor, labels: torch.Tensor, per_image: bool,
                 classify: Callable) -> dict[str, torch.Tensor]:
    """Per image: PSNR (at most :data:`PSNR_CAP`), SSIM (row i against truth i, or each against its
    best-matching truth) and 1.0 where the classifier gives the matched truth's label; ``index`` the
    matched truth."""
    if per_image:
        p, s, idx = psnr(images, truth01), ssim(images, truth01), torch.arange(len(images))
    else:
        p, idx = best_match(images, truth01, psnr)
        s, _ = best_match(images, truth01, ssim)
    correct = (classify(images) == labels[idx.cpu()]).double()
    return {"psnr": p.double().cpu().clamp(max=PSNR_CAP), "ssim": s.double().cpu(), "accuracy": correct,
            "index": idx.cpu()}


def reconstruct(surface: Surface, members: torch.Tensor, labels: torch.Tensor, pool: torch.Tensor,
                bank: PublicBank, classify: Callable, settings, g: torch.Generator,
                attacks: dict[str, Callable[[AttackInputs], Inversion]] | None = None) -> dict[str, Any]:
    """Every attack on the payload ``surface.release(members)``; scores of the receiver's pick and the guess.

    ``members``/``labels``: the images (uint8) one payload covers; ``pool``: public images of the sender's
    domain (the guess). Returns ``{"rows": {recon_psnr, recon_ssim, recon_accuracy, guess_*: (R,)},
    "scores": {<attack>_psnr, <attack>_ssim, <attack>_loss, ...}, "attack": the pick, "guess": its name,
    "examples": [(truth, recon)]}``.
    """
    release = surface.release(members)
    if surface.per_image:
        pick = torch.randperm(len(members), generator=g)[: settings.candidates]
        target, truth, truth_labels = release[pick], members[pick], labels[pick]
    else:  # scored against (up to max_set of) the members
        pick = torch.randperm(len(members), generator=g)[: settings.max_set]
        target, truth, truth_labels = release, members[pick], labels[pick]
    shape = (len(pick) if surface.per_image else settings.candidates, *members.shape[1:])
    truth01 = truth.float().div(255)
    if surface.per_image:
        guess_of = best_uninformed_guess(pool, g)
        guess = guess_of.batch("psnr", shape[0])
        guess_name = (f"{guess_of.names['psnr']} of the domain, the best by PSNR of the mean public image and "
                      f"{RANDOM_CANDIDATES} random ones on held-out public images (SSIM: {guess_of.names['ssim']})")
    else:
        guess_of = None
        guess = pool[torch.randperm(len(pool), generator=g)[: shape[0]]].float().div(255)
        guess_name = f"{len(guess)} public images of the domain, each matched to its best of {len(truth)} members"
    seed = int(torch.randint(1 << 30, (), generator=g))
    inputs = AttackInputs(surface, target, shape, bank, guess, settings.steps, seed)
    runs = {name: attack(inputs) for name, attack in (attacks or ATTACKS).items()}
    scores: dict[str, float] = {}
    scored = {}
    for name, run in runs.items():
        scored[name] = score_images(run.images.detach().cpu(), truth01, truth_labels, surface.per_image, classify)
        scores.update({f"{name}_psnr": float(scored[name]["psnr"].mean()), f"{name}_loss": float(run.loss),
                       f"{name}_ssim": float(scored[name]["ssim"].mean())})
    chosen = min(runs, key=lambda name: runs[name].loss)
    recon = scored[chosen]
    guessed = score_images(guess, truth01, truth_labels, surface.per_image, classify)
    if guess_of is not None:  # SSIM's own best constant image
        guessed["ssim"] = score_images(guess_of.batch("ssim", shape[0]), truth01, truth_labels, True, classify)["ssim"]
    rows = {f"{who}_{k}": v[k] for who, v in (("recon", recon), ("guess", guessed))
            for k in ("psnr", "ssim", "accuracy")}
    images = runs[chosen].images.detach().cpu()
    return {"rows": rows, "scores": scores, "attack": chosen, "guess": guess_name,
            "examples": list(zip(truth01[recon["index"]].unbind(0), images.unbind(0)))}
