"""The receiver's playbook: every attack on one surface, scored against the truth and an uninformed guess.

The attacker is honest-but-curious: it follows the protocol, holds what the protocol gives it (the
payloads, the global model, the public style encoder) and public data of the same domains (the
run's source-validation images, never in any client's training set). For each payload kind:

- **reconstruction** (:mod:`fedstyle.audit.reconstruction`): inversion from noise and retrieval of the
  nearest public images then inversion, the receiver keeping the lower loss; scored by PSNR / SSIM
  and the run's classifier's accuracy beside the best uninformed guess (:mod:`fedstyle.audit.guess`),
  the gains with a bootstrap interval over victims and their images.
- **membership**: does the payload tell whether an image was in the set it describes (AUC, 0.5 =
  no)? Per-image rows: distance to the nearest shared row, candidates clipped as the release was (the
  likelihood test under isotropic noise); sets: the reference-calibrated score whitened with the public
  covariance plus the release's noise (:func:`fedstyle.audit.membership.public_precision`), on every
  moment the payload carries (means and, from its variance rows, second moments).
- **attributes**: the sender's domain (with a Wilson interval: few senders, few trials), and its class
  mix, by linear probes trained on payloads of shadow sets drawn from the public data (accuracy
  against chance; a majority class only for senders that have one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from fedstyle.audit.attributes import attribute_scores, train_probe
from fedstyle.audit.membership import nearest_style_score, public_precision, set_membership_score
from fedstyle.audit.metrics import bootstrap_interval, roc_auc, wilson_interval
from fedstyle.audit.reconstruction import public_bank, reconstruct
from fedstyle.audit.surfaces import Surface
from fedstyle.style.privacy import clip_rows


@dataclass
class AuditSettings:
    victims: int = 4             # clients whose payloads are inverted (membership and attributes: all, <= 30)
    candidates: int = 8          # images reconstructed per victim
    steps: int = 200             # optimisation steps per inversion
    shadow_sets: int = 24        # shadow payloads per source domain for the attribute probes
    max_set: int = 512           # a set payload's members scored / used (the payload itself uses all)
    seed: int = 0
    baseline: bool = True        # also invert one weight update (the scale every verdict compares with)
    restarts: int = 1            # gradient inversion: random starts, the lowest loss kept
    canary: int = 0              # canary audit of a defended surface: releases per world (0: none)
    progress: bool = False       # progress bars (with the time left) on the long parts: the canary audit


@dataclass
class Victim:
    """One sender: its images (uint8), labels, domain index and client id."""

    client: int
    images: torch.Tensor
    labels: torch.Tensor
    domain: int


@dataclass
class Public:
    """The attacker's public data: images, labels and domain index per source domain."""

    images: dict[int, torch.Tensor]
    labels: dict[int, torch.Tensor]
    num_classes: int


@dataclass
class SurfaceResult:
    method: str
    kind: str
    sender: str
    set_size: float
    scores: dict[str, float] = field(default_factory=dict)
    examples: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (truth, recon) uint8-ready floats
    notes: list[str] = field(default_factory=list)
    guess: str = ""              # what the uninformed guess is


