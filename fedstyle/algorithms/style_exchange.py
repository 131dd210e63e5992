"""Base class of the setup-phase style exchanges (CCST, FedDG-FFT): upload a style, broadcast the
bank, augment the local data into the cache. The pieces live in :mod:`fedstyle.style.transfer.augment`;
this class wires them to the algorithm hooks. Subclasses say which backend, which styles, which plan.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.context import ClientContext
from fedstyle.errors import ConfigError
from fedstyle.payload import Payload
from fedstyle.seeding import derive_seed
from fedstyle.style.transfer import TRANSFER_BACKENDS, StyleTransfer
from fedstyle.style.transfer.augment import (
    AugmentPlan,
    StyleBank,
    client_style,
    make_backend,
    pop_style_cost,
    record_style_cost,
    resolve_style_device,
    stylize_cached,
)


def check_style_backend(method: str, hp: Mapping[str, Any], backend_key: str = "style_backend") -> None:
    """Refuse, before any work, an unknown backend, weight options of another backend, and the adain
    backend without its weight files (one-line errors naming the fix)."""
    name = hp[backend_key]
    if name not in TRANSFER_BACKENDS:  # checked here, not by choices: backends may register later
        raise ConfigError(f"hyperparameter {backend_key!r} of {method}: {name!r} is not a style backend; choose one "
                          f"of {', '.join(TRANSFER_BACKENDS.names())}")
    for option, backends in (("vgg_weights", ("adain",)), ("decoder_weights", ("adain", "lite"))):
        if hp.get(option) and name not in backends:
            raise ConfigError(f"{option} is an option of the {' and '.join(backends)} backend, not of "
                              f"{backend_key}={name}")
    if name == "adain":
        from fedstyle.style.transfer.adain import DECODER_FILE, VGG_FILE, find_weights

        for option, filename in (("vgg_weights", VGG_FILE), ("decoder_weights", DECODER_FILE)):
            path = find_weights(hp.get(option) or None, filename, option)  # ConfigError when absent
            if not path.is_file():
                raise ConfigError(f"{option}={hp[option]} does not exist; pass the path of the public AdaIN "
                                  f"{filename}, or use the offline backend {backend_key}=lite")


class StyleExchange(Algorithm):
    """FedAvg after a one-time style exchange; the setup metrics report style and stylization cost."""

    #: show a stylization progress bar (None: only on a terminal); the runner sets it from --quiet
    progress: bool | None = None

    HPARAMS = (
        HParam("transfer_batch", 64, "images per style computation / transfer batch", low=1),
        HParam("style_device", "auto", "device of the style backend (auto: the run's --device)"),
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

    def upload_style(self, ctx: ClientContext, style_type: str, count: int, purpose: str) -> Payload:
        """The client's style payload (``single``: ``count`` images drawn with the seed; ``overall``)."""
        backend = self.backend(ctx)
        start = time.perf_counter()
        style, used = client_style(backend, ctx.data.images, style_type=style_type, count=count,
                                   seed=derive_seed(ctx.seed, purpose), batch_size=self.hp["transfer_batch"])
        record_style_cost(ctx.state, time.perf_counter() - start, used)
        return style.to_payload()

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
        bank = StyleBank.from_payload(broadcast)
        backend = self.backend(ctx)
        backend.check(bank.style)  # refuse a foreign bank before planning with it
        plan = plan_for(bank)
        # weight paths do not enter the key: the encoder id and decoder fingerprint identify the weights
        options = {k: v for k, v in self.backend_options().items() if not k.endswith("_weights")}
        images, metrics = stylize_cached(self.name, dict(recipe, method=self.name, backend_options=options),
                                         ctx.data.images, plan, bank, backend, alpha, self.hp["transfer_batch"],
                                         progress=self.progress)
        ctx.data.replace(images, plan.source)  # labels, domains (and any views) follow their source rows
        metrics.update(pop_style_cost(ctx.state))
        return metrics
