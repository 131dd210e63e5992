"""RSC (Huang, Wang, Xing, Huang, ECCV'20): Representation Self-Challenging, inside each client.

Applied inside each client under FedAvg, as CCST's Table 1 does ("JiGen and RSC can be directly
integrated into FedAvg without further modifications", CCST Sec. 4). Per mini-batch, with z the last
backbone maps (B, C, h, w) before the neck and h(.) = head(neck(.)) (RSC Sec. 3):

    g      = d( h(z) · onehot(y) ) / dz                the true-class logit's gradient         (Eq. 1)
    spatial-wise (probability 1/2): s[b, i, j] = sum_c z[b, c, i, j] · mean_ij g[b, c] (Grad-CAM); mute
        all channels at the ceil(p·h·w) positions of largest s          mask (B, 1, h, w)
    channel-wise (otherwise):       s[b, c] = mean_ij g[b, c, i, j]; mute the ceil(p·C) channels of
        largest s at every position                                    mask (B, C, 1, 1)     (Eq. 2)
    z~     = z ⊙ m                                                                               (Eq. 3)
    batch percentage: c[b] = softmax(h(z))[b, y] - softmax(h(z~))[b, y]; only the round(b_pct·B)
        samples with the largest drop c > 0 keep their mask, the others are not muted
    L      = CE( h(z ⊙ m), y )      over the whole batch, m constant (no gradient through it)    (Eq. 4-5)

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/rsc.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method

MODES = ("random", "spatial", "channel")
#: reference_code=true: the public code's batch share in its first 10 epochs (resnet.py:72-73), unless given
REFERENCE = {"drop_b": 0.3}
#: reference_code=true: the public code's channel-wise drop, ceil(C / 3.2) channels (resnet.py:117), unless
#: drop_f is given (its spatial drop is drop_f's default, ceil(hw / 3), resnet.py:109)
REFERENCE_CHANNEL_DROP = 1 / 3.2
#: reference_code=true: a sample is muted only if its confidence dropped by more than this (resnet.py:140-143)
REFERENCE_MARGIN = 1e-4


def top_mask(scores: torch.Tensor, drop: float) -> torch.Tensor:
    """(B, n) scores -> (B, n) float mask: 0 at the min(ceil(drop·n), n - 1) largest scores of each row, else 1."""
    n = scores.shape[1]
    k = min(math.ceil(drop * n - 1e-9), n - 1)
    mask = torch.ones_like(scores)
    if k > 0:
        mask.scatter_(1, scores.topk(k, dim=1).indices, 0.0)
    return mask


def muted_samples(before: torch.Tensor, after: torch.Tensor, share: float, margin: float = 0.0,
                  half_even: bool = False) -> torch.Tensor:
    """(B,) bool: the round(share·B) samples with the largest drop ``before - after`` (true-class
    probabilities), among those whose drop exceeds ``margin``. Halves round up, or to even with
    ``half_even`` (Python's ``round``, as the public code)."""
    change = before - after
    count = round(share * len(change)) if half_even else int(math.floor(share * len(change) + 0.5))
    count = min(count, len(change))
    chosen = torch.zeros_like(change, dtype=torch.bool)
    if count > 0:
        chosen[change.topk(count).indices] = True
    return chosen & (change > margin)


@register_method
class RSC(Algorithm):
    name = "rsc"
    label = "RSC"
    summary = "FedAvg whose clients mute the representation's most predictive features (Representation Self-Challenging)"
    paper = "Huang, Wang, Xing, Huang, Self-challenging improves cross-domain generalization, ECCV 2020"
    HPARAMS = (
        HParam("drop_f", 1 / 3, "feature drop percentage p: share of positions (spatial) or channels muted",
               low=0.0, high=1.0),
        HParam("drop_b", 1 / 3, "batch percentage: share of the batch (largest confidence drops) that is muted",
               low=0.0, high=1.0),
        HParam("spatial_p", 0.5, "probability that a batch is muted spatially (else channel-wise), mode=random",
               low=0.0, high=1.0),
        HParam("mode", "random", "spatial or channel muting per batch at random (spatial_p), or always one",
               choices=MODES),
        HParam("spatial_score", "gradcam", "spatial ranking: Grad-CAM, features x channel-mean gradient (gradcam: "
                                            "the public code) or the channel-mean gradient (gradient: the paper)",
               choices=("gradient", "gradcam")),
        HParam("reference_code", False, "the public code's choices: ceil(C/3.2) channels muted channel-wise (unless "
                                        "drop_f is given), batch share 0.3, drops above 1e-4, Python's rounding"),
    )

    def __init__(self, hparams=None, *, num_classes, num_clients):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        reference = self.hp["reference_code"]
        given = hparams or {}
        self.channel_drop = REFERENCE_CHANNEL_DROP if reference and "drop_f" not in given else self.hp["drop_f"]
        self.margin = REFERENCE_MARGIN if reference else 0.0

    @classmethod
    def resolve(cls, given):
        return apply_reference_code(super().resolve(given), given, REFERENCE)

    def choose_spatial(self) -> bool:
        if self.hp["mode"] != "random":
            return self.hp["mode"] == "spatial"
        return bool(torch.rand(()) < self.hp["spatial_p"])

    def rsc_mask(self, model, maps: torch.Tensor, y: torch.Tensor, spatial: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask broadcastable to ``maps``, (B,) bool muted samples) of one batch (Eq. 1-2 and the batch rule)."""
        z = maps.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = model.head(model.neck(z))
            (grad,) = torch.autograd.grad(logits.gather(1, y[:, None]).sum(), z)
        b, c, h, w = maps.shape
        with torch.no_grad():
            channel = grad.mean((2, 3))  # (B, C)
            if spatial:
                score = grad.mean(1) if self.hp["spatial_score"] == "gradient" else (z * channel[:, :, None, None]).sum(1)
                mask = top_mask(score.reshape(b, h * w), self.hp["drop_f"]).view(b, 1, h, w)
            else:
                mask = top_mask(channel, self.channel_drop).view(b, c, 1, 1)
            before = F.softmax(logits.detach(), 1).gather(1, y[:, None]).squeeze(1)
            after = F.softmax(model.head(model.neck(z * mask)), 1).gather(1, y[:, None]).squeeze(1)
            muted = muted_samples(before, after, self.hp["drop_b"], self.margin, half_even=self.hp["reference_code"])
            mask = torch.where(muted.view(b, 1, 1, 1), mask, torch.ones_like(mask))
        return mask, muted

    def training_loss(self, ctx, model, x, y, payload):
        maps = model.backbone.forward_maps(x)
        spatial = self.choose_spatial()
        mask, muted = self.rsc_mask(model, maps, y, spatial)
        ce = F.cross_entropy(model.head(model.neck(maps * mask)), y)
        ctx.log("rsc_ce", ce)
        ctx.log("rsc_muted", muted.float().mean())
        ctx.log("rsc_spatial", float(spatial))
        return ce
