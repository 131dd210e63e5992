"""FedCCRL: cross-client representation learning for FedDG (Wang, Guo, Tang, arXiv 2410.11267; SanphouWang/FedCCRL).

Cross-client feature extension, then dual-stage alignment (the paper's two modules, as its abstract names them):

1. **Statistics exchange** (query phase, each round): each sampled client draws m = max(1, floor(r n)) of its n
   images at random (``upload_ratio`` r = 0.1) and uploads each one's channel mean and standard deviation of the
   normalised input image, mu(x), sigma(x) = sqrt(var + eps) over H x W (2 C = 6 numbers per image). The server
   keeps every client's latest upload and sends each sampled client the pool of the *other* clients' rows.
2. **Cross-client domain transfer**: per batch and view, B rows drawn from the pool (without replacement when
   the pool holds B or more, else with), lambda ~ Beta(0.1, 0.1) per image, and MixStyle towards them,
   x' = sigma_mix (x - mu(x)) / sigma(x) + mu_mix, mu_mix = lambda mu(x) + (1 - lambda) mu_j (sigma likewise).
3. **Domain-invariant perturbation**: AugMix of x' (``perturb``; fedstyle.data.augment's, on pixels in [0, 1]).
4. **Alignment**: with f the representation (the head's input) and p the softmax, V = ``views`` = 2 views,

       L = CE(x) + sum_v CE(x'_v) + lambda1 mean_v SupCon([f(x'_v); f(x)]) + lambda2 JS(p(x), p(x'_1), .., p(x'_V))

   SupCon is Khosla et al.'s L_out at temperature 0.1 (:func:`~fedstyle.algorithms.consistency.supervised_contrastive`);
   JS the mean KL of each prediction to their mean (AugMix's, ``prediction_consistency`` form js). Each view is its
   own forward pass (BatchNorm normalises each with its own statistics), as the code. Aggregation is FedAvg's.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fedccrl.md.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.consistency import prediction_consistency, supervised_contrastive
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.data.augment import BATCH_AUGMENTATIONS, build_augmentation
from fedstyle.data.augment.augmix import ALL_OPS
from fedstyle.data.augment.common import Normalization
from fedstyle.errors import ConfigError
from fedstyle.payload import Payload
from fedstyle.style.mixstyle import MixStyle, fires, mix_styles
from fedstyle.style.stats import channel_stats

MU, SIGMA = "mu", "sigma"  # payload keys: (rows, C) per-image channel statistics
_POOL = "fedccrl/"  # server.state: each client's latest rows, "fedccrl/<mu|sigma>/<client>"
_QUERY_SECONDS = "fedccrl/query_seconds"  # ctx.state: this round's query time, logged by local_train
EPS = 1e-6  # inside sigma's square root, as the code (server/fedccrl.py:21)
_CHUNK = 256

#: reference_code=true: the authors' code's choices for the hyperparameters not given explicitly
REFERENCE = {"perturb_args": "ops=" + "/".join(ALL_OPS)}  # torchvision's AugMix(), all_ops=True


def upload_count(n: int, ratio: float) -> int:
    """Images whose statistics a client of ``n`` images uploads: the code's int(n * r) (fedccrl.py:24), at least 1."""
    return max(1, int(n * ratio))


def pool_indices(pool: int, count: int) -> torch.Tensor:
    """``count`` rows of a pool of ``pool``: distinct when it has enough, else drawn with replacement
    (fedccrl.py:55-63), from torch's global CPU generator, seeded per client, round and phase by the runtime."""
    return torch.randperm(pool)[:count] if pool >= count else torch.randint(0, pool, (count,))


def quantize(x: torch.Tensor, norm: Normalization, slack: float = 0.0) -> torch.Tensor:
    """The code's 8-bit cast of a normalised batch: pixels clamped to [0, 1], truncated to whole levels, in the code's
    float32 arithmetic (x std + mean) 255, which puts 18 % of an unchanged image's levels a rounding error under
    themselves and so a level down, as the code does. ``slack``: within it under a level counts as the level (AugMix's
    output, whole levels in the code, floats here)."""
    return norm.from_pixels(torch.floor(norm.to_pixels(x) * 255.0 + slack) / 255.0)


