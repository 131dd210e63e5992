"""StyleDDG (Zehtabi, Han, Hosseinalipour, Brinton, MobiHoc'25): decentralized FedDG with style sharing.

Peer-to-peer only (complete, ring, rgg, erdos_renyi graphs; the in-process simulator
``fedstyle.federation.p2p``). Per iteration k, every device i (Algorithm 1):

1. draws a mini-batch x_i and computes its **batch style** psi_i at the outputs of the chosen
   stages (default stages 1–3), per stage and channel (Eq. 15, with Eq. 2–3)::

       psi_i,l = [mean_b mu_b, mean_b sigma_b, var_b mu_b, var_b sigma_b]     (4 x C_l numbers)

   variances divide by B (Eq. 3); mu, sigma are per sample and channel over H x W, sigma =
   sqrt(var + 1e-6). psi_i and theta_i go to the one-hop neighbours N_i — nothing else leaves a
   device (``p2p_share``; ResNet-18: 4 x (64 + 128 + 256) = 1,792 numbers, Remark 4.1; the ConvNet:
   4 x 3 x 64 = 768);
2. computes its gradient on the same mini-batch with, at each chosen stage l and with probability
   p_l (``p``, 0.5), the three style steps below (Eq. 21–23), fed only by its neighbours' psi_j
   (``training_loss`` receives ``payload = {j: psi_j for j in N_i}``);
3. updates theta_i <- theta_i + sum_j p_ij (theta_j - theta_i) - lr g_i with Metropolis–Hastings
   p_ij (Eq. 14; done by the simulator, as for DSGD).

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/styleddg.md.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import PEER_TO_PEER, Algorithm
from fedstyle.algorithms.context import ClientContext
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.stages import parse_stages
from fedstyle.errors import ConfigError
from fedstyle.models.batchnorm import batch_statistics
from fedstyle.payload import Payload
from fedstyle.style import StyleSummary
from fedstyle.style.fused import BetaMixWeights, shift_explore_mix
from fedstyle.style.mixstyle import fires
from fedstyle.style.sharing import stage_styles

#: the three style steps of Eq. 16–19, in the order they run
STEPS = ("shift", "explore", "mix")


@register_method
class StyleDDG(Algorithm):
    name = "styleddg"
    label = "StyleDDG"
    summary = ("decentralized SGD with neighbours' batch styles: StyleShift + StyleExplore + MixStyle "
               "(peer-to-peer only)")
    paper = ("Zehtabi et al., Decentralized federated domain generalization with style sharing: a formal modeling "
             "and convergence analysis, MobiHoc 2025")
    topologies = PEER_TO_PEER

    HPARAMS = (
        HParam("stages", "layer1,layer2,layer3", "backbone stages whose batch style is shared (Eq. 15) and restyled "
               "(Eq. 16-19); the paper: ResNet blocks 1-3 (stages=layer1 is a sensitivity option, reported in "
               "docs/results/styleddg.md)"),
        HParam("p", 0.5, "probability p_l that the style steps run at a stage (Eq. 21)", low=0.0, high=1.0),
        HParam("alpha", 3.0, "StyleExplore extrapolation alpha (Eq. 18; the paper's 3; 0 = no exploration; "
               "alpha=1 is a sensitivity option, reported in docs/results/styleddg.md)", low=0.0),
        HParam("mix_alpha", 0.1, "Beta(mix_alpha, mix_alpha) of MixStyle's lambda (Eq. 19)"),
        HParam("ops", "shift,explore,mix", "style steps that run when a stage fires (the paper: all three; "
               "a subset is an ablation)"),
        HParam("shift_noise", True, "StyleShift adds DSU noise eps*Sigma_j per element (Eq. 17); false: the "
               "neighbour's mean style exactly"),
        HParam("neighbour_draw", "stage", "draw the neighbour per stage (Eq. 21's j_l) or once per iteration",
               choices=("stage", "iteration")),
        HParam("explore_center", "shifted", "E_b of Eq. 18 over the StyleShift output (shifted) or over the "
               "device's own styles (original, as the public StableFDG code)", choices=("shifted", "original")),
        HParam("mix_from", "shifted", "MixStyle's own operand: the StyleShift output's styles mixed with the "
               "permuted explored ones, lambda mu(x) + (1-lambda) mu_e[pi] (shifted, Eq. 19 with Eq. 4-5), or "
               "mixing within the explored styles, lambda mu_e + (1-lambda) mu_e[pi] (explored, Fig. 1c)",
               choices=("shifted", "explored")),
        HParam("negative_sigma", "keep", "a sigma extrapolated below 0 (Eq. 18): keep it (AdaIN inverts the "
               "map's contrast, Eq. 1 as written) or clamp it at 1e-6 (the map goes flat)", choices=("keep", "clamp")),
        HParam("share_stats", "train", "psi_i from BatchNorm with batch statistics as in training (train, Eq. 15; "
               "running statistics untouched) or with running statistics (eval)", choices=("train", "eval")),
        HParam("no_neighbour", "skip", "without any neighbour style: skip StyleShift (skip) or shift to the "
               "device's own batch style (own)", choices=("skip", "own")),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = super().resolve(given)
        stages = parse_stages(hp["stages"])
        if not stages:
            raise ConfigError("styleddg: --hp stages is empty; give backbone stages, "
                              "e.g. --hp stages=layer1,layer2,layer3")
        if len(set(stages)) != len(stages):
            raise ConfigError(f"styleddg: --hp stages={hp['stages']} names a stage twice; list each once, "
                              "e.g. --hp stages=layer1,layer2,layer3")
        steps = parse_stages(hp["ops"])
        unknown = [s for s in steps if s not in STEPS]
        if unknown or not steps or len(set(steps)) != len(steps):
            raise ConfigError(f"styleddg: --hp ops={hp['ops']!r} is not a subset of shift,explore,mix; "
                              "give e.g. --hp ops=shift,explore,mix")
        if not hp["mix_alpha"] > 0:
            raise ConfigError(f"styleddg: --hp mix_alpha={hp['mix_alpha']} must be > 0 (the Beta concentration of "
                              "MixStyle's lambda); the paper uses --hp mix_alpha=0.1")
        return hp

    def __init__(self, hparams: Mapping[str, Any] | None = None, *, num_classes: int, num_clients: int):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        self.stages = parse_stages(self.hp["stages"])
        self.steps = frozenset(parse_stages(self.hp["ops"]))
        self.mix_weights = BetaMixWeights(self.hp["mix_alpha"])  # MixStyle's lambda (Eq. 19)

    # -- model --------------------------------------------------------------------------
    def configure_model(self, model: nn.Module) -> None:
        super().configure_model(model)
        names = model.backbone.stage_names
        for stage in self.stages:
            if stage not in names:
                suggestion = ",".join([n for n in names if n != "stem"][:3])
                raise ConfigError(f"styleddg: the {type(model.backbone).__name__} backbone has no stage {stage!r} "
                                  f"(its stages: {', '.join(names)}); pass e.g. --hp stages={suggestion}")

    # -- peer-to-peer share: psi_i (Eq. 15) ---------------------------------------------------
    @torch.no_grad()
    def p2p_share(self, ctx: ClientContext, model: nn.Module, x: torch.Tensor) -> Payload:
        """psi_i: ``{stage: (4, C) tensor}`` (rows mu_bar, sigma_bar, var mu, var sigma) of this batch."""
        stats = batch_statistics(model) if self.hp["share_stats"] == "train" else nullcontext()
        with ctx.timed("style_share"), stats:
            return stage_styles(model.backbone, x, self.stages)  # no style ops: the plain forward h_theta,l(x_i)

    # -- training: Eq. 21-23 ------------------------------------------------------------------
    def draw_neighbour(self, neighbours: list[int]) -> int | None:
        """A neighbour uniformly at random (torch's CPU generator: no device synchronisation), or None."""
        if not neighbours:
            return None
        return neighbours[int(torch.randint(len(neighbours), ()))]

    def training_loss(self, ctx: ClientContext, model: nn.Module, x, y, payload: Payload) -> torch.Tensor:
        neighbours = sorted(payload)
        once = self.draw_neighbour(neighbours) if self.hp["neighbour_draw"] == "iteration" else None
        counts = {"fired": 0, "shifted": 0}

        def hook(name: str, h: torch.Tensor) -> torch.Tensor:
            if name not in self.stages or not fires(self.hp["p"]):
                return h
            counts["fired"] += 1
            j = once if self.hp["neighbour_draw"] == "iteration" else self.draw_neighbour(neighbours)
            target = None
            if j is not None:
                share = payload[j]
                if name not in share:
                    raise ConfigError(f"styleddg: neighbour {j}'s share has no style for stage {name!r} "
                                      f"(it has {', '.join(sorted(share))}); every device must share the same stages")
                target = StyleSummary.from_tensor(share[name])
            with ctx.timed("style_ops"):
                h, shifted = self.restyle_stage(h, target)
            counts["shifted"] += int(shifted)
            return h

        maps = model.backbone.forward_stages(x, hook)
        loss = F.cross_entropy(model.head(model.neck(maps)), y)
        ctx.log("loss_ce", loss)
        ctx.log("style_fired", counts["fired"] / len(self.stages))
        ctx.log("style_shifted", counts["shifted"] / len(self.stages))
        return loss

    def restyle_stage(self, h: torch.Tensor, target: StyleSummary | None) -> tuple[torch.Tensor, bool]:
        """StyleShift -> StyleExplore -> MixStyle (Eq. 16-19) on features ``h`` at one stage, as one AdaIN
        (:func:`~fedstyle.style.fused.shift_explore_mix`); ``target`` is the neighbour's style at this stage
        (None: no neighbour). Returns the restyled features and whether a style was shifted to."""
        hp = self.hp
        return shift_explore_mix(h, target, shift="shift" in self.steps, explore="explore" in self.steps,
                                 mix_weights=self.mix_weights if "mix" in self.steps else None, alpha=hp["alpha"],
                                 noise=hp["shift_noise"], own_style=hp["no_neighbour"] == "own",
                                 explore_center=hp["explore_center"], mix_from=hp["mix_from"],
                                 min_sigma=1e-6 if hp["negative_sigma"] == "clamp" else None)
