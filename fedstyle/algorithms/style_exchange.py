"""Base class of the setup-phase style exchanges (CCST, PARDON, FedDG-FFT): upload a style, broadcast
the bank, augment the local data (or attach a view of it) into the cache. The pieces live in
:mod:`fedstyle.style.transfer.augment` (styles, bank, plan) and :mod:`fedstyle.style.transfer.stylize`
(making and caching); this class wires them to the algorithm hooks. Subclasses say which backend, which
styles, which plan; :class:`StyleBackendExchange` lets the user choose the backend (CCST, PARDON).

Cost (issue 27): the generated images are made when a training batch first reads them
(``stylize=lazy``, default; ``eager`` makes all of them at setup, the papers' procedure, same pixels),
and a client's overall or clustered style is computed from a class-stratified sample of
``style_images`` images (:data:`STYLE_IMAGES`; 0 = all, the papers' definition). Each round's
metrics carry ``stylized_images`` and ``stylize_seconds``: what the client's batches made that round.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import torch

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.context import ClientContext
from fedstyle.data.lazy import LazyImages
from fedstyle.errors import ConfigError
from fedstyle.io import not_a_readable_file
from fedstyle.payload import Payload
from fedstyle.seeding import derive_seed
from fedstyle.style.privacy import NOISE_SOURCES, StylePrivacy
from fedstyle.style.transfer import DEFAULT_BACKEND, TRANSFER_BACKENDS, Style, StyleTransfer
from fedstyle.style.transfer.augment import (
    AugmentPlan,
    StyleBank,
    client_style,
    make_backend,
    pop_style_cost,
    record_style_cost,
    resolve_style_device,
    style_sample,
)
from fedstyle.style.transfer.base import check_private_backend
from fedstyle.style.transfer.stylize import (
    STYLIZE_MODES,
    cached_style,
    image_bar,
    made_so_far,
    stylize_cached,
    stylize_to_style,
)

#: how many images a client's overall (CCST) or clustered (PARDON) style is computed from; shared by the
#: methods that compute one (CCST's single-image bank and FedDG-FFT's spectra draw their own images)
STYLE_IMAGES = HParam(
    "style_images", 2048, "images a client's overall/clustered style is computed from: a class-stratified random "
    "sample (CCST Sec. 3.2's approximation; 2,048 is its appendix B's timing set); 0 = all images (Eq. 8 / "
    "PARDON Eq. 1-2 exactly)", low=0)

#: the style privacy defence (:mod:`fedstyle.style.privacy`) of the methods that share style statistics
#: (CCST, StableFDG): clipping and Gaussian noise, default off
DP_HPARAMS = (
    HParam("dp_clip", 0.0, "style privacy: clip each image's contribution to the shared style statistics to L2 norm "
           "C (0: no clipping); bounds the sensitivity to 2C", low=0.0),
    HParam("dp_noise", 0.0, "style privacy: Gaussian noise multiplier z, noise std z * 2C on the summed statistics "
           "(0: no noise; needs dp_clip > 0)", low=0.0),
    HParam("dp_delta", 1e-5, "style privacy: the delta of the (eps, delta) logged as dp_epsilon", low=0.0, high=1.0),
    HParam("dp_noise_source", "auto", "style privacy: where the noise comes from: os (the OS CSPRNG: the receiver "
           "cannot regenerate it), seeded (reproducible, simulations only: the seed removes it) or auto (seeded in "
           "fedstyle run, os in a deployment)", choices=NOISE_SOURCES),
)


def style_privacy(hp: Mapping[str, Any], backend: str | None = None) -> StylePrivacy:
    """The defence the dp_* hyperparameters set (off for a method without them); ConfigError for bad values,
    noise without clipping, or a ``backend`` (a style transfer backend's name) that cannot apply it."""
    privacy = StylePrivacy(hp.get("dp_clip", 0.0), hp.get("dp_noise", 0.0), hp.get("dp_delta", 1e-5),
                           hp.get("dp_noise_source", "os"))
    if privacy.enabled and backend is not None:
        check_private_backend(backend)
    return privacy


#: the hyperparameters passed to each backend's factory, those of them the method declares (PARDON's
#: ``band``; CCST has none, so its fft backend keeps the default band)
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {
    "adain": ("vgg_weights", "decoder_weights"), "lite": ("decoder_weights",), "fft": ("band",)}


def check_style_backend(method: str, hp: Mapping[str, Any], backend_key: str = "style_backend",
                        weight_files: bool = True) -> None:
    """Refuse, before any work, an unknown backend, weight options of another backend, and (unless
    ``weight_files=False``) the adain backend without its weight files (one-line errors naming the fix)."""
    name = hp[backend_key]
    if name not in TRANSFER_BACKENDS:  # checked here, not by choices: backends may register later
        raise ConfigError(f"hyperparameter {backend_key!r} of {method}: {name!r} is not a style backend; choose one "
                          f"of {', '.join(TRANSFER_BACKENDS.names())}")
    for option, backends in (("vgg_weights", ("adain",)), ("decoder_weights", ("adain", "lite"))):
        if hp.get(option) and name not in backends:
            raise ConfigError(f"{option} is an option of the {' and '.join(backends)} backend, not of "
                              f"{backend_key}={name}")
    if name == "adain" and weight_files:
        from fedstyle.style.transfer.adain import DECODER_FILE, VGG_FILE, find_weights

        for option, filename in (("vgg_weights", VGG_FILE), ("decoder_weights", DECODER_FILE)):
            path = find_weights(hp.get(option) or None, filename, option)  # ConfigError when absent
            problem = not_a_readable_file(path)
            if problem:
                raise ConfigError(f"{option}={hp[option]} {problem}; pass the path of the public AdaIN "
                                  f"{filename}, or use the offline backend {backend_key}=lite")


class StyleExchange(Algorithm):
    """FedAvg after a one-time style exchange; the setup metrics report style and stylization cost."""

    #: show a stylization progress bar (None: only on a terminal); the runner sets it from --quiet
    progress: bool | None = None
    #: local_train only wraps the base loop to count the images stylized meanwhile: clients may train batched
    BATCHING_WRAPPERS = ("local_train",)

    HPARAMS = (
        HParam("transfer_batch", 64, "images per style computation / transfer batch", low=1),
        HParam("style_device", "auto", "device of the style backend (auto: the run's --device)"),
        HParam("stylize", "lazy", "when the style-transferred images are made: lazy = when a training batch first "
               "reads them (a run pays for the images it trains on; same pixels), eager = all at setup (the "
               "papers' procedure)", choices=STYLIZE_MODES),
    )

    # -- what subclasses choose ---------------------------------------------------------
    def backend_name(self) -> str:
        raise NotImplementedError

    def backend_options(self) -> dict[str, Any]:
        """Options of the backend's factory besides ``device`` (empty strings are left out)."""
        return {}

    # -- shared steps -------------------------------------------------------------------
    def backend(self, ctx: ClientContext) -> StyleTransfer:
        """The run's backend, built once (weights loaded once) and shared by the clients."""
        device = resolve_style_device(self.hp["style_device"], ctx.device)
        options = self.backend_options()
        key = (self.backend_name(), str(device), tuple(sorted(options.items())))
        built = self.__dict__.setdefault("_backends", {})
        if key not in built:
            built[key] = make_backend(self.backend_name(), device, **options)
        return built[key]

    def cache_options(self) -> dict[str, Any]:
        """The backend options that enter cache keys: weight paths do not (the encoder id and the weights'
        fingerprint identify the weights, wherever the files lie)."""
        return {k: v for k, v in self.backend_options().items() if not k.endswith("_weights")}

    def images_for_style(self, ctx: ClientContext, purpose: str) -> torch.Tensor:
        """The client's images a style is computed from: all, or the ``style_images`` sample."""
        images = ctx.data.images
        rows = style_sample(ctx.data.labels, self.hp.get("style_images", 0), derive_seed(ctx.seed, purpose, "sample"))
        return images if rows is None else images.index_select(0, rows.to(images.device))

    def progress_bar(self, total: int, desc: str):
        """:func:`image_bar` shown as ``progress`` says (the runner's --quiet); yields ``tick(n)``."""
        return image_bar(total, desc, self.progress)

    def upload_style(self, ctx: ClientContext, style_type: str, count: int, purpose: str) -> Payload:
        """The client's style payload (``single``: ``count`` images drawn with the seed; ``overall``: over
        the ``style_images`` sample), computed once per images and recipe (:func:`cached_style`); clipped and
        noised as the dp_* hyperparameters say (noise seeded from the client's seed; the settings join the
        recipe, so a noisy style and a clean one never share a cache entry)."""
        images = self.images_for_style(ctx, purpose) if style_type == "overall" else ctx.data.images
        seed = derive_seed(ctx.seed, purpose)
        total = len(images) if style_type == "overall" else min(count, len(images))
        privacy = style_privacy(self.hp)

        def compute(backend, tick):
            style, used = client_style(backend, images, style_type=style_type, count=count, seed=seed,
                                       batch_size=self.hp["transfer_batch"], progress=tick, privacy=privacy,
                                       noise=privacy.generator(seed, "noise"))
            return style, {"images": used}

        recipe = {"style_type": style_type, "count": count, "seed": seed}
        if privacy.enabled:  # absent when off: the clean style's cache key stays what it was
            recipe["privacy"] = privacy.recipe()
        # a deployed site answers the same question again with the same release (docs/privacy.md)
        return ctx.release(purpose, privacy,
                           lambda: self.computed_style(ctx, images, recipe, total, compute)[0].to_payload())

    def computed_style(
        self,
        ctx: ClientContext,
        images: torch.Tensor,
        recipe: dict[str, Any],
        total: int,
        compute: Callable[[StyleTransfer, Callable[[int], None]], tuple[Style, dict[str, float]]],
    ) -> tuple[Style, dict[str, float]]:
        """The client's style over ``images`` and the numbers kept beside it (``images`` used, ...), made by
        ``compute(backend, tick)`` under a progress bar of ``total`` images once per images and recipe (the
        method and backend options join ``recipe``; a rerun loads it, :func:`cached_style`); its cost and
        the other numbers (as ``style_<name>``) are recorded for the setup metrics."""
        backend = self.backend(ctx)
        start = time.perf_counter()
        recipe = dict(recipe, method=self.name, backend_options=self.cache_options())

        def make():
            with self.progress_bar(total, f"client {ctx.client_id} style") as tick:
                return compute(backend, tick)

        style, numbers, hit = cached_style(recipe, images, backend, make)
        record_style_cost(ctx.state, time.perf_counter() - start, numbers["images"], cached=hit,
                          counts={k: v for k, v in numbers.items() if k != "images"})
        return style, numbers

    def setup_broadcast(self, uploads: dict[int, Payload], server) -> Payload:
        return StyleBank.from_uploads(uploads).to_payload()

    def augment(
        self,
        ctx: ClientContext,
        broadcast: Payload,
        plan_for: Callable[[StyleBank], AugmentPlan],
        alpha: float,
        recipe: dict[str, Any],
    ) -> dict[str, float]:
        """Generate (or reuse) the plan's images and make them the client's data; returns setup metrics."""
        plan, images, metrics = self._planned_images(ctx, broadcast, plan_for, alpha, recipe)
        ctx.data.replace(images, plan.source)  # labels, domains (and any views) follow their source rows
        return metrics

    def attach_planned_view(self, ctx: ClientContext, view: str, broadcast: Payload,
                            plan_for: Callable[[StyleBank], AugmentPlan], alpha: float,
                            recipe: dict[str, Any]) -> dict[str, float]:
        """As :meth:`augment`, for a plan with exactly one output per local image, in order (output m
        restyles image m): the outputs become the aligned view ``view`` instead of replacing the data
        (FedDG's episodic training pairs each image with its amplitude-exchanged copy)."""
        plan, images, metrics = self._planned_images(ctx, broadcast, plan_for, alpha, recipe)
        if not torch.equal(plan.source, torch.arange(len(ctx.data))):
            raise ValueError("a view's plan must restyle every local image once, in order")
        ctx.data.set_view(view, images)
        return metrics

    def _planned_images(self, ctx, broadcast, plan_for, alpha, recipe):
        bank = StyleBank.from_payload(broadcast)
        backend = self.backend(ctx)
        backend.check(bank.style)  # refuse a foreign bank before planning with it
        plan = plan_for(bank)
        recipe = dict(recipe, method=self.name, backend_options=self.cache_options())
        images, metrics = stylize_cached(self.name, recipe, ctx.data.images, plan, bank, backend, alpha,
                                         self.hp["transfer_batch"], progress=self.progress, mode=self.hp["stylize"])
        metrics.update(pop_style_cost(ctx.state))
        return plan, images, metrics

    def attach_transfers(self, ctx: ClientContext, view: str, style: Style, alpha: float,
                         recipe: dict[str, Any]) -> dict[str, float]:
        """Every local image transferred to the one ``style`` (made once into the cache, as ``stylize``
        says) and attached to the client's data as the aligned view ``view``: a batch's x and its transfer
        come with the same crop and flip. Returns setup metrics, as :meth:`augment`."""
        backend = self.backend(ctx)
        backend.check(style)  # refuse a foreign style before transferring to it
        recipe = dict(recipe, method=self.name, backend_options=self.cache_options())
        views, metrics = stylize_to_style(self.name, recipe, ctx.data.images, style, backend, alpha,
                                          self.hp["transfer_batch"], progress=self.progress, mode=self.hp["stylize"])
        ctx.data.set_view(view, views)
        metrics.update(pop_style_cost(ctx.state))
        return metrics

    # -- images made during training ----------------------------------------------------------------
    def local_train(self, ctx, model, payload):
        with self.count_stylized(ctx) as made:
            result = super().local_train(ctx, model, payload)
        result.metrics.update(made)
        result.metrics.update(style_privacy(self.hp).metrics(1))  # the eps of the setup's one style release
        return result

    @contextmanager
    def count_stylized(self, ctx: ClientContext) -> Iterator[dict[str, float]]:
        """Fills the yielded dict with ``stylized_images`` / ``stylize_seconds``: what the client's lazy
        stores (data and views) made inside the block (0 once everything read was made; nothing when
        the client has no lazy store, e.g. stylize=eager). Costs, like timings: they depend on what the
        cache held, not on the run's results."""
        def stores():
            return [s for s in (ctx.data.pool.images, *ctx.data.views.values()) if isinstance(s, LazyImages)]

        images, seconds = made_so_far(*stores())
        made: dict[str, float] = {}
        yield made
        if stores():
            images_after, seconds_after = made_so_far(*stores())
            made.update(stylized_images=images_after - images, stylize_seconds=seconds_after - seconds)


class StyleBackendExchange(StyleExchange):
    """A style exchange whose image style transfer backend is the user's choice, ``style_backend`` (CCST,
    PARDON; FedDG-FFT's is fixed), with the weight files of the backends that load some."""

    HPARAMS = (
        HParam("style_backend", DEFAULT_BACKEND, "image style transfer backend, a name registered in "
               f"fedstyle.style.transfer ({', '.join(TRANSFER_BACKENDS.names())})"),
        HParam("vgg_weights", "", "adain backend: path of vgg_normalised.pth"),
        HParam("decoder_weights", "", "adain backend: path of decoder.pth; lite: a `fedstyle style train-decoder` "
               "file (default: the shipped one)"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = super().resolve(given)
        check_style_backend(cls.name, hp, weight_files=False)  # a method that needs the files checks them itself
        style_privacy(hp, hp["style_backend"])  # bad dp_* values, noise without clipping, fft
        return hp

    @classmethod
    def display_details(cls, hp: Mapping[str, Any]) -> list[str]:
        """What the method's table label shows in brackets before the backend (default: nothing)."""
        return []

    @classmethod
    def display_name(cls, hp: Mapping[str, Any]) -> str:
        """The table label: the label, in brackets the method's details, the backend unless the default and
        "reference code", then the local options (" + MixStyle", ...)."""
        inside = cls.display_details(hp)
        if hp["style_backend"] != DEFAULT_BACKEND:
            inside.append(hp["style_backend"])
        if hp.get("reference_code"):
            inside.append("reference code")
        label = cls.label or cls.name
        base = super().display_name(hp)  # the label plus " + MixStyle" etc.
        return label + (f" ({', '.join(inside)})" if inside else "") + base[len(label):]

    def backend_name(self) -> str:
        return self.hp["style_backend"]

    def backend_options(self) -> dict[str, Any]:
        return {key: self.hp[key] for key in BACKEND_OPTIONS.get(self.hp["style_backend"], ()) if key in self.hp}
