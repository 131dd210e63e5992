"""StableFDG (Park et al., NeurIPS'23): style sharing, selective shifting, exploration with
oversampling, and the attention-based feature highlighter.

**Per round, style sharing (Section 3.1 step 1, Eq. 2-3).** Each sampled client, on the weights it
just downloaded (its own BatchNorm layers under ``local_bn``), in eval mode, runs its whole local
dataset (un-augmented: the eval transform) to ``share_stage`` and sends

    Phi_n = [mu_n, sigma_n, Sigma_n(mu), Sigma_n(sigma)]      (4 x C; means and 1/N variances of the
                                                               per-sample channel statistics, Eq. 2)

(``round_query``; ``style_images=N`` estimates it from a seeded random N images instead, a cost
knob: the pass over all local data costs about 40% of a local epoch on the ConvNet, whose
full-resolution first stage is its most expensive forward). The server gives each participant
another participant's Phi by a seeded random derangement (``round_payloads``: uniform over
derangements by rejection — a few permutations expected — with a bounded number of tries and
Sattolo's cycle as the fallback, so it ends for every count; one participant: nothing is shared
and it trains without shifting). Phi travels up and down as payload bytes.

**Per mini-batch of B samples** (``model.backbone.forward_stages`` with a hook):

1. *Selective style shifting* (step 2), after ``share_stage`` with probability ``shift_p``:
   k = floor(B/2) samples are selected by one iteration of k-means++ on the styles [mu, sigma]
   (:mod:`fedstyle.style.selection`: seeding, one Lloyd step, each cluster's member nearest its
   centre) and keep their style; the other B - k are AdaIN-ed to the received style with noise,
   sigma' = sigma_n' + eps_sigma, mu' = mu_n' + eps_mu, eps ~ N(0, Sigma_n') (source statistics
   detached, as MixStyle's; a draw of sigma' below 1e-6 is floored there). B = 1: nothing to
   select, the sample is shifted.
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
   restyle gives the same features (up to the 1e-6 inside sigma).
5. *Attention-based feature highlighter* (Section 3.2, Eq. 6-8) on the last stage's output, as the
   model's neck (:class:`fedstyle.models.attention.AttentionNeck`): 1 x 1 convolutions to d = 30,
   each sample's query mixed with a random same-class partner in training (itself when its class
   has no other sample in the batch), self-attention at test time, softmax over H x W; the
   attention feature A(z) (C) is concatenated with "the last embedding feature" (Section 3.2), the
   backbone's own embedding — the model's default neck, which the attention neck wraps: global
   average pooling on ResNets and EfficientNet (classifier input 2C, as the paper's ResNet), the
   flattened last map on the Digits-DG ConvNet (64 x 2 x 2 + 64 = 320 at 32 px).

The loss is the cross-entropy over the enlarged batch. ``ctx.log``: ``ce``, ``shift_fired``,
``explore_fired``; ``ctx.timed``: ``kmeans``, ``shift``, ``oversample``, ``explore_mixstyle``,
``attention`` (forward passes of each part) and ``style_query`` (the round's Phi).

**Switches** (the paper's ablation, Table 3): ``share``, ``shift``, ``oversample``, ``explore``,
``mixstyle``, ``attention``. Style only = ``attention=false``; attention only = ``share=false
oversample=false mixstyle=false`` (shift and explore follow: a shift needs a received style,
exploration acts on the oversampled part; giving them ``true`` against that is an error).
Other ablations: ``select=random`` (Table 11), ``oversample_balanced=false`` (Table 12),
``oversample_ratio`` (Fig. 4), ``alpha`` (Fig. 4), ``shift_p`` / ``explore_p`` (Table 13).

**reference_code=true** reproduces the public code's choices: the first B/2 samples of the batch
get the k-means cluster centres' styles and the rest draws around the received style; oversampling
(as exploration) only at the first firing exploration stage (later firing stages: MixStyle only;
no firing stage: no oversampling), the exploration centre over the original batch; attention
partners = the next same-class sample; no style sharing in round 0; equal client weights
(``aggregation=uniform`` unless given; ``explore_repeat`` stays ``once``). Not reproduced: styles
of all 30 clients recomputed each round (here only the participants'), k-means in scikit-learn on
the CPU, B = 32 hard-wired, extra batches fetched for singleton classes, the never-stepped
per-client scheduler (use ``--lr-schedule constant``) and the server's derangement loop that never
ends on Python >= 3.11.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import ConfigError
from fedstyle.models.attention import AttentionNeck, same_class_partners
from fedstyle.models.base import Backbone
from fedstyle.payload import Payload
from fedstyle.seeding import derive_seed
from fedstyle.style import MixStyle, StyleAccumulator, StyleSummary, channel_stats, restyle, sample_styles
from fedstyle.style.mixstyle import fires
from fedstyle.style.oversample import oversample_indices
from fedstyle.style.selection import select_by_kmeans
from fedstyle.style.shift import explore_styles

#: images per forward pass when a client computes its style information (no gradients)
QUERY_BATCH = 256
#: rejection-sampling tries of a uniform derangement before Sattolo's cycle (P(no success) < 1e-199)
DERANGEMENT_TRIES = 1000
STYLE_KEY = "style"
_QUERY_SECONDS = "stablefdg/query_seconds"
_SWITCHES = ("share", "shift", "oversample", "explore", "mixstyle", "attention")
#: ``explore_repeat`` choices: Eq. 4-5 once per mini-batch (default), or at every firing exploration stage
EXPLORE_REPEATS = ("once", "every_firing_stage")


def derangement(n: int, generator: torch.Generator, tries: int = DERANGEMENT_TRIES) -> list[int]:
    """A random permutation ``p`` of range(n) with p[i] != i for every i (n >= 2; n < 2: identity).

    Uniform over derangements: random permutations are drawn until one has no fixed point (about
    e ~ 2.7 draws expected); after ``tries`` failures (never in practice) Sattolo's algorithm gives
    a random n-cycle, which is a derangement. Ends for every n.
    """
    if n < 2:
        return list(range(n))
    for _ in range(tries):
        perm = torch.randperm(n, generator=generator)
        if not bool((perm == torch.arange(n)).any()):
            return perm.tolist()
    perm = list(range(n))
    for i in range(n - 1, 0, -1):  # Sattolo: swap with a strictly earlier position -> one cycle
        j = int(torch.randint(i, (1,), generator=generator))
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def known_stage_names() -> set[str]:
    """Every stage name of the backbones fedstyle knows (to reject a misspelt stage before building)."""
    names: set[str] = set()
    pending = list(Backbone.__subclasses__())
    while pending:
        cls = pending.pop()
        names.update(cls.stage_names)
        pending.extend(cls.__subclasses__())
    return names


def _stages(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


@register_method
class StableFDG(Algorithm):
    name = "stablefdg"
    label = "StableFDG"
    summary = ("style sharing (per-round Phi exchange), k-means++ selective style shifting, class-balanced "
               "oversampling with style exploration, MixStyle, and the attention-based feature highlighter")
    paper = ("Park et al., StableFDG: Style and attention based learning for federated domain generalization, "
             "NeurIPS 2023")
    HPARAMS = (
        HParam("share", True, "style sharing: per-round query of Phi_n (Eq. 2-3), shared by a random derangement"),
        HParam("shift", True, "selective style shifting to the received style (step 2; needs share)"),
        HParam("oversample", True, "feature-level class-balanced oversampling after share_stage (step 3)"),
        HParam("explore", True, "style exploration of the oversampled features (step 4, Eq. 4-5; needs oversample)"),
        HParam("mixstyle", True, "MixStyle over the enlarged batch at each firing exploration stage (step 5)"),
        HParam("attention", True, "attention-based feature highlighter neck (Section 3.2, Eq. 8); the classifier "
               "sees the backbone's own embedding (ResNet: avgpool, C; ConvNet: flattened map) + A(z) (C)"),
        HParam("share_stage", "layer1", "backbone stage whose output gives Phi_n, is shifted and oversampled"),
        HParam("style_images", 0, "images per client for Phi_n (0: all of them, the paper; N: a random N drawn "
               "with the round's seed, a cheaper estimate)", low=0),
        HParam("shift_p", 0.5, "probability of style shifting per mini-batch", low=0.0, high=1.0),
        HParam("select", "kmeans", "which B/2 samples keep their style: k-means++ (paper) or random (Table 11)",
               choices=("kmeans", "random")),
        HParam("oversample_ratio", 1.0, "oversampling size as a multiple of the batch size B (paper: 1)", low=0.0),
        HParam("oversample_balanced", True, "class-balanced oversampling, minority first (false: uniform, Table 12)"),
        HParam("explore_stages", "layer1,layer2,layer3", "stages that may fire: MixStyle at each firing one, "
               "exploration at the first (see explore_repeat)"),
        HParam("explore_p", 0.5, "probability that a stage of explore_stages fires (exploration at the first "
               "firing stage, MixStyle at each)", low=0.0, high=1.0),
        HParam("explore_repeat", "once", "how often Eq. 4-5 extrapolates s~ per mini-batch: once, at the first firing "
               "stage (the paper; the public code), or at every firing stage (compounds to (1+alpha)^k from the "
               "centre after k firings)", choices=EXPLORE_REPEATS),
        HParam("alpha", 3.0, "exploration level alpha of Eq. 4-5 (0: no extrapolation)"),
        HParam("negative_sigma", "keep", "an extrapolated sigma below 0 (Eq. 5): keep it as the equation gives it "
               "(AdaIN's negative scale mirrors the map) or clamp it at 1e-6 (a flat map)", choices=("keep", "clamp")),
        HParam("mix_alpha", 0.1, "MixStyle's Beta(a, a) concentration", low=1e-6),
        HParam("attention_dim", 30, "embedding size d of the attention queries and keys", low=1),
        HParam("reference_code", False, "the public code's choices (see the method's docstring)"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = super().resolve(given)
        if hp["alpha"] < 0:
            raise ConfigError(f"alpha (exploration level, Eq. 4-5) must be >= 0, got {hp['alpha']}; "
                              "use 0 for no extrapolation or the paper's 3")
        for stage in [hp["share_stage"], *_stages(hp["explore_stages"])]:
            if stage not in known_stage_names():
                raise ConfigError(f"unknown backbone stage {stage!r} in share_stage/explore_stages; stages are "
                                  f"{', '.join(sorted(known_stage_names()))}")
        # a shift needs a received style; exploration acts on the oversampled features
        for needs, needed in (("shift", "share"), ("explore", "oversample")):
            if not hp[needed]:
                if needs in given and hp[needs]:
                    raise ConfigError(f"{needs}=true needs {needed}=true ({needs} uses what {needed} provides); "
                                      f"set {needed}=true or drop {needs}")
                hp[needs] = False
        if hp["share"] and not hp["shift"]:
            if "share" in given:
                raise ConfigError("share=true with shift=false shares styles nobody uses; set share=false too")
            hp["share"] = False
        if hp["oversample"] and hp["oversample_ratio"] <= 0:
            raise ConfigError("oversample_ratio must be > 0 with oversample=true; set oversample=false for none")
        if hp["reference_code"] and hp["explore_repeat"] != "once":
            raise ConfigError("reference_code=true explores once per mini-batch, as the public code; "
                              "drop explore_repeat or set reference_code=false")
        if hp["reference_code"] and "aggregation" not in given:
            hp["aggregation"] = "uniform"  # the public code averages client models with equal weights
        return hp

    @classmethod
    def display_name(cls, hp: Mapping[str, Any]) -> str:
        style = [s for s in ("share", "shift", "oversample", "explore", "mixstyle") if hp[s]]
        if not hp["attention"] and style:
            inside = ["style only"] + ([] if len(style) == 5 else [f"no {s}" for s in _SWITCHES[:5] if not hp[s]])
        elif hp["attention"] and not style:
            inside = ["attention only"]
        elif not hp["attention"]:
            inside = ["nothing on"]
        else:
            inside = [f"no {s}" for s in _SWITCHES[:5] if not hp[s]]
        if hp["explore"] and hp["explore_repeat"] != "once":
            inside.append("explore at every firing stage")
        if hp["reference_code"]:
            inside.append("reference code")
        base = super().display_name(hp)
        return cls.label + (f" ({', '.join(inside)})" if inside else "") + base[len(cls.label):]

    def __init__(self, hparams: Mapping[str, Any] | None = None, *, num_classes: int, num_clients: int):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        self.explore_stages = _stages(self.hp["explore_stages"])
        self.mix = MixStyle(p=1.0, alpha=self.hp["mix_alpha"])  # fires when the stage fires

    # -- model --------------------------------------------------------------------------
    def configure_model(self, model: nn.Module) -> None:
        backbone = model.backbone
        names = backbone.stage_names
        for option, stages in (("share_stage", [self.hp["share_stage"]]), ("explore_stages", self.explore_stages)):
            for stage in stages:
                if stage not in names:
                    raise ConfigError(f"the {type(backbone).__name__} backbone has no stage {stage!r} for {option}; "
                                      f"choose among {', '.join(names)}")
        share_at = names.index(self.hp["share_stage"])
        early = [s for s in self.explore_stages if names.index(s) < share_at]
        if self.hp["explore"] and not self.hp["reference_code"] and early:
            raise ConfigError(f"explore_stages {','.join(early)} come before share_stage {self.hp['share_stage']}, "
                              "where the oversampled features exploration acts on are made; drop them or move "
                              "share_stage earlier")
        if self.hp["attention"]:
            # wrap the model's own neck: A(z) goes next to "the last embedding feature" (Section 3.2)
            model.set_neck(AttentionNeck(model.neck, backbone.out_channels, self.hp["attention_dim"]))
        super().configure_model(model)  # after the neck, so that the recorded parameter keys include it

    def uses_phase(self, phase: str) -> bool:
        if phase == "query":
            return self.hp["share"]
        return super().uses_phase(phase)

    # -- style sharing ------------------------------------------------------------------
    @torch.no_grad()
    def round_query(self, ctx: ClientContext, model: nn.Module) -> Payload:
        """Phi_n (Eq. 2-3) of the client's whole local data at ``share_stage`` on the downloaded weights."""
        if self.hp["reference_code"] and ctx.round == 0:
            return {}  # the public code shares nothing in round 0
        start = time.perf_counter()
        acc = StyleAccumulator()
        data, stage, images = ctx.data, self.hp["share_stage"], ctx.data.images
        if 0 < self.hp["style_images"] < len(data):
            chosen = torch.randperm(len(data), generator=ctx.generator)[: self.hp["style_images"]].sort().values
            images = images[chosen.to(images.device)]
        for s in range(0, len(images), QUERY_BATCH):
            x = data.transform(images[s : s + QUERY_BATCH].to(ctx.device, non_blocking=True), train=False)
            acc.add(model.backbone.forward_until(x, stage))
        phi = acc.summary().as_tensor()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)  # once per round: the phase's time for the metrics
        ctx.state[_QUERY_SECONDS] = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
        return {STYLE_KEY: phi}

    def round_payloads(self, server: ServerContext, client_ids: list[int], queries: dict[int, Payload]
                       ) -> dict[int, Payload]:
        senders = [c for c in client_ids if STYLE_KEY in queries.get(c, {})]
        if len(senders) < 2:
            return {}
        g = torch.Generator().manual_seed(derive_seed(server.seed, "stablefdg-share", server.round))
        perm = derangement(len(senders), g)
        return {c: {STYLE_KEY: queries[senders[perm[i]]][STYLE_KEY]} for i, c in enumerate(senders)}

    # -- local training -----------------------------------------------------------------
    def _received(self, ctx: ClientContext, payload: Payload) -> StyleSummary | None:
        if not self.hp["shift"] or STYLE_KEY not in payload:
            return None
        if "received" not in ctx.scratch:
            ctx.scratch["received"] = StyleSummary.from_tensor(payload[STYLE_KEY]).to(ctx.device, torch.float32)
        return ctx.scratch["received"]

    def local_train(self, ctx: ClientContext, model: nn.Module, payload: Payload):
        seconds = ctx.state.pop(_QUERY_SECONDS, None)
        if seconds is not None:
            ctx.log("style_query_seconds", float(seconds))
        return super().local_train(ctx, model, payload)

    def training_loss(self, ctx: ClientContext, model: nn.Module, x, y, payload: Payload) -> torch.Tensor:
        step = _Step(self, ctx, y, self._received(ctx, payload))
        maps = model.backbone.forward_stages(x, step)
        labels = step.labels
        if self.hp["attention"]:
            with ctx.timed("attention"):
                partner = same_class_partners(labels, "next" if self.hp["reference_code"] else "random")
                features = model.neck(maps, partner=partner)
        else:
            features = model.neck(maps)
        loss = F.cross_entropy(model.head(features), labels)
        ctx.log("ce", loss)
        ctx.log("shift_fired", float(step.shifted))
        ctx.log("explore_fired", float(step.explored))
        return loss

    # -- the pieces, on features (B, C, H, W) -------------------------------------------
    def shift(self, x: torch.Tensor, received: StyleSummary, ctx: ClientContext | None = None) -> torch.Tensor:
        """Selective style shifting (step 2): keep floor(B/2) selected samples, AdaIN the rest to
        draws around ``received``; reference code: the first B/2 get the cluster centres' styles."""
        timed = ctx.timed if ctx is not None else _untimed
        b = x.shape[0]
        k = b // 2
        mu, sigma = channel_stats(x)
        mu, sigma = mu.detach(), sigma.detach()
        mu_t, sigma_t = sample_styles(received, b, x)
        if self.hp["reference_code"]:
            with timed("kmeans"):
                _, centres = select_by_kmeans(torch.cat([mu.flatten(1), sigma.flatten(1)], 1), k)
            with timed("shift"):
                c = mu.shape[1]
                mu_t = torch.cat([centres[:, :c].view(k, c, 1, 1), mu_t[k:]])
                sigma_t = torch.cat([centres[:, c:].clamp_min(1e-6).view(k, c, 1, 1), sigma_t[k:]])
                return restyle(x, mu, sigma, mu_t, sigma_t)
        with timed("kmeans"):
            if self.hp["select"] == "kmeans":
                keep, _ = select_by_kmeans(torch.cat([mu.flatten(1), sigma.flatten(1)], 1), k)
            else:
                keep = torch.zeros(b, dtype=torch.bool, device=x.device)
                keep[torch.randperm(b, device=x.device)[:k]] = True
        with timed("shift"):
            return torch.where(keep.view(b, 1, 1, 1), x, restyle(x, mu, sigma, mu_t, sigma_t))

    def oversample(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[s, s~] and its labels: M = round(oversample_ratio * B) extra samples (step 3)."""
        count = int(round(self.hp["oversample_ratio"] * labels.shape[0]))
        idx = oversample_indices(labels, count, self.num_classes, self.hp["oversample_balanced"])
        extra = x.index_select(0, idx)  # not x[idx]: its backward adds duplicates atomically (not reproducible)
        if x.is_contiguous(memory_format=torch.channels_last):
            extra = extra.contiguous(memory_format=torch.channels_last)  # keep the layout convolutions run fastest in
        return torch.cat([x, extra]), torch.cat([labels, labels.index_select(0, idx)])

    def explore_part(self, x: torch.Tensor, start: int, original: int) -> torch.Tensor:
        """Eq. 4-5 on the samples from ``start`` on, around the mean over the whole batch (reference
        code: over the first ``original`` samples), applied by AdaIN."""
        return self.restyle_stage(x, start, original, explore=True, mix=False)

    def restyle_stage(self, x: torch.Tensor, start: int | None, original: int, explore: bool, mix: bool
                      ) -> torch.Tensor:
        """What a firing stage does: exploration of the oversampled part (from ``start`` on, Eq. 4-5),
        then MixStyle over the whole batch (step 5), as ONE AdaIN.

        In sequence, MixStyle would measure an explored sample's statistics as (mu_e, |sigma_e|) (up
        to the 1e-6 inside sigma) and its normalised map as sign(sigma_e) times the original's; so
        the two ops are the single map sign(sigma_e) (x - mu) / sigma * mix(|sigma_e|) + mix(mu_e),
        one pass over the features instead of two (statistics detached, as in both ops).
        """
        explore = explore and start is not None and start < x.shape[0]
        if not explore and not mix:
            return x
        mu, sigma = channel_stats(x)
        mu, sigma = mu.detach(), sigma.detach()
        if explore:
            ref = self.hp["reference_code"]
            centre_mu, centre_sigma = (mu[:original], sigma[:original]) if ref else (mu, sigma)
            center = (centre_mu.mean(0, keepdim=True), centre_sigma.mean(0, keepdim=True))
            floor = 1e-6 if self.hp["negative_sigma"] == "clamp" else None
            mu_e, sigma_e = explore_styles(mu[start:], sigma[start:], self.hp["alpha"], center, min_sigma=floor)
            if not mix:  # the original part stays bit for bit
                return torch.cat([x[:start], restyle(x[start:], mu[start:], sigma[start:], mu_e, sigma_e)])
            mu_t, sigma_t = torch.cat([mu[:start], mu_e]), torch.cat([sigma[:start], sigma_e])
        else:
            mu_t, sigma_t = mu, sigma
        sign = torch.where(sigma_t < 0, -1.0, 1.0).to(sigma.dtype)
        sigma_t = sigma_t.abs()
        lam = self.mix.sample_mix_weights(x.shape[0], x)
        perm = torch.randperm(x.shape[0], device=x.device)
        mu_t, sigma_t = lam * mu_t + (1 - lam) * mu_t[perm], lam * sigma_t + (1 - lam) * sigma_t[perm]
        return restyle(x, mu, sigma * sign, mu_t, sigma_t)


class _untimed:
    def __init__(self, name: str):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Step:
    """The hook of one mini-batch's ``forward_stages``: shifting, oversampling, exploration, MixStyle."""

    def __init__(self, algo: StableFDG, ctx: ClientContext, labels: torch.Tensor, received: StyleSummary | None):
        self.algo, self.ctx, self.hp = algo, ctx, algo.hp
        self.labels = labels
        self.original = labels.shape[0]
        self.extra_start: int | None = None  # where the oversampled part s~ begins
        self.received = received
        self.shifted = False
        self.explored = False
        self.fired_before = False

    def _oversample(self, x: torch.Tensor) -> torch.Tensor:
        with self.ctx.timed("oversample"):
            self.extra_start = x.shape[0]
            x, self.labels = self.algo.oversample(x, self.labels)
        return x

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        hp, reference = self.hp, self.hp["reference_code"]
        if name == hp["share_stage"]:
            if self.received is not None and fires(hp["shift_p"]):
                x = self.algo.shift(x, self.received, self.ctx)
                self.shifted = True
            if hp["oversample"] and not reference:
                x = self._oversample(x)
        if name in self.algo.explore_stages and (hp["explore"] or hp["mixstyle"] or reference) \
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
                with self.ctx.timed("explore_mixstyle"):
                    x = self.algo.restyle_stage(x, self.extra_start, self.original, explore, hp["mixstyle"])
                self.explored = self.explored or explore
        return x
