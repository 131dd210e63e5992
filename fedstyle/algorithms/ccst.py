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

The original image (``keep_original``). Algorithm 1 (lines 4-5) keeps an image's original only when
the client draws its own domain, which happens with probability K / N for N clients. In the paper's
experiments every client is a domain and K = N = 3 sources, so every image keeps its original plus
N - 1 restyled copies; with many clients per domain it almost never does: a 62-image client at
N = 100 clients and K = 3 draws its own domain for 62 x 3 / 100 = 1.9 of its 186 outputs in
expectation, so it trains on restyled images almost only.

* ``keep_original=own_domain`` (default): Algorithm 1 as written, d x K outputs (Section 3.2.3);
* ``keep_original=always``: every original plus K restyled copies drawn without replacement among
  the *other* clients' styles, d x (K + 1) outputs, K <= N - 1; at K = N - 1 the same images as
  Algorithm 1 at K = N (the paper's setting).

The clients' domains are known neither to the server nor to each other (a client may hold several
domains under a mixed partition), so the K draws are over distinct clients, as in Algorithm 1, not
over distinct domains. The setting enters the stylization cache key. With local training by
epochs, ``always`` gives (K + 1) / K as many steps; the benchmarks train fixed step counts.

Training is then FedAvg on the augmented data; the local options compose as for every method
(``--hp style=mixstyle`` gives CCST + MixStyle, ``--hp local_bn=true`` CCST + FedBN).

Style privacy (issue 24, :mod:`fedstyle.style.privacy`): ``dp_clip`` = C clips each image's contribution
(overall: its first and second feature moments per channel; single: its (mean, std)) to L2 norm C,
``dp_noise`` = z adds Gaussian noise of std z * 2C to the sums before the style is formed (Eq. 8 / Eq. 6
from noisy sums), ``dp_delta`` the delta of the (eps, delta) each round's metrics carry as ``dp_epsilon``
(one release, at setup). Adain and lite backends only (``fft`` is refused). Default off: unchanged.

Hyperparameter spelling: ``style=single`` / ``style=overall`` (the issue's and paper's words) are
accepted as shorthands for ``style_type``; ``style`` otherwise keeps its meaning for every method
(the feature-level op: none, mixstyle, dsu).

Defaults: overall style, K = 3 (the paper's best), ``keep_original=own_domain`` (Algorithm 1);
J = ceil(d / 32), the paper's value (Section 4.2: "the value of M is ceil(dataset_size / 32)",
i.e. one style per batch of 32); alpha = 1 as the public code. ``reference_code=true`` reproduces
the public code's other choices: in single mode one random style per batch of 32 consecutive
content images (not per image), client models averaged with equal weights
(``aggregation=uniform`` unless given), the overall style over every image (``style_images=0``), and
the transfer's content statistics with the unbiased variance (``unbiased_content`` of the adain and lite
backends: the code's ``calc_mean_std``, ``style_transfer/AdaIN/function.py:4-12``; its styles are
population statistics, as fedstyle's). ``tests/test_parity_ccst.py`` (``parity/ccst.py``) checks the adain
backend in this mode against the code (JeremyCJM/CCST at 87c3e44) with seeded weights: single-image
styles, the overall style from pooled sums, and encoder -> AdaIN -> decoder at alpha 1 and 0.6.
Not reproduced: styles and transfers at 512 x 512 (``--image_size``/``--style_size``, resized by
torchvision), validation drawn from the augmented list, the overall style's float32 sums (fedstyle
sums in float64), and the code's output rounding (``save_image``: half up; fedstyle: half to even).
Bugs of the public code: ``CCST_SingleStyleTransfer.py:232`` stops in the debugger
(``pdb.set_trace()``) after the first style domain; ``mean_std_computation_effcientMem.py:146``, which
saves the overall style, is commented out.
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
    family = "style-sharing"
    shares = "weights; once, each client's style statistics (a style bank)"
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
