"""CCST: cross-client style transfer (Chen et al., WACV'23; ccst.txt Section 3.2, Algorithm 1).

Setup exchange, before round 0 (each client is one domain, as in the paper):

1. each client computes its style with the style backend (AdaIN statistics for ``adain`` and the
   offline default; the amplitude spectrum for ``fft``) — ``style_type=single``: a local bank of J
   single-image styles of images drawn with the seed (Eq. 6, 7); ``overall``: its overall domain
   style over all pixels of all images (Eq. 8), by default approximated on a class-stratified sample
   of ``style_images`` = 2,048 images (Section 3.2's "Computation and communication trade-off";
   0 = every image) — and uploads it (bytes counted);
2. the server concatenates the clients' styles into the bank B (Eq. 9, 10) and broadcasts it,
   remembering which client each style came from;
3. each client draws, for every image, K domains of B without replacement: its own domain keeps
   the original image, another domain restyles the image to that domain's overall style, or
   (single) to one style drawn at random from that domain's bank, per image (Algorithm 1). The
   d x K outputs replace the client's data (labels repeated). Each is made once into the tensor
   cache (``cache_dir()/ccst/<key>``): by default (``stylize=lazy``) when a training batch first
   reads it, so a run pays for the images it trains on; ``stylize=eager`` makes all at setup, as
   the paper (same pixels). A rerun or a resumed run reuses what is made.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/ccst.md.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from fedstyle.algorithms.base import apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.style_exchange import DP_HPARAMS, STYLE_IMAGES, StyleBackendExchange
from fedstyle.errors import ConfigError
from fedstyle.seeding import derive_seed
from fedstyle.style.transfer.augment import KEEP_ORIGINAL, plan_cross_client
from fedstyle.style.transfer.feature_adain import FeatureAdaIN

#: images per style draw in the public code's single mode (its batch size; also the paper's J = d / 32)
REFERENCE_BATCH = 32
_STYLE_TYPES = ("single", "overall")

#: reference_code=true: the public code's choices for the hyperparameters not given explicitly
REFERENCE = {
    "aggregation": "uniform",  # the public code averages client models with equal weights
    "style_images": 0,  # the public code's overall style is over every image
}


@register_method
class CCST(StyleBackendExchange):
    name = "ccst"
    label = "CCST"
    summary = ("cross-client style transfer: clients share styles, every image gets K styles of the bank "
               "(own domain = original; keep_original=always: original + K others), then FedAvg on the images")
    paper = ("Chen et al., Federated domain generalization for image recognition via cross-client style transfer, "
             "WACV 2023")
    HPARAMS = (
        HParam("style_type", "overall", "single-image style bank (Eq. 7) or overall domain style (Eq. 8); "
               "also given as style=single|overall", choices=_STYLE_TYPES),
        STYLE_IMAGES,
        HParam("k", 3, "augmentation level K: styles per image, distinct domains drawn without replacement "
               "(keep_original=always: restyled copies besides the original, from other clients)", low=1),
        HParam("keep_original", "own_domain", "when an image's original is in the augmented data: own_domain = "
               "only when the K draws hit the client's own domain (Algorithm 1, the paper; d x K images; "
               "with many clients almost never); always = every original plus K restyled copies from K "
               "distinct other clients (d x (K + 1) images; K <= clients - 1)", choices=KEEP_ORIGINAL),
        HParam("j", 0, "single-image styles each client uploads (0: ceil(d/32), the paper's value)", low=0),
        HParam("alpha", 1.0, "content/style interpolation of the transfer (1 = full style)", low=0.0, high=1.0),
        HParam("reference_code", False, "public code's choices: one random style per batch of 32 images "
               "(single mode), equal client weights (aggregation=uniform), overall style over all images "
               "(style_images=0), the transfer's content statistics with the unbiased variance"),
        *DP_HPARAMS,
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        given = dict(given)
        if str(given.get("style", "")) in _STYLE_TYPES:  # the spelling: style=single|overall
            shorthand = str(given.pop("style"))
            if "style_type" in given and str(given["style_type"]) != shorthand:
                raise ConfigError(f"style={shorthand} contradicts style_type={given['style_type']}; give one of them")
            given["style_type"] = shorthand
        return apply_reference_code(super().resolve(given), given, REFERENCE)

    def __init__(self, hparams: Mapping[str, Any] | None = None, *, num_classes: int, num_clients: int):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        k = self.hp["k"]  # fail before any style work; setup_download checks the actual bank
        if self.hp["keep_original"] == "always" and k > num_clients - 1:
            raise ConfigError(f"k={k} restyled copies per image from other clients' styles, but there are only "
                              f"{num_clients} source clients ({num_clients - 1} besides each client); choose "
                              f"k <= {num_clients - 1}, or keep_original=own_domain (Algorithm 1, k <= {num_clients})")
        if k > num_clients:
            raise ConfigError(f"k={k} styles per image, but there are only {num_clients} source clients "
                              f"(domains of the style bank); choose k <= {num_clients}")

    @classmethod
    def display_details(cls, hp: Mapping[str, Any]) -> list[str]:
        return [hp["style_type"], f"K={hp['k']}" + (" + original" if hp["keep_original"] == "always" else "")]

    def num_styles(self, num_images: int) -> int:
        """J: the given ``j``, or ceil(d / 32)."""
        return self.hp["j"] or math.ceil(num_images / REFERENCE_BATCH)

    def backend(self, ctx):
        """The style backend; under ``reference_code`` an encoder backend normalises the content with the
        unbiased variance in transfer, as the public code (``function.py:4-12``)."""
        backend = super().backend(ctx)
        if self.hp["reference_code"] and isinstance(backend, FeatureAdaIN):
            backend.unbiased_content = True
        return backend

    def setup_upload(self, ctx, model):
        return self.upload_style(ctx, self.hp["style_type"], self.num_styles(len(ctx.data)), "ccst-styles")

    def setup_download(self, ctx, model, broadcast):
        hp = self.hp
        per_batch = REFERENCE_BATCH if hp["reference_code"] and hp["style_type"] == "single" else 0
        seed, n = derive_seed(ctx.seed, "ccst-plan"), len(ctx.data)

        def plan_for(bank):
            return plan_cross_client(n, bank, own=ctx.client_id, k=hp["k"], seed=seed, per_batch=per_batch,
                                     keep_original=hp["keep_original"])

        # keep_original is in the key by name, not only through the plan's digest: an entry made under one
        # setting is never reused under the other
        recipe = {"style_type": hp["style_type"], "keep_original": hp["keep_original"]}
        return self.augment(ctx, broadcast, plan_for, hp["alpha"], recipe)
