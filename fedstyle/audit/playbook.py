"""The receiver's playbook: every attack on one surface, scored against the truth and an uninformed guess.

The attacker is honest-but-curious: it follows the protocol, holds what the protocol gives it (the
payloads, the global model, the public style encoder) and public data of the same domains (the
run's source-validation images, never in any client's training set). For each payload kind:

- **reconstruction**: images optimised so that their statistic equals the payload
  (:func:`fedstyle.audit.invert.invert_statistics`); scored by PSNR / SSIM against the sender's true
  images (per-image payloads: the image the row describes; set payloads: the best-matching member)
  and by the run's classifier's accuracy on them (the matched image's label). The *guess* row scores
  random public images of the sender's domain the same way: the leak is the gap between the two.
- **membership**: does the payload tell whether an image was in the set it describes (AUC, 0.5 =
  no)? Per-image rows: distance to the nearest shared row; sets: the reference-calibrated score.
- **attributes**: the sender's domain, and its class mix, by linear probes trained on payloads of
  shadow sets drawn from the public data (accuracy against chance; class-mix error against the
  uniform guess).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from fedstyle.audit.attributes import attribute_scores, train_probe
from fedstyle.audit.invert import invert_statistics
from fedstyle.audit.membership import nearest_style_score, set_membership_score
from fedstyle.audit.metrics import best_match, psnr, roc_auc, ssim
from fedstyle.audit.surfaces import Surface


@dataclass
class AuditSettings:
    victims: int = 4             # clients whose payloads are inverted (membership and attributes: all, <= 30)
    candidates: int = 8          # images reconstructed per victim
    steps: int = 200             # optimisation steps per inversion
    shadow_sets: int = 24        # shadow payloads per source domain for the attribute probes
    max_set: int = 512           # a set payload's members scored / used (the payload itself uses all)
    seed: int = 0
    baseline: bool = True        # also invert one weight update (the scale every verdict compares with)


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


def draw_rows(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.randperm(n, generator=g)[: min(k, n)]


def _members(surface: Surface, victim: Victim, g: torch.Generator) -> torch.Tensor:
    """Rows of the victim's images one payload covers (``surface.set_size``): a random draw (CCST's J
    images, StyleDDG's mini-batch) or every image (dataset styles)."""
    n = len(victim.images)
    size = min(n, surface.set_size(n))
    return torch.arange(n) if size == n else draw_rows(n, size, g).sort().values


def reconstruct(surface: Surface, victim: Victim, rows: torch.Tensor, public: Public, classify: Callable,
                settings: AuditSettings, g: torch.Generator) -> dict[str, Any]:
    """Invert the victim's payload; score it and the public guess the same way."""
    members = victim.images[rows]
    release = surface.release(members)
    if surface.per_image:
        pick = draw_rows(len(rows), settings.candidates, g)
        target, truth, truth_labels = release[pick], members[pick], victim.labels[rows][pick]
        shape = (len(pick), *members.shape[1:])
    else:  # scored against (up to max_set of) the members
        pick = draw_rows(len(rows), settings.max_set, g)
        target, truth, truth_labels = release, members[pick], victim.labels[rows][pick]
        shape = (settings.candidates, *members.shape[1:])
    inverted = invert_statistics(surface.statistic, target.float(), shape, steps=settings.steps,
                                 seed=int(torch.randint(1 << 30, (), generator=g)), device=target.device)
    guess_pool = public.images[victim.domain]
    guess = guess_pool[draw_rows(len(guess_pool), shape[0], g)].float().div(255)
    truth01 = truth.float().div(255)
    out: dict[str, Any] = {}
    for name, images in (("recon", inverted.images.detach().cpu()), ("guess", guess)):
        if surface.per_image:
            p, s, idx = psnr(images, truth01), ssim(images, truth01), torch.arange(len(images))
        else:
            p, idx = best_match(images, truth01, psnr)
            s, _ = best_match(images, truth01, ssim)
        predicted = classify(images)
        out[f"{name}_psnr"] = float(p.mean())
        out[f"{name}_ssim"] = float(s.mean())
        out[f"{name}_accuracy"] = float((predicted == truth_labels[idx]).float().mean())
        if name == "recon":
            out["examples"] = list(zip(truth01[idx].unbind(0), images.unbind(0)))
    return out


def membership(surface: Surface, victim: Victim, rows: torch.Tensor, public: Public, settings: AuditSettings,
               g: torch.Generator) -> float:
    """AUC of telling the payload's members from non-members of the same domain."""
    members = victim.images[rows[draw_rows(len(rows), settings.max_set, g)]]
    release = surface.release(victim.images[rows])
    pool = public.images[victim.domain]
    order = draw_rows(len(pool), len(pool), g)
    if surface.per_image:
        outside = torch.ones(len(victim.images), dtype=torch.bool)
        outside[rows] = False
        others = victim.images[outside]
        others = others if len(others) else pool[order]
        s_in = nearest_style_score(surface.image_vectors(members), release)
        s_out = nearest_style_score(surface.image_vectors(others[: settings.max_set]), release)
        return roc_auc(s_in, s_out)
    half = max(1, len(order) // 2)
    reference = surface.image_vectors(pool[order[:half]]).mean(0)
    shared = surface.set_mean(release)
    score = lambda im: set_membership_score(surface.image_vectors(im), shared, reference, len(rows))  # noqa: E731
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
            out[f"{name}_accuracy"], out[f"{name}_chance"] = scores["accuracy"], scores["chance"]
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
        out["domain_accuracy"], out["domain_chance"] = scores["accuracy"], scores["chance"]
    mix_scores = attribute_scores(train_probe(x, y_mix, kind="regress"), tx, t_mix, "regress")
    out.update({f"mix_{k}": v for k, v in mix_scores.items()})
    return out


def attack_surface(surface: Surface, victims: list[Victim], public: Public, classify: Callable,
                   settings: AuditSettings) -> SurfaceResult:
    """Every attack on ``surface``; scores averaged over the victims (reconstruction: the first ``victims``)."""
    g = torch.Generator().manual_seed(settings.seed)
    result = SurfaceResult(surface.method, surface.kind, surface.sender, 0.0)
    if surface.approximation:
        result.notes.append(surface.approximation)
    recon: list[dict[str, Any]] = []
    aucs, sizes = [], []
    for i, victim in enumerate(victims):
        rows = _members(surface, victim, g)
        sizes.append(len(rows) if not surface.per_image else 1)
        if i < settings.victims:
            recon.append(reconstruct(surface, victim, rows, public, classify, settings, g))
        aucs.append(membership(surface, victim, rows, public, settings, g))
    result.set_size = float(sum(sizes) / len(sizes))
    for key in recon[0]:
        if key != "examples":
            result.scores[key] = sum(r[key] for r in recon) / len(recon)
    result.examples = [pair for r in recon for pair in r["examples"]][: settings.candidates]
    result.scores["membership_auc"] = sum(aucs) / len(aucs)
    result.scores.update(attributes(surface, victims, public, settings, g))
    return result
