"""Training on a batch x together with an aligned view x' of it (the same images, transformed: PARDON's
transfers to its interpolation style S_g; ``ctx.batches(views=True)`` cuts both with the same crop and
flip), both through the model in one forward pass of [x; x'].

* How BatchNorm treats the pair (:data:`PAIR_BATCHNORM`, :func:`paired_batch_norm`): in train mode a
  plain forward of [x; x'] normalises the originals with statistics mixed with the views' and lets the
  views into the running statistics, so x trains on features that depend on x' although no loss asks
  for it. ``originals`` normalises x with its own batch statistics exactly as a forward of x alone and
  x' with those same statistics, the running statistics seeing x only (:func:`originals_batch_norm`);
  ``frozen`` uses the running statistics for both and never updates them (PARDON's public code freezes
  BatchNorm in its pretrained ResNet-50; from scratch the layers stay at their initial statistics);
  ``joint`` is the plain mixed batch (the views as extra data). Models without BatchNorm are unaffected.
* The losses that tie each feature z to its view's z^p: the triplet loss against the views of the
  other classes (:func:`triplet_loss`, PARDON's Eq. 7) and the L2 penalty on both (:func:`feature_regularizer`,
  PARDON's Eq. 8).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.models.batchnorm import BATCHNORM_TYPES

#: how BatchNorm treats the views in the forward of [x; x'] (see the module docstring)
PAIR_BATCHNORM = ("originals", "joint", "frozen")


def triplet_loss(z: torch.Tensor, zp: torch.Tensor, y: torch.Tensor, *, margin: float, negatives: str = "mean",
                 distance: str = "squared", normalize: bool = False, reduction: str = "mean",
                 hinge: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """PARDON's triplet loss (Eq. 7): anchors z (B, d), positives zp (their transfers), negatives the
    transfers of other classes (averaged, or one drawn at random from torch's generator per anchor),
    per anchor [d(z, z^p) - d(z, N) + margin]_+ (``hinge=False``: without the [.]_+, as Eq. 7 is printed;
    the term then never saturates, on unit features it is bounded).

    Anchors without a negative are left out; ``reduction=mean`` averages over the anchors that have one.

    Distance and normalisation, measured for PARDON's defaults (margin 0.3, the public code's, chosen for
    the Euclidean distance between unit features). Eq. 7 prints the squared distance (``squared``); with
    the margin 0.3 it is met as soon as CE has separated the classes (unit features: mean |z - z^p| ~ 0.45,
    mean |z - z^n| ~ 1.1 after 200 steps on pooled digits4 sources, PARDON's centralised probe): with CE
    alone L_T is 0.008 squared vs 0.025 Euclidean, after 200 steps of the full loss 0.000 squared (no
    gradient left) vs 0.001-0.006 Euclidean. The Euclidean term is small too — the mean over negatives is
    far — but keeps a gradient on the anchors whose transfer is not yet close; tests/test_pardon.py pins a
    trained model whose Euclidean L_T has a gradient while the squared one is 0. Raw features
    (``normalize=False``, Eq. 7 read literally) make it worse: feature norms ~7.5 dwarf a margin of 0.3
    (L_T = 0.000 with either distance), so PARDON normalises by default.

    ``eps``: added inside the Euclidean distance's norm, ||a - b + eps|| (``F.pairwise_distance``'s 1e-6;
    PARDON's public code builds ``TripletMarginLoss(eps=1e-7)``, src/client.py:532).
    """
    if normalize:
        z, zp = F.normalize(z, dim=1), F.normalize(zp, dim=1)
    other = y[:, None] != y[None, :]
    has_negative = other.any(dim=1)
    if distance == "squared":
        positive = (z - zp).square().sum(1)
    else:
        positive = F.pairwise_distance(z, zp, eps=eps)  # as TripletMarginLoss (eps inside the norm)
    if negatives == "random":
        scores = torch.rand(other.shape, device=z.device).masked_fill(~other, -1.0)
        picked = zp[scores.argmax(dim=1)]
        negative = (z - picked).square().sum(1) if distance == "squared" else F.pairwise_distance(z, picked, eps=eps)
    else:
        sq = (z.square().sum(1)[:, None] + zp.square().sum(1)[None, :] - 2.0 * z @ zp.T).clamp_min(0.0)
        dist = sq if distance == "squared" else sq.clamp_min(1e-12).sqrt()
        negative = (dist * other).sum(1) / other.sum(1).clamp_min(1)
    gap = positive - negative + margin
    per_anchor = (F.relu(gap) if hinge else gap) * has_negative
    if reduction == "sum":
        return per_anchor.sum()
    return per_anchor.sum() / has_negative.sum().clamp_min(1)


def feature_regularizer(z: torch.Tensor, zp: torch.Tensor, *, reduction: str = "mean",
                        scale: str = "sample") -> torch.Tensor:
    """PARDON's L_reg (Eq. 8): sum_i ||z_i||^2 + ||z_i^p||^2; ``scale=element`` divides by the feature
    dimension, ``reduction=mean`` by the batch size."""
    total = z.square().sum() + zp.square().sum()
    if scale == "element":
        total = total / z.shape[1]
    return total / z.shape[0] if reduction == "mean" else total


def paired_features(model: nn.Module, x: torch.Tensor, xp: torch.Tensor, batchnorm: str = "originals"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(z, z^p, [z; z^p]): ``model.features`` of x and of its view x' from one forward pass of [x; x'],
    BatchNorm treated as ``batchnorm`` says (:func:`paired_batch_norm`)."""
    batch = x.shape[0]
    with paired_batch_norm(model, batchnorm, batch):
        both = model.features(torch.cat([x, xp]))
    return both[:batch], both[batch:], both


def paired_batch_norm(model: nn.Module, mode: str, originals: int) -> ContextManager[nn.Module]:
    """The BatchNorm treatment ``mode`` (:data:`PAIR_BATCHNORM`) of a forward of [x; x'] whose first
    ``originals`` rows are x."""
    if mode == "originals":
        return originals_batch_norm(model, originals)
    if mode == "frozen":
        return frozen_batch_norm(model)
    return nullcontext(model)  # joint: x and x' are one batch


@contextmanager
def originals_batch_norm(model: nn.Module, originals: int) -> Iterator[nn.Module]:
    """Inside the block, every BatchNorm layer in training mode treats the first ``originals`` rows of
    its input as the batch and the remaining rows (the transfers x') as passengers normalised with
    that batch's statistics:

    * rows ``[:originals]`` go through the layer's own forward alone, so their output and the update
      of the running statistics (and ``num_batches_tracked``) are those of a forward of x alone;
    * rows ``[originals:]`` are normalised with the mean and (biased) variance of rows ``[:originals]``
      and the layer's affine weights; they add nothing to the statistics or the running buffers.

    Gradients of the passengers' losses flow into the statistics of x, as they would through any
    function of the batch. Layers in eval mode (running statistics) and models without BatchNorm are
    unchanged; the layers' ``forward`` is restored on exit.
    """
    patched = [m for m in model.modules() if isinstance(m, BATCHNORM_TYPES)]

    def make_forward(layer: nn.modules.batchnorm._BatchNorm):
        own_forward = layer.forward

        def forward(batch: torch.Tensor) -> torch.Tensor:
            if not layer.training or batch.shape[0] <= originals:
                return own_forward(batch)
            # one split, not three slices: each slice's backward writes its gradient into a zero-filled tensor of
            # the whole batch; at 224 px on ResNet-18 those fills and copies took 0.5 s of a 3 s step
            # (torch.profiler; docs/results/speed.md, "Real scale")
            originals_in, passengers = batch.split([originals, batch.shape[0] - originals])
            head = own_forward(originals_in)
            dims = [0] + list(range(2, batch.dim()))
            var, mean = torch.var_mean(originals_in, dim=dims, unbiased=False)
            shape = (1, -1) + (1,) * (batch.dim() - 2)
            # (x' - mean) / sqrt(var + eps) * weight + bias as one per-channel scale and shift of the C numbers,
            # then one fused pass over the passengers (addcmul) instead of four full-size element-wise ones
            scale = torch.rsqrt(var + layer.eps) * (layer.weight if layer.affine else 1.0)
            shift = -mean * scale + (layer.bias if layer.affine else 0.0)
            tail = torch.addcmul(shift.view(shape), passengers, scale.view(shape))
            return torch.cat([head, tail])

        return forward

    try:
        for layer in patched:
            layer.forward = make_forward(layer)  # an instance attribute shadows the class's forward
        yield model
    finally:
        for layer in patched:
            vars(layer).pop("forward", None)


@contextmanager
def frozen_batch_norm(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every BatchNorm layer normalises with its running statistics and does not update
    them (eval mode; its affine weights still train): the public code's frozen BatchNorm. Every other
    module keeps its mode; the layers' modes are restored on exit."""
    saved = [(m, m.training) for m in model.modules() if isinstance(m, BATCHNORM_TYPES)]
    try:
        for m, _ in saved:
            m.training = False
        yield model
    finally:
        for m, training in saved:
            m.training = training