@register_method
class FedCCRL(Algorithm):
    """Statistics pool, MixStyle towards it, AugMix, SupCon + JS alignment (docs/methods/fedccrl.md)."""

    name = "fedccrl"
    family = "style-sharing"
    shares = "weights; each round, per-image input statistics of a random share of its images (upload_ratio, 10 %)"
    label = "FedCCRL"
    summary = ("clients share per-image input statistics; each restyles its images towards other clients' (MixStyle), "
               "perturbs them (AugMix) and aligns representations (SupCon) and predictions (JS) with the originals")
    paper = ("Wang, Guo, Tang, FedCCRL: Federated domain generalization with cross-client representation learning, "
             "arXiv 2410.11267, 2024")
    HPARAMS = (
        HParam("upload_ratio", 0.1, "r: fraction of a client's images whose statistics it uploads each round",
               low=1e-9, high=1.0),
        HParam("views", 2, "restyled and perturbed views of each image", low=1),
        HParam("lambda1", 0.1, "weight of the representation alignment (supervised contrastive loss)", low=0.0),
        HParam("lambda2", 0.1, "weight of the prediction alignment (Jensen-Shannon divergence)", low=0.0),
        HParam("temperature", 0.1, "tau of the supervised contrastive loss", low=1e-6),
        HParam("mix_alpha", 0.1, "MixStyle's lambda ~ Beta(alpha, alpha)", low=1e-6),
        HParam("mix_p", 1.0, "probability that a view is restyled towards the pool", low=0.0, high=1.0),
        HParam("perturb", "augmix", "augmentation of each restyled view (a name of BATCH_AUGMENTATIONS; none: off)",
               choices=("none", *BATCH_AUGMENTATIONS.names())),
        HParam("perturb_args", "", "its options NAME=VALUE,... as augment_args (default: AugMix's official ones)"),
        HParam("reference_code", False, "the authors' code: unbiased variances, each anchor among its own SupCon "
               "positives, torchvision's AugMix operations and the 8-bit round trip around it"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        return apply_reference_code(super().resolve(given), given, REFERENCE)

    def __init__(self, hparams: Mapping[str, Any] | None = None, *, num_classes: int, num_clients: int):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        if num_clients < 2:
            raise ConfigError("fedccrl restyles each client's images towards the other clients' statistics and needs "
                              "at least 2 clients; use --clients 2 or more")
        if self.hp["perturb"] != "none":  # bad perturb_args fail here, before anything is written
            build_augmentation(self.hp["perturb"], (0.5,) * 3, (0.5,) * 3, self.hp["perturb_args"])
        self.unbiased = bool(self.hp["reference_code"])
        self.mix = MixStyle(p=self.hp["mix_p"], alpha=self.hp["mix_alpha"], eps=EPS, unbiased=self.unbiased)
        self._augmentations: dict[tuple, Any] = {}

    # -- the statistics exchange ----------------------------------------------------------------------------------
    @torch.no_grad()
    def round_query(self, ctx: ClientContext, model) -> Payload:
        """mu and sigma of m = max(1, floor(r n)) images drawn at random, normalised as for evaluation."""
        start = time.perf_counter()
        data = ctx.data
        chosen = torch.randperm(len(data), generator=ctx.generator)[: upload_count(len(data), self.hp["upload_ratio"])]
        mus, sigmas = [], []
        for chunk in chosen.sort().values.split(_CHUNK):
            x = data.transform(data.take(chunk)[0].to(ctx.device), train=False)
            mu, sigma = channel_stats(x.float(), eps=EPS, unbiased=self.unbiased)
            mus.append(mu.flatten(1).cpu())
            sigmas.append(sigma.flatten(1).cpu())
        ctx.state[_QUERY_SECONDS] = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
        return {MU: torch.cat(mus), SIGMA: torch.cat(sigmas)}

    def round_payloads(self, server: ServerContext, client_ids: list[int], queries: dict[int, Payload]
                       ) -> dict[int, Payload]:
        for cid, answer in queries.items():
            if MU in answer:
                server.state[f"{_POOL}{MU}/{cid}"] = answer[MU].detach().to("cpu", torch.float32)
                server.state[f"{_POOL}{SIGMA}/{cid}"] = answer[SIGMA].detach().to("cpu", torch.float32)
        senders = sorted(int(k.rsplit("/", 1)[1]) for k in server.state if k.startswith(f"{_POOL}{MU}/"))
        out: dict[int, Payload] = {}
        for cid in client_ids:
            others = [s for s in senders if s != cid]  # the code pops the client's own rows (fedccrl.py:48-49)
            if others:
                out[cid] = {key: torch.cat([server.state[f"{_POOL}{key}/{s}"] for s in others]) for key in (MU, SIGMA)}
        return out

    # -- local training -------------------------------------------------------------------------------------------
    def local_train(self, ctx, model, payload):
        seconds = ctx.state.pop(_QUERY_SECONDS, None)
        if seconds is not None:
            ctx.log("fedccrl_query_seconds", float(seconds))
        return super().local_train(ctx, model, payload)

    def _pool(self, ctx: ClientContext, payload: Payload) -> tuple[torch.Tensor, torch.Tensor] | None:
        if MU not in payload:
            return None
        if "pool" not in ctx.scratch:  # once per round on the device
            ctx.scratch["pool"] = tuple(payload[k].to(ctx.device) for k in (MU, SIGMA))
        return ctx.scratch["pool"]

    def _augmentation(self, transform):
        key = (tuple(transform.mean), tuple(transform.std))
        if key not in self._augmentations:
            self._augmentations[key] = build_augmentation(self.hp["perturb"], *key, self.hp["perturb_args"])
        return self._augmentations[key]

    def extend(self, ctx: ClientContext, x: torch.Tensor, pool) -> tuple[torch.Tensor, bool]:
        """One view: x restyled towards B rows of the pool (with probability ``mix_p``), then perturbed; and whether
        it was restyled."""
        restyled = pool is not None and fires(self.hp["mix_p"])
        with ctx.timed("fedccrl_transfer"):
            if restyled:
                rows = pool_indices(len(pool[0]), x.shape[0]).to(x.device)
                mu_j, sigma_j = (p[rows].to(x.dtype).view(x.shape[0], x.shape[1], 1, 1) for p in pool)
                mu, sigma = channel_stats(x.detach(), eps=EPS, unbiased=self.unbiased)
                x = mix_styles(x, mu, sigma, mu_j, sigma_j, self.mix.sample_mix_weights(x.shape[0], x))
        if self.hp["perturb"] != "none":
            with ctx.timed("fedccrl_perturb"):
                augmentation = self._augmentation(ctx.data.transform)
                if self.hp["reference_code"]:
                    x = quantize(x, augmentation.norm)
                x = augmentation(x)
                if self.hp["reference_code"]:
                    x = quantize(x, augmentation.norm, slack=1e-3)
        return x, restyled

    def training_loss(self, ctx, model, x, y, payload):
        hp = self.hp
        pool = self._pool(ctx, payload)
        features = model.features(x)
        logits = model.head(features)
        ce = F.cross_entropy(logits, y)
        view_features, view_logits, restyled = [], [], 0
        for _ in range(hp["views"]):
            view, fired = self.extend(ctx, x, pool)
            restyled += fired
            view_features.append(model.features(view))
            view_logits.append(model.head(view_features[-1]))
        ce_views = sum(F.cross_entropy(v, y) for v in view_logits)
        ctx.log("fedccrl_ce", ce)
        ctx.log("fedccrl_ce_views", ce_views)
        ctx.log("fedccrl_transferred", restyled / hp["views"])
        ctx.log("fedccrl_pool", 0 if pool is None else len(pool[0]))
        loss = ce + ce_views
        if hp["lambda1"] > 0:  # the code skips a term whose weight is 0 (fedccrl.py:87-90)
            supcon = sum(supervised_contrastive(f, features, y, hp["temperature"],
                                                include_self=hp["reference_code"])
                         for f in view_features) / hp["views"]
            ctx.log("fedccrl_supcon", supcon)
            loss = loss + hp["lambda1"] * supcon
        if hp["lambda2"] > 0:
            probs = torch.stack([F.softmax(v, dim=1) for v in (logits, *view_logits)])
            js = prediction_consistency(probs, None, form="js", reduction="mean")
            ctx.log("fedccrl_js", js)
            loss = loss + hp["lambda2"] * js
        return loss
