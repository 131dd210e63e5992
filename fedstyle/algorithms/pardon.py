"""PARDON: clustered local styles, one median interpolation style, contrastive training
(Nguyen, Johnson, Leach, ICDCS'25; pardon.txt Section III-B).

Setup exchange, once before round 0 (Eq. 1-5; the clustering lives in
:mod:`fedstyle.style.transfer.interpolation`):

1. every client encodes its images (a class-stratified sample of ``style_images``, 2,048 by default;
   0 = all, as the paper) with the style backend's encoder (``style_backend``: ``lite``,
   the offline default; ``adain``, the paper's VGG-19 AdaIN; ``fft``, amplitude spectra), clusters
   them with FINCH (cosine) on their per-image styles [mu, sigma] (``local_features=style``, cheap)
   or on their flattened feature maps (``local_features=flat``, the public code), keeps the
   ``local_partition`` of FINCH's hierarchy (Eq. 1), computes each cluster's style over all pixels
   of its members (Eq. 2) and uploads the mean over its clusters: one style, 2C numbers;
2. the server clusters the client styles with FINCH (Eq. 3, ``server_partition``), averages each
   cluster (Eq. 4) and takes the element-wise median over the cluster styles (Eq. 5, ``median``)
   as the global interpolation style S_g. **Only S_g is broadcast**: no client ever receives
   another client's style, and the server keeps nothing but the number of its clusters;
3. every client transfers each of its images to S_g once (Eq. 6, AdaIN with content/style
   interpolation ``transfer_alpha``) into the tensor cache (``cache_dir()/pardon``) and attaches the
   result as an *aligned view* of its data: with ``stylize=lazy`` (default) an image is transferred
   when a batch first reads it, with ``eager`` all at setup; the pixels are the same.

Local training (Eq. 7-9): each batch x comes with x' = its transfer to S_g under the **identical**
random crop and flip (``ctx.batches(views=True)``). Because S_g is fixed for the whole run, each
image is transferred once and later steps only gather rows of a cached uint8 tensor — once every
image a run reads has been made, no encoder or decoder runs during training (one forward pass of 2B
images per step). z = model.features(x) and z^p = model.features(x') are the featurizer's
output (the neck: pooled features for ResNets, the flattened C x h x w map on the ConvNet). The loss is

    L = CE + gamma1 * L_T + gamma2 * L_reg                                                (Eq. 9)

* CE on the originals only (``ce_views=original``, default): L_CE of Section III-B is
  -1_{y_i} log softmax(g(z_i)) on the ground-truth samples, and the public code does the same.
  ``both`` adds CE on the transfers: the transferred data as extra training data, which in the
  paper appears only in ablation PARDON-v3 (Table V, "style-transferred data is added to the
  training"), a variant *without* the contrastive term;
* BatchNorm (``batchnorm_stats``): x and x' run as one batch [x; x'], but in train mode a plain
  forward would normalise the originals with statistics mixed with the transfers' and let the
  transfers into the running statistics — the originals would train on features that depend on
  S_g although no loss asks for it (measured, centralised digits4 -> mnistm, CE on x only, gamma1 = 0:
  50.2 % with x alone, 31.0 % with the mixed batch; issue 21's audit). ``originals`` (default) normalises x with its own
  batch statistics exactly as a forward of x alone, and x' with those same statistics; the running
  statistics see x only (:func:`originals_batch_norm`). ``frozen`` uses the running statistics for both
  and never updates them (the public code freezes BatchNorm in its pretrained ResNet-50; from scratch
  the layers stay at their initial statistics); ``joint`` is the mixed batch (the transfers as extra
  data, to pair with ``ce_views=both``). Models without BatchNorm are unaffected;
* L_T (Eq. 7), per anchor z_i: [ d(z_i, z_i^p) - mean_{n in N_i} d(z_i, z_n^p) + margin ]_+ with
  N_i the transferred samples of the *other* classes in the batch (``negatives=mean``, Eq. 7; the
  public code: one random negative, ``random``), on L2-normalised features (``normalize=true``,
  default: FaceNet's triplet loss, the paper's [45], and the public code). The paper gives no margin;
  the default 0.3 is the public code's, chosen for its ``TripletMarginLoss``, i.e. the Euclidean
  distance between unit features, so the default distance is that one (``distance=euclidean``).
  Eq. 7 prints the squared distance (``squared``); with the margin 0.3 it is met as soon as CE has
  separated the classes (unit features: mean |z - z^p| ~ 0.45, mean |z - z^n| ~ 1.1 after 200 steps on
  pooled digits4 sources, the centralised probe below): with CE alone L_T is 0.008 squared vs 0.025
  Euclidean, after 200 steps of the full loss 0.000 squared (no gradient left) vs 0.001-0.006
  Euclidean. The Euclidean term is small too — the mean over negatives is far — but keeps a
  gradient on the anchors whose transfer is not yet close; tests/test_pardon.py pins a trained model
  whose Euclidean L_T has a gradient while the squared one is 0. Raw features (``normalize=false``,
  Eq. 7 read literally) make it worse: feature norms ~7.5 dwarf a margin of 0.3 (L_T = 0.000 with
  either distance), so the normalisation stays the default;
  Eq. 7 is printed with plain brackets, no [.]_+; ``hinge=false`` follows that (the term then never
  saturates; on unit features it is bounded), the default keeps FaceNet's and the code's hinge, which
  the words "triplet loss [45]" and "alpha is the margin value" imply. Anchors whose class fills the
  batch have no negative and no triplet; they are left out;
* L_reg (Eq. 8) on the raw features = sum_i ||z_i||^2 + ||z_i^p||^2 divided by the feature
  dimension (``reg_scale=element``, default: the public code's mean over elements, the scale its
  gamma2 = 0.2 was chosen for), or per sample as printed (``sample``; with gamma2 = 0.2 it dominates
  the loss and training collapses, see below);
* ``reduction=mean`` divides both sums over the batch by the number of terms (anchors with a
  triplet; |B| for L_reg), so gamma1 and gamma2 do not depend on the batch size (and match the
  public code's averaged losses, whose gamma values are the defaults); ``sum`` is Eq. 7/8 as printed.

Each term is logged per round (``ce``, ``triplet``, ``reg``). Aggregation: size-weighted FedAvg
(Section III-B "Aggregation"; ``aggregation=uniform`` for equal weights).

Defaults: the paper gives no gamma1, gamma2 or margin; the defaults are the public code's (0.75,
0.2, 0.3), and the scales of L_T and L_reg are chosen so that those values mean what they mean
there (normalised features with the Euclidean distance, L_reg per element). Measured before the
BatchNorm, ce_views and distance defaults changed (x and x' one batch, CE on both, squared distance;
digits4, leave mnistm out, 3 clients, 4 rounds x 15 steps of 64, fft backend, seed 0; FedAvg 44.7 %):
Eq. 7 on raw features with Eq. 8 per sample 10.0 % (chance), raw features with L_reg per element
13.7 %, the defaults of then 51.4 %, the public code's choices under the same SGD 44.2 %, CE on x
and x' alone 48.6 %. Centralised probe with today's defaults (pooled digits4 sources, 2,400 images
and their lite transfers, ConvNet, SGD lr 0.05 momentum 0.9, 200 steps of 32, seed 0; mnistm, 1,000
images): CE alone 62.7 %, + L_T squared 64.6 %, + L_T Euclidean (default) 68.1 %, with margin 1.0
69.0 % (one seed each: within a few points of noise).

``reference_code=true`` sets every choice of the public code the method controls, unless
given explicitly: one random negative, L2-normalised features, non-squared distance with the hinge,
CE on the originals only, frozen BatchNorm, L_reg averaged over elements, transfer_alpha 0.5, the finest FINCH partition on
the server, the lower median, flattened feature maps for the local clustering (encoder backends;
``fft`` keeps its per-image spectra) of all local images (``style_images=0``). The public code's
optimiser (Adam, lr 3e-5) is a run setting shared with every other method, so it is not switched by
the method: give ``--optimizer adam --lr 3e-5 --weight-decay 0 --lr-schedule constant`` (a warning
says so when reference_code runs with another optimiser). Not reproduced: its pretrained ResNet-50 (``--backbone resnet50
--pretrained`` comes close) with a 2048 -> 2048 featurizer head, its encoder read before the ReLU of conv4_1 on ImageNet-normalised inputs.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import ClientResult, check_finite
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.style_exchange import STYLE_IMAGES, StyleExchange, check_style_backend
from fedstyle.errors import ConfigError
from fedstyle.models.batchnorm import BATCHNORM_TYPES
from fedstyle.style.transfer import DEFAULT_BACKEND, TRANSFER_BACKENDS, Style
from fedstyle.style.transfer.augment import pop_style_cost, record_style_cost
from fedstyle.style.transfer.stylize import cached_style, stylize_to_style
from fedstyle.style.transfer.fft import DEFAULT_BAND
from fedstyle.style.transfer.interpolation import (
    LOCAL_FEATURES,
    MEDIANS,
    check_partition,
    interpolation_style,
    local_style,
)

#: the aligned view holding each image's transfer to S_g
VIEW = "pardon_sg"
_CLUSTERS = "pardon/local_clusters"  # ctx.state, from setup_upload to setup_download's metrics
SERVER_CLUSTERS = "pardon/server_clusters"  # server.state: the number of client-style clusters

#: the public code's choices (reference_code=true) for the hyperparameters not given explicitly
REFERENCE = {"negatives": "random", "normalize": True, "distance": "euclidean", "hinge": True, "ce_views": "original",
             "batchnorm_stats": "frozen",
             "reg_scale": "element", "transfer_alpha": 0.5, "server_partition": "finest", "median": "lower",
             "local_features": "flat", "gamma1": 0.75, "gamma2": 0.2, "margin": 0.3, "style_images": 0}
_warned_optimizer = False


def triplet_loss(z: torch.Tensor, zp: torch.Tensor, y: torch.Tensor, *, margin: float, negatives: str = "mean",
                 distance: str = "squared", normalize: bool = False, reduction: str = "mean",
                 hinge: bool = True) -> torch.Tensor:
    """PARDON's triplet loss (Eq. 7): anchors z (B, d), positives zp (their transfers), negatives the
    transfers of other classes (averaged, or one drawn at random from torch's generator per anchor),
    per anchor [d(z, z^p) - d(z, N) + margin]_+ (``hinge=False``: without the [.]_+, as Eq. 7 is printed).

    Anchors without a negative are left out; ``reduction=mean`` averages over the anchors that have one.
    """
    if normalize:
        z, zp = F.normalize(z, dim=1), F.normalize(zp, dim=1)
    other = y[:, None] != y[None, :]
    has_negative = other.any(dim=1)
    if distance == "squared":
        positive = (z - zp).square().sum(1)
    else:
        positive = F.pairwise_distance(z, zp)  # as TripletMarginLoss (eps 1e-6 inside the norm)
    if negatives == "random":
        scores = torch.rand(other.shape, device=z.device).masked_fill(~other, -1.0)
        picked = zp[scores.argmax(dim=1)]
        negative = (z - picked).square().sum(1) if distance == "squared" else F.pairwise_distance(z, picked)
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
            head = own_forward(batch[:originals])
            dims = [0] + list(range(2, batch.dim()))
            var, mean = torch.var_mean(batch[:originals], dim=dims, unbiased=False)
            shape = (1, -1) + (1,) * (batch.dim() - 2)
            tail = (batch[originals:] - mean.view(shape)) * torch.rsqrt(var.view(shape) + layer.eps)
            if layer.affine:
                tail = tail * layer.weight.view(shape) + layer.bias.view(shape)
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


@register_method
class PARDON(StyleExchange):
    """PARDON (see the module docstring)."""

    name = "pardon"
    label = "PARDON"
    summary = ("clients cluster their image styles (FINCH), the server takes the median of the clustered client "
               "styles as one interpolation style S_g; local training pairs each image with its transfer to S_g "
               "(CE + triplet + feature L2)")
    paper = ("Nguyen, Johnson, Leach, PARDON: Privacy-aware and robust federated domain generalization, "
             "ICDCS 2025")
    HPARAMS = (
        HParam("style_backend", DEFAULT_BACKEND, "image style transfer backend, a name registered in "
               f"fedstyle.style.transfer ({', '.join(TRANSFER_BACKENDS.names())})"),
        HParam("vgg_weights", "", "adain backend: path of vgg_normalised.pth"),
        HParam("decoder_weights", "", "adain backend: path of decoder.pth; lite: a `fedstyle style train-decoder` "
               "file (default: the shipped one)"),
        HParam("band", DEFAULT_BAND, "fft backend: half-width of the exchanged low-frequency square", low=0.0, high=1.0),
        STYLE_IMAGES,
        HParam("local_features", "style", "what FINCH clusters a client's images on: per-image style [mu, sigma] "
               "(style) or flattened encoder feature maps (flat, the public code)", choices=LOCAL_FEATURES),
        HParam("local_partition", "coarsest", "FINCH partition inside a client (Eq. 1): finest, coarsest (paper and "
               "code) or a number of clusters"),
        HParam("server_partition", "coarsest", "FINCH partition of the client styles (Eq. 3): coarsest (paper), "
               "finest (public code) or a number of clusters"),
        HParam("median", "midpoint", "median of an even number of cluster styles (Eq. 5): midpoint (mean of the two "
               "middle values) or lower (public code)", choices=MEDIANS),
        HParam("transfer_alpha", 1.0, "content/style interpolation of the transfer to S_g (1 = full AdaIN, Eq. 6; "
               "public code 0.5)", low=0.0, high=1.0),
        HParam("gamma1", 0.75, "weight of the triplet loss L_T (Eq. 9; public code 0.75)", low=0.0),
        HParam("gamma2", 0.2, "weight of the feature regulariser L_reg (Eq. 9; public code 0.2)", low=0.0),
        HParam("margin", 0.3, "triplet margin alpha (Eq. 7; public code 0.3)", low=0.0),
        HParam("negatives", "mean", "triplet negatives: mean over other-class transfers (Eq. 7) or one random one",
               choices=("mean", "random")),
        HParam("distance", "euclidean", "triplet distance: euclidean (public code's TripletMarginLoss, the distance "
               "its margin 0.3 was chosen for) or squared (Eq. 7 as printed; the paper gives no margin for it)",
               choices=("euclidean", "squared")),
        HParam("hinge", True, "triplet per anchor clipped at 0, [.]_+ (FaceNet's triplet loss [45], public code); "
               "false: Eq. 7's brackets as printed, no clipping (the term never saturates)"),
        HParam("normalize", True, "L2-normalise the features before the triplet loss (FaceNet's triplet loss, "
               "the paper's [45]; public code too)"),
        HParam("ce_views", "original", "cross-entropy on the originals only (original: L_CE of Sec. III-B, public "
               "code) or on the originals and their transfers (both: the transfers as extra training data, as in "
               "ablation PARDON-v3, which has no contrastive term)", choices=("original", "both")),
        HParam("batchnorm_stats", "originals", "BatchNorm in the forward of [x; x']: statistics of the originals x "
               "alone, x' normalised with them and not counted in the running statistics (originals); x and x' one "
               "batch (joint); running statistics, never updated (frozen, public code)",
               choices=("originals", "joint", "frozen")),
        HParam("reduction", "mean", "Eq. 7 and 8's sums over the batch: averaged (mean) or as printed (sum)",
               choices=("mean", "sum")),
        HParam("reg_scale", "element", "L_reg per element, i.e. Eq. 8 / feature dim (element, public code) or per "
               "sample ||z||^2 as printed (sample)", choices=("sample", "element")),
        HParam("reference_code", False, "the public code's choices for every option above not given explicitly "
               "(optimizer and lr are run flags: --optimizer adam --lr 3e-5)"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = super().resolve(given)
        check_style_backend(cls.name, hp)
        if hp["band"] != DEFAULT_BAND and hp["style_backend"] != "fft":  # (the runner passes back every value)
            raise ConfigError(f"band is an option of the fft backend, not of style_backend={hp['style_backend']}")
        if hp["reference_code"]:
            for key, value in REFERENCE.items():
                if key not in given and not (key == "local_features" and hp["style_backend"] == "fft"):
                    hp[key] = value
        for key in ("local_partition", "server_partition"):
            hp[key] = str(check_partition(hp[key], key))
        if hp["local_features"] == "flat" and hp["style_backend"] == "fft":
            raise ConfigError("local_features=flat clusters encoder feature maps; the fft backend has none (its "
                              "per-image style is the whole spectrum): use local_features=style or an encoder "
                              "backend (lite, adain)")
        return hp

    @classmethod
    def display_name(cls, hp: Mapping[str, Any]) -> str:
        inside = [hp["style_backend"]] if hp["style_backend"] != DEFAULT_BACKEND else []
        if hp["reference_code"]:
            inside.append("reference code")
        base = super().display_name(hp)
        return cls.label + (f" ({', '.join(inside)})" if inside else "") + base[len(cls.label):]

    def backend_name(self) -> str:
        return self.hp["style_backend"]

    def backend_options(self) -> dict[str, Any]:
        name = self.hp["style_backend"]
        if name == "adain":
            return {"vgg_weights": self.hp["vgg_weights"], "decoder_weights": self.hp["decoder_weights"]}
        if name == "lite":
            return {"decoder_weights": self.hp["decoder_weights"]}
        if name == "fft":
            return {"band": self.hp["band"]}
        return {}

    @staticmethod
    def _partition(value: str) -> str | int:
        return int(value) if value.isdigit() else value

    # -- setup exchange -----------------------------------------------------------------
    def setup_upload(self, ctx, model):
        """The client style: FINCH clusters of the local images, their styles, the mean (Eq. 1-2)."""
        backend = self.backend(ctx)
        start = time.perf_counter()
        images = self.images_for_style(ctx, "pardon-style")  # all, or the class-stratified style_images sample
        recipe = {"method": self.name, "local_features": self.hp["local_features"],
                  "local_partition": self.hp["local_partition"], "backend_options": self.cache_options()}

        def compute():
            with self.progress_bar(len(images), f"client {ctx.client_id} style") as tick:
                local = local_style(backend, images, features=self.hp["local_features"],
                                    partition=self._partition(self.hp["local_partition"]),
                                    batch_size=self.hp["transfer_batch"], progress=tick)
            return local.style, {"images": local.images, "clusters": local.clusters}

        style, numbers, hit = cached_style(recipe, images, backend, compute)  # a rerun does not encode again
        record_style_cost(ctx.state, time.perf_counter() - start, numbers["images"], cached=hit)
        ctx.state[_CLUSTERS] = torch.tensor(float(numbers["clusters"]), dtype=torch.float64)
        return style.to_payload()

    def setup_broadcast(self, uploads, server):
        """S_g from the client styles (Eq. 3-5); the broadcast holds S_g and nothing else."""
        styles = Style.concat([Style.from_payload(uploads[c]) for c in sorted(uploads)])
        s_g, labels = interpolation_style(styles, partition=self._partition(self.hp["server_partition"]),
                                          median=self.hp["median"])
        server.state[SERVER_CLUSTERS] = torch.tensor(int(labels.max()) + 1)
        return s_g.to_payload()

    def setup_download(self, ctx, model, broadcast):
        """Every local image transferred to S_g once (cached) and attached as the aligned view."""
        s_g = Style.from_payload(broadcast)
        backend = self.backend(ctx)
        backend.check(s_g)
        views, metrics = stylize_to_style(self.name, {"method": self.name, "backend_options": self.cache_options()},
                                          ctx.data.images, s_g, backend, self.hp["transfer_alpha"],
                                          self.hp["transfer_batch"], progress=self.progress,
                                          mode=self.hp["stylize"])
        ctx.data.set_view(VIEW, views)
        metrics.update(pop_style_cost(ctx.state))
        if _CLUSTERS in ctx.state:
            metrics["style_clusters"] = float(ctx.state.pop(_CLUSTERS))
        return metrics

    # -- local training -----------------------------------------------------------------
    def pair_loss(self, ctx, model, x: torch.Tensor, xp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. 9 on a batch x and its transfers xp (aligned), each term logged."""
        hp = self.hp
        batch = x.shape[0]
        with self._batch_norm(model, batch):  # one pass over [x; x'], BatchNorm as batchnorm_stats says
            z_all = model.features(torch.cat([x, xp]))
        z, zp = z_all[:batch], z_all[batch:]
        if hp["ce_views"] == "both":
            ce = F.cross_entropy(model.head(z_all), torch.cat([y, y]))
        else:
            ce = F.cross_entropy(model.head(z), y)
        triplet = triplet_loss(z, zp, y, margin=hp["margin"], negatives=hp["negatives"], distance=hp["distance"],
                               normalize=hp["normalize"], reduction=hp["reduction"], hinge=hp["hinge"])
        reg = feature_regularizer(z, zp, reduction=hp["reduction"], scale=hp["reg_scale"])
        ctx.log("ce", ce)
        ctx.log("triplet", triplet)
        ctx.log("reg", reg)
        return ce + hp["gamma1"] * triplet + hp["gamma2"] * reg

    def _batch_norm(self, model: nn.Module, originals: int):
        mode = self.hp["batchnorm_stats"]
        if mode == "originals":
            return originals_batch_norm(model, originals)
        if mode == "frozen":
            return frozen_batch_norm(model)
        return nullcontext(model)  # joint: x and x' are one batch

    def local_train(self, ctx, model, payload):
        self._warn_optimizer(ctx)
        optimizer = ctx.train.make_optimizer(model.parameters())
        total = torch.zeros((), device=ctx.device)
        steps = 0
        with self.count_stylized(ctx) as made:  # transfers to S_g made by this round's batches (stylize=lazy)
            for x, y, _, views in ctx.batches(views=True):
                loss = self.pair_loss(ctx, model, x, views[VIEW], y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.detach()
                steps += 1
        mean_loss = float(total) / max(1, steps)
        check_finite(mean_loss, ctx)
        return ClientResult(train_loss=mean_loss, metrics={**ctx.logged_metrics(), **made})

    def _warn_optimizer(self, ctx) -> None:
        global _warned_optimizer
        if self.hp["reference_code"] and ctx.train.optimizer != "adam" and not _warned_optimizer:
            _warned_optimizer = True
            warnings.warn("pardon reference_code=true sets the method's choices only; the public code's optimiser "
                          "needs the run flags --optimizer adam --lr 3e-5 --weight-decay 0 --lr-schedule constant",
                          stacklevel=2)
