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

Decisions (sources: the paper; the public code, DeLightCMU/RSC ``Domain_Generalization/models/resnet.py``;
DomainBed's re-implementation, ``algorithms.RSC``):

- p = ``drop_f`` = 1/3 and b_pct = ``drop_b`` = 1/3: DomainBed's defaults (``rsc_f_drop_factor`` =
  ``rsc_b_drop_factor`` = 1/3) and the public code's spatial fraction and initial batch share
  (``self.pecent = 1/3``); the paper's own values could not be checked against its text here. The public
  code drops ceil(C/3.2) channels and, since its "curriculum" update, mutes a batch share that grows over
  its 30 epochs (0.3, 0.5, 0.7 every 10 epochs); a client has no epochs of its own here, so the share is
  constant.
- Spatial or channel: chosen per batch with probability ``spatial_p`` = 1/2 (the public code's
  ``randint(0, 9) <= 4``), from torch's CPU generator (seeded by the runtime); ``mode=spatial|channel`` fixes it.
- Scores: channel-wise, the gradient averaged over positions (the paper's Sec. 3.2 and the public code);
  it ranks channels exactly as the gradient w.r.t. a globally pooled channel does. Spatial-wise, the
  public code's Grad-CAM map above (``spatial_score=gradcam``, the default), because the paper's score,
  the gradient averaged over channels (``spatial_score=gradient``), is the same at every position when
  the head reads globally pooled maps (d logit / d z[c, i, j] = W[y, c]/(h·w)): on ResNets and
  EfficientNet it cannot rank positions (an earlier version of the public code took it one stage earlier, from layer3's output). On
  the ConvNet, whose head has a weight per position, both rank positions.
- Counts: exactly k = ceil(p·n) entries (n = h·w or C) per sample, the largest scores (ties broken by
  ``topk``), at most n - 1 so that something always survives: the public code's ceil(HW/3) (17 of 7 x 7),
  which for these sizes equals the paper's "at or above the (100 - p)th percentile" (DomainBed's
  np.percentile rule). The muted samples: the round(b_pct·B) largest confidence drops (the public code's
  sorted threshold; DomainBed's percentile gives the same count), and only those with a positive drop (the
  public code clips the drop at 0 and compares strictly, so a sample whose confidence did not drop is never
  muted). Muted entries are set to 0 without rescaling (as both codes).
- The Digits-DG ConvNet flattens its last map (64 x 2 x 2 at 32 x 32) instead of pooling it, so its head
  has a weight per channel and position. The masks act on the map before the flatten, so spatial muting
  zeroes all 64 channels at ceil(4/3) = 2 of the 4 positions and channel muting zeroes ceil(64/3) = 22
  channels at every position; their scores average the per-position gradients as above. At 16 x 16 the
  map is 1 x 1 and spatial muting (k <= n - 1 = 0) mutes nothing; channel muting still applies.
- The score pass runs the neck and head on detached maps (one head-only backward, no second backbone
  pass) in the model's training mode; the training forward reuses the batch's maps, so BatchNorm and the
  style ops see each batch once. The public code's extra horizontally flipped copy of every batch is data
  augmentation and is not added (``--augment crop_flip`` flips instead).
- On the learning check (digits3x, ConvNet, 6 rounds x 15 steps, seed 0) the best source-validation
  accuracy is 0.406 against FedAvg's 0.520: muting slows fitting on a short budget, as intended.
- Logged per round: ``rsc_ce``, ``rsc_muted`` (share of the batch muted) and ``rsc_spatial`` (share of
  batches muted spatially).

``reference_code=true``: the public code's ``ResNet.forward(..., flag=True, epoch)`` (DeLightCMU/RSC
``Domain_Generalization/models/resnet.py``:70-150) in its first ten epochs, for the options not given
explicitly: ceil(C/3.2) channels muted channel-wise (resnet.py:117; spatially ceil(hw/3), resnet.py:109,
drop_f's default), batch share 0.3 (``self.pecent``, set to 0.3 + 0.2·floor(epoch/10) at epochs 0, 10, 20,
resnet.py:71-73), a sample muted only if its confidence dropped by more than 1e-4 (resnet.py:140-143), the
count rounded half to even (Python's ``round``, resnet.py:142). ``tests/test_parity_rsc.py`` checks the
masks, the loss and the gradients against that forward (spatial and channel, fixed choice) on a reduced
ResNet: equal masks, loss and gradients to float precision.

Not reproduced: the share's growth to 0.5 and 0.7 at epochs 10 and 20 (resnet.py:71-73; a client has no
epochs of its own); the flipped copy of every batch (Domain_Generalization/train.py:86-88, data
augmentation); ties at the threshold (the public code mutes entries strictly above the (k+1)-th largest
score, resnet.py:110-112 and 118-120, so tied scores mute fewer than k; here exactly k); how the
spatial/channel choice is drawn (Python's ``random.randint(0, 9) <= 4``, resnet.py:106, here torch's CPU
generator with ``spatial_p``). Public-code limits not carried over: the spatial branch expands a
threshold to 49 positions (resnet.py:111) and reshapes to H x H (resnet.py:114), so it runs only on 7 x 7
square maps (224 px ResNet inputs); every mask is made with ``.cuda()`` (resnet.py:87-141), so it needs a GPU.
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
    family = "feature augmentation"
    shares = "weights"
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
