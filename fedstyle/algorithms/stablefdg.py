"""StableFDG (Park et al., NeurIPS'23): style sharing, selective shifting, exploration with
oversampling, and the attention-based feature highlighter.

**Per round, style sharing (Section 3.1 step 1, Eq. 2-3).** Each sampled client, on the weights it
just downloaded (its own BatchNorm layers under ``local_bn``), runs its whole local dataset to
``share_stage`` and sends

    Phi_n = [mu_n, sigma_n, Sigma_n(mu), Sigma_n(sigma)]      (4 x C; means and 1/N variances of the
                                                               per-sample channel statistics, Eq. 2)

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/stablefdg.md.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.stablefdg_pipeline import FeaturePipeline, PipelineDraws
from fedstyle.algorithms.stages import check_known_stages, parse_stages
from fedstyle.algorithms.style_exchange import DP_HPARAMS, style_privacy
from fedstyle.errors import ConfigError
from fedstyle.models.attention import AttentionNeck
from fedstyle.payload import Payload
from fedstyle.seeding import derive_seed
from fedstyle.style import MixStyle, StyleSummary
from fedstyle.style.privacy import count_release, release_metrics
from fedstyle.style.sharing import STYLE_STATS, dataset_style, deranged_exchange

STYLE_KEY = "style"
_QUERY_SECONDS = "stablefdg/query_seconds"
_SWITCHES = ("share", "shift", "oversample", "explore", "mixstyle", "attention")
#: ``explore_repeat`` choices: Eq. 4-5 once per mini-batch (default), or at every firing exploration stage
EXPLORE_REPEATS = ("once", "every_firing_stage")


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
        HParam("style_stats", "train", "the features Phi_n is computed on: one epoch of augmented training batches "
               "with BatchNorm's batch statistics, as a training forward sees them (train: the public code; the "
               "paper does not say) or un-augmented images with the running statistics (eval; the default with "
               "dp_clip, whose bound needs images that do not share batch statistics)", choices=STYLE_STATS),
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
        *DP_HPARAMS,
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = super().resolve(given)
        style_privacy(hp)  # bad dp_* values, noise without clipping
        if hp["alpha"] < 0:
            raise ConfigError(f"alpha (exploration level, Eq. 4-5) must be >= 0, got {hp['alpha']}; "
                              "use 0 for no extrapolation or the paper's 3")
        check_known_stages([hp["share_stage"], *parse_stages(hp["explore_stages"])], "share_stage/explore_stages")
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
        if hp["dp_clip"] > 0 and hp["style_stats"] == "train":
            # the clipping bounds one image's effect on Phi only when images do not share batch statistics
            if "style_stats" in given:
                raise ConfigError("dp_clip bounds one image's effect on Phi only with style_stats=eval (with batch "
                                  "statistics one image moves every image of its batch); use style_stats=eval")
            hp["style_stats"] = "eval"
        # the public code: equal client weights, Phi from training batches
        return apply_reference_code(hp, given, {"aggregation": "uniform", "style_stats": "train"})

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
        self.explore_stages = parse_stages(self.hp["explore_stages"])
        self.mix = MixStyle(p=1.0, alpha=self.hp["mix_alpha"])  # fires when the stage fires
        #: the mini-batch pipeline's random draws (None: :class:`PipelineDraws`); tests force the authors' draws
        self.draws: PipelineDraws | None = None

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
            # wrap the model's own neck: A(z) goes next to "the last embedding feature" (Section 3.2); the public
            # code's cosine scores, biased 1 x 1 convolutions and sum/49 embedding under reference_code (the
            # last only where the backbone pools: the ConvNet's embedding is its flattened map)
            reference = self.hp["reference_code"]
            pools = backbone.feature_dim == backbone.out_channels
            model.set_neck(AttentionNeck(model.neck, backbone.out_channels, self.hp["attention_dim"], cosine=reference,
                                         bias=reference, embedding_divisor=49.0 if reference and pools else None))
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
        privacy = style_privacy(self.hp)  # off by default; noise seeded from the client's round seed
        reference = self.hp["reference_code"]

        def make() -> Payload:
            return {STYLE_KEY: dataset_style(
                model.backbone, ctx.data, self.hp["share_stage"], ctx.device, self.hp["style_images"], ctx.generator,
                privacy, privacy.generator(ctx.seed, "stablefdg"), mode=self.hp["style_stats"],
                batch_size=ctx.train.batch_size, batch_stats=getattr(model, "uses_batch_statistics", True),
                unbiased=reference, spread_eps=1e-6 if reference else 0.0).as_tensor()}

        # a deployed site answers the same question again with the same release (docs/privacy.md)
        released = ctx.release("stablefdg-phi", privacy, make)
        count_release(ctx.state, privacy)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)  # once per round: the phase's time for the metrics
        ctx.state[_QUERY_SECONDS] = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
        return released

    def round_payloads(self, server: ServerContext, client_ids: list[int], queries: dict[int, Payload]
                       ) -> dict[int, Payload]:
        g = torch.Generator().manual_seed(derive_seed(server.seed, "stablefdg-share", server.round))
        return deranged_exchange(client_ids, queries, STYLE_KEY, g,
                                 pairing="greedy" if self.hp["reference_code"] else "derangement")

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
        for name, value in release_metrics(ctx.state, style_privacy(self.hp)).items():
            ctx.log(name, value)  # eps of one release of Phi and of this client's releases so far
        return super().local_train(ctx, model, payload)

    def training_loss(self, ctx: ClientContext, model: nn.Module, x, y, payload: Payload) -> torch.Tensor:
        draws = self.draws or PipelineDraws(self.mix.sample_mix_weights, self.hp["reference_code"])
        step = FeaturePipeline(self.hp, self.num_classes, self.explore_stages, y, self._received(ctx, payload),
                               draws, ctx.timed)
        maps = model.backbone.forward_stages(x, step)
        labels = step.labels
        if self.hp["attention"]:
            with ctx.timed("attention"):
                partner = draws.partners(labels, "next" if self.hp["reference_code"] else "random")
                features = model.neck(maps, partner=partner)
        else:
            features = model.neck(maps)
        loss = F.cross_entropy(model.head(features), labels)
        ctx.log("ce", loss)
        ctx.log("shift_fired", float(step.shifted))
        ctx.log("explore_fired", float(step.explored))
        return loss