def draw_rows(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.randperm(n, generator=g)[: min(k, n)]


def _members(surface: Surface, victim: Victim, g: torch.Generator) -> torch.Tensor:
    """Rows of the victim's images one payload covers (``surface.set_size``): a random draw (CCST's J
    images, StyleDDG's mini-batch) or every image (dataset styles)."""
    n = len(victim.images)
    size = min(n, surface.set_size(n))
    return torch.arange(n) if size == n else draw_rows(n, size, g).sort().values


def membership(surface: Surface, victim: Victim, rows: torch.Tensor, public: Public, settings: AuditSettings,
               g: torch.Generator) -> float:
    """AUC of telling the payload's members from non-members of the same domain."""
    members = victim.images[rows[draw_rows(len(rows), settings.max_set, g)]]
    release = surface.release(victim.images[rows])
    pool = public.images[victim.domain]
    order = draw_rows(len(pool), len(pool), g)
    privacy = surface.privacy

    def vectors(images: torch.Tensor) -> torch.Tensor:  # each image's contribution as the release clipped it
        return clip_rows(surface.image_vectors(images), privacy.clip if privacy is not None else 0.0)

    if surface.per_image:
        outside = torch.ones(len(victim.images), dtype=torch.bool)
        outside[rows] = False
        others = victim.images[outside]
        others = others if len(others) else pool[order]
        s_in = nearest_style_score(vectors(members), release)
        s_out = nearest_style_score(vectors(others[: settings.max_set]), release)
        return roc_auc(s_in, s_out)
    half = max(1, len(order) // 2)
    public_vectors = vectors(pool[order[:half]])
    n = len(rows)
    # noise of std sigma on each sum is sigma / n on each mean, / sqrt(T) after averaging T releases; whitening a
    # mean of n vectors by Sigma / n + tau^2 I is whitening one vector by Sigma + n tau^2 I
    tau2 = (privacy.std / n) ** 2 / surface.releases if privacy is not None and privacy.noise > 0 else 0.0
    precision = public_precision(public_vectors, extra_variance=n * tau2)
    shared = surface.set_mean(release)

    def score(images: torch.Tensor) -> torch.Tensor:
        return set_membership_score(vectors(images), shared, public_vectors.mean(0), n, precision=precision)

    return roc_auc(score(members), score(pool[order[half:]][: settings.max_set]))


def _features(surface: Surface, release: torch.Tensor) -> torch.Tensor:
    return release.flatten().float()


def attributes(surface: Surface, victims: list[Victim], public: Public, settings: AuditSettings,
               g: torch.Generator) -> dict[str, float]:
    """Domain (and class mix, or an image's class) of senders, by probes trained on shadow payloads."""
    domains = sorted(public.images)
    out: dict[str, float] = {}
    if surface.per_image:  # each shared row describes one image: its domain and class
        feats, dom, cls = [], [], []
        for d in domains:
            pick = draw_rows(len(public.images[d]), settings.max_set, g)
            feats.append(surface.release(public.images[d][pick]).float())
            dom.append(torch.full((len(pick),), d))
            cls.append(public.labels[d][pick])
        x = torch.cat(feats)
        test = [(surface.release(v.images[: settings.max_set]).float(), v) for v in victims]
        tx = torch.cat([t for t, _ in test])
        tdom = torch.cat([torch.full((len(t),), v.domain) for t, v in test])
        tcls = torch.cat([v.labels[: settings.max_set] for _, v in test])
        for name, y, ty in (("domain", torch.cat(dom), tdom), ("class", torch.cat(cls), tcls)):
            if len(torch.unique(y)) < 2:
                continue  # one public domain (or class): nothing to tell apart
            scores = attribute_scores(train_probe(x, y, kind="classify"), tx, ty, "classify")
            out.update(_proportion(name, scores["accuracy"], len(ty)))
            out[f"{name}_chance"] = scores["chance"]
        return out
    sizes = [min(len(v.images), surface.set_size(len(v.images))) for v in victims]
    rng = np.random.default_rng(settings.seed)
    feats, dom, mix = [], [], []
    for d in domains:
        pool, labels = public.images[d], public.labels[d]
        for k in range(settings.shadow_sets):
            size = sizes[k % len(sizes)]
            weights = torch.from_numpy(rng.dirichlet(np.ones(public.num_classes))).float()  # a random class mix
            pick = torch.multinomial(weights[labels] + 1e-12, size, replacement=True, generator=g)
            feats.append(_features(surface, surface.release(pool[pick])))
            dom.append(d)
            mix.append(torch.bincount(labels[pick], minlength=public.num_classes).float() / size)
    x, y_dom, y_mix = torch.stack(feats), torch.tensor(dom), torch.stack(mix)
    tx = torch.stack([_features(surface, surface.release(v.images[_members(surface, v, g)])) for v in victims])
    t_dom = torch.tensor([v.domain for v in victims])
    t_mix = torch.stack([torch.bincount(v.labels, minlength=public.num_classes).float() / len(v.labels)
                         for v in victims])
    if len(domains) > 1:  # one public domain: no domain to infer
        scores = attribute_scores(train_probe(x, y_dom, kind="classify"), tx, t_dom, "classify")
        out.update(_proportion("domain", scores["accuracy"], len(t_dom)))
        out["domain_chance"] = scores["chance"]
    mix_scores = attribute_scores(train_probe(x, y_mix, kind="regress"), tx, t_mix, "regress")
    out.update({f"mix_{k}": v for k, v in mix_scores.items()})
    return out


def _proportion(name: str, accuracy: float, trials: int) -> dict[str, float]:
    """``<name>_accuracy`` of ``trials`` predictions with its 95 % Wilson interval (``_lo``, ``_hi``) and ``_n``."""
    low, high = wilson_interval(round(accuracy * trials), trials)
    return {f"{name}_accuracy": accuracy, f"{name}_lo": low, f"{name}_hi": high, f"{name}_n": float(trials)}


def summarise_reconstructions(recon: list[dict[str, Any]], seed: int = 0) -> dict[str, float]:
    """Means over victims of the per-victim means, each attack's mean scores, the share of victims where the
    receiver picked retrieval, and the PSNR / SSIM gains over the guess with 95 % bootstrap intervals
    (:func:`fedstyle.audit.metrics.bootstrap_interval`: victims, then their images, resampled)."""
    out: dict[str, float] = {}
    for key in recon[0]["rows"]:
        out[key] = sum(float(r["rows"][key].mean()) for r in recon) / len(recon)
    for key in recon[0]["scores"]:
        out[key] = sum(r["scores"][key] for r in recon) / len(recon)
    out["retrieval_share"] = sum(r["attack"] == "retrieval" for r in recon) / len(recon)
    out["recon_victims"] = float(len(recon))
    for metric in ("psnr", "ssim"):
        gains = [r["rows"][f"recon_{metric}"] - r["rows"][f"guess_{metric}"] for r in recon]
        out[f"{metric}_gain"] = out[f"recon_{metric}"] - out[f"guess_{metric}"]
        out[f"{metric}_gain_lo"], out[f"{metric}_gain_hi"] = bootstrap_interval(gains, seed=seed)
    return out


def attack_surface(surface: Surface, victims: list[Victim], public: Public, classify: Callable,
                   settings: AuditSettings, *, attributes_too: bool = True) -> SurfaceResult:
    """Every attack on ``surface``; scores averaged over the victims (reconstruction: the first ``victims``).
    ``attributes_too=False`` skips the attribute probes (a combination of releases: the domain is read
    from one already)."""
    g = torch.Generator().manual_seed(settings.seed)
    result = SurfaceResult(surface.method, surface.kind, surface.sender, 0.0)
    if surface.approximation:
        result.notes.append(surface.approximation)
    bank = public_bank(surface, [public.images[d] for d in sorted(public.images)], g)
    recon: list[dict[str, Any]] = []
    aucs, sizes = [], []
    for i, victim in enumerate(victims):
        rows = _members(surface, victim, g)
        sizes.append(len(rows) if not surface.per_image else 1)
        if i < settings.victims:
            recon.append(reconstruct(surface, victim.images[rows], victim.labels[rows], public.images[victim.domain],
                                     bank, classify, settings, g))
        aucs.append(membership(surface, victim, rows, public, settings, g))
    result.set_size = float(sum(sizes) / len(sizes))
    result.scores.update(summarise_reconstructions(recon, settings.seed))
    result.guess = recon[0]["guess"]
    result.examples = [pair for r in recon for pair in r["examples"]][: settings.candidates]
    result.scores["membership_auc"] = sum(aucs) / len(aucs)
    if attributes_too:
        result.scores.update(attributes(surface, victims, public, settings, g))
    return result
