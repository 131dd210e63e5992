"""PARDON: clustered local styles, one median interpolation style, contrastive training
(Nguyen, Johnson, Leach, ICDCS'25; pardon.txt Section III-B).

Setup, once (Eq. 1-5): each client clusters its images' styles with FINCH and uploads the mean of its
clusters' styles; the server clusters those and broadcasts only their element-wise median S_g. Each client
restyles its images to S_g once (Eq. 6, AdaIN) and trains on CE + gamma1 * triplet + gamma2 * L2 between
each image's features and its transfer's (Eq. 7-9).

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/pardon.md.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.paired_views import PAIR_BATCHNORM, feature_regularizer, paired_features, triplet_loss
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.style_exchange import STYLE_IMAGES, StyleBackendExchange, check_style_backend
from fedstyle.errors import ConfigError
from fedstyle.style.transfer import Style
from fedstyle.style.transfer.feature_adain import FeatureAdaIN
from fedstyle.style.transfer.fft import DEFAULT_BAND
from fedstyle.style.transfer.interpolation import CLIENT_STYLES, LOCAL_FEATURES, MEDIANS, check_partition
from fedstyle.style.transfer.interpolation import interpolation_style, local_style

#: the aligned view holding each image's transfer to S_g
VIEW = "pardon_sg"
_TRANSFERS = "pardon/transfers"  # ctx.scratch: the current batch's x', from training_batches to training_loss
SERVER_CLUSTERS = "pardon/server_clusters"  # server.state: the number of client-style clusters

#: the public code's eps inside the triplet distance (``TripletMarginLoss(eps=1e-7)``, src/client.py:532; fedstyle's
#: default is ``F.pairwise_distance``'s 1e-6): reference_code uses it
TRIPLET_EPS_CODE = 1e-7
#: the public code's choices (reference_code=true) for the hyperparameters not given explicitly
REFERENCE = {"negatives": "random", "normalize": True, "distance": "euclidean", "hinge": True, "ce_views": "original",
             "batchnorm_stats": "frozen",
             "reg_scale": "element", "transfer_alpha": 0.5, "server_partition": "finest", "median": "lower",
             "local_features": "flat", "client_style": "pooled", "gamma1": 0.75, "gamma2": 0.2, "margin": 0.3, "style_images": 0}
_warned_optimizer = False


@register_method
class PARDON(StyleBackendExchange):
    """PARDON (docs/methods/pardon.md)."""

    name = "pardon"
    family = "style-sharing"
    shares = "weights; once, clustered style statistics per client"
    label = "PARDON"
    summary = ("clients cluster their image styles (FINCH), the server takes the median of the clustered client "
               "styles as one interpolation style S_g; local training pairs each image with its transfer to S_g "
               "(CE + triplet + feature L2)")
    paper = ("Nguyen, Johnson, Leach, PARDON: Privacy-aware and robust federated domain generalization, "
             "ICDCS 2025")
    HPARAMS = (
        HParam("band", DEFAULT_BAND, "fft backend: half-width of the exchanged low-frequency square", low=0.0, high=1.0),
        STYLE_IMAGES,
        HParam("local_features", "style", "what FINCH clusters a client's images on: per-image style [mu, sigma] "
               "(style: the text after Eq. 1 compares image styles) or flattened encoder feature maps (flat: Eq. 1's "
               "Phi(C_k), and the public code)", choices=LOCAL_FEATURES),
        HParam("client_style", "mean", "the client style from its cluster styles: their mean (S_Ck after Eq. 2) or "
               "the style of their pooled first and second moments, equal weight per cluster (pooled, public code)",
               choices=CLIENT_STYLES),
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
               choices=PAIR_BATCHNORM),
        HParam("reduction", "mean", "Eq. 7 and 8's sums over the batch: averaged (mean) or as printed (sum)",
               choices=("mean", "sum")),
        HParam("reg_scale", "element", "L_reg per element, i.e. Eq. 8 / feature dim (element, public code) or per "
               "sample ||z||^2 as printed (sample)", choices=("sample", "element")),
        HParam("reference_code", False, "the public code's choices for every option above not given explicitly, "
               "and the transfer's content statistics with the unbiased variance (optimizer and lr are run flags: "
               "--optimizer adam --lr 3e-5)"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = super().resolve(given)
        check_style_backend(cls.name, hp)  # the adain weight files too
        if hp["band"] != DEFAULT_BAND and hp["style_backend"] != "fft":  # (the runner passes back every value)
            raise ConfigError(f"band is an option of the fft backend, not of style_backend={hp['style_backend']}")
        fft = hp["style_backend"] == "fft"  # its per-image spectra stay what FINCH clusters, even for the code
        apply_reference_code(hp, given, {k: v for k, v in REFERENCE.items() if not (fft and k == "local_features")})
        for key in ("local_partition", "server_partition"):
            hp[key] = str(check_partition(hp[key], key))
        if hp["local_features"] == "flat" and hp["style_backend"] == "fft":
            raise ConfigError("local_features=flat clusters encoder feature maps; the fft backend has none (its "
                              "per-image style is the whole spectrum): use local_features=style or an encoder "
                              "backend (lite, adain)")
        return hp

    def backend(self, ctx):
        """The style backend; under ``reference_code`` an encoder backend normalises the content with the
        unbiased variance in transfer, as the public code (``src/functions.py:4-13`` in ``:26-35``)."""
        backend = super().backend(ctx)
        if self.hp["reference_code"] and isinstance(backend, FeatureAdaIN):
            backend.unbiased_content = True
        return backend

    # -- setup exchange -----------------------------------------------------------------
    def setup_upload(self, ctx, model):
        """The client style: FINCH clusters of the local images, their styles, the mean (Eq. 1-2)."""
        images = self.images_for_style(ctx, "pardon-style")  # all, or the class-stratified style_images sample
        recipe = {"local_features": self.hp["local_features"], "local_partition": self.hp["local_partition"]}
        if self.hp["client_style"] != "mean":  # the default keeps its old cache key
            recipe["client_style"] = self.hp["client_style"]

        def compute(backend, tick):
            local = local_style(backend, images, features=self.hp["local_features"],
                                partition=check_partition(self.hp["local_partition"]),
                                batch_size=self.hp["transfer_batch"], combine=self.hp["client_style"], progress=tick)
            return local.style, {"images": local.images, "clusters": local.clusters}

        # a rerun does not encode again; the cluster count becomes setup_download's style_clusters metric
        return self.computed_style(ctx, images, recipe, len(images), compute)[0].to_payload()

    def setup_broadcast(self, uploads, server):
        """S_g from the client styles (Eq. 3-5); the broadcast holds S_g and nothing else."""
        styles = Style.concat([Style.from_payload(uploads[c]) for c in sorted(uploads)])
        s_g, labels = interpolation_style(styles, partition=check_partition(self.hp["server_partition"]),
                                          median=self.hp["median"])
        server.state[SERVER_CLUSTERS] = torch.tensor(int(labels.max()) + 1)
        return s_g.to_payload()

    def setup_download(self, ctx, model, broadcast):
        """Every local image transferred to S_g once (cached) and attached as the aligned view."""
        return self.attach_transfers(ctx, VIEW, Style.from_payload(broadcast), self.hp["transfer_alpha"], {})

    # -- local training -----------------------------------------------------------------
    def pair_loss(self, ctx, model, x: torch.Tensor, xp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. 9 on a batch x and its transfers xp (aligned), each term logged."""
        hp = self.hp
        z, zp, z_all = paired_features(model, x, xp, hp["batchnorm_stats"])  # one forward pass of [x; x']
        if hp["ce_views"] == "both":
            ce = F.cross_entropy(model.head(z_all), torch.cat([y, y]))
        else:
            ce = F.cross_entropy(model.head(z), y)
        triplet = triplet_loss(z, zp, y, margin=hp["margin"], negatives=hp["negatives"], distance=hp["distance"],
                               normalize=hp["normalize"], reduction=hp["reduction"], hinge=hp["hinge"],
                               eps=TRIPLET_EPS_CODE if hp["reference_code"] else 1e-6)
        reg = feature_regularizer(z, zp, reduction=hp["reduction"], scale=hp["reg_scale"])
        ctx.log("ce", ce)
        ctx.log("triplet", triplet)
        ctx.log("reg", reg)
        return ce + hp["gamma1"] * triplet + hp["gamma2"] * reg

    def training_batches(self, ctx):
        """Each batch x, its transfers x' to S_g (same crop and flip) set aside for :meth:`training_loss`;
        PARDON's batches go without the ``augment`` option."""
        for x, y, _, views in ctx.batches(views=True):
            ctx.scratch[_TRANSFERS] = views[VIEW]
            yield x, y
        ctx.scratch.pop(_TRANSFERS, None)

    def training_loss(self, ctx, model, x, y, payload):
        return self.pair_loss(ctx, model, x, ctx.scratch[_TRANSFERS], y)

    def local_train(self, ctx, model, payload):
        global _warned_optimizer
        if self.hp["reference_code"] and ctx.train.optimizer != "adam" and not _warned_optimizer:
            _warned_optimizer = True
            warnings.warn("pardon reference_code=true sets the method's choices only; the public code's optimiser "
                          "needs the run flags --optimizer adam --lr 3e-5 --weight-decay 0 --lr-schedule constant")
        return super().local_train(ctx, model, payload)  # the base loop; counts the transfers made (lazy)
