"""The algorithm API: one class per method, written once for every runtime.

An :class:`Algorithm` says what happens on a client (local training, payloads it uploads, state it
keeps) and on the server (setup broadcast, per-round payloads, aggregation). The runtimes — the
in-process star and peer-to-peer simulators and the Flower bridge — call these hooks and move
weights and payloads; they never special-case a method.

Hooks, in the order a star run calls them, with the model's mode the runtime sets before each::

    configure_model(model)                           once, on every process holding a model
    init_server_state(server)                        once, on the server
    setup_upload(ctx, model)        -> Payload       client, before round 0            [eval]
    setup_broadcast(uploads, server) -> Payload      server, from every client's upload
    setup_download(ctx, model, broadcast) -> metrics client (metrics: {name: number})  [eval]
    round_query(ctx, model)         -> Payload       each sampled client, on the downloaded
                                                     weights, before training          [eval]
    round_payloads(server, client_ids, queries) -> {id: Payload}   server, sent beside the model
    local_train(ctx, model, payload) -> ClientResult     client, on the downloaded weights [train]
      training_batches(ctx)                          the mini-batches (x, y) it trains on
      training_step(ctx, model, optimizer, x, y, payload)  per mini-batch: loss, backward, step
        training_loss(ctx, model, x, y, payload)     the mini-batch's loss [train]
    aggregate(server, updates) -> weights            server

A method *has* a phase (setup exchange, query, peer-to-peer share) when its class overrides the
phase's client hook — :meth:`Algorithm.uses_phase` is the one place that decides, and a method
whose phase depends on a hyperparameter overrides ``uses_phase``. The runtime skips the exchange
of a phase the method does not use.

A peer-to-peer run calls, per iteration and device, ``p2p_share(ctx, model, x)`` [eval] and then
``training_loss(ctx, model, x, y, payload)`` [train] with ``payload = {j: share of neighbour j}``
(see ``fedstyle.federation.p2p``).

``ctx.phase`` names the phase; ``ctx.scratch`` holds per-call objects; ``ctx.global_model()`` is
a frozen copy of the round's global weights; ``ctx.log(name, value)`` and ``ctx.timed(name)``
record loss terms and timings that reach metrics.jsonl (see :class:`ClientContext`).

Composition: every method carries the local options below (a feature-level style op inside each
client — MixStyle or DSU at chosen stages —, FedBN's local BatchNorm, and an image augmentation of
each training batch — RandConv, AugMix, texture corruption or FedGCA's style complement, see
``fedstyle.data.augment``), so "FedBN + MixStyle", "CCST + MixStyle" or "FedDyn + RC" are
hyperparameters, not new classes. So is a server-side step after ``aggregate`` (``server_opt``, see
``fedstyle.algorithms.server_opt``): "CCST + OMG" is CCST with FedOMG's on-server gradient matching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.context import ClientContext, ClientUpdate, ServerContext
from fedstyle.algorithms.hparams import HParam, resolve_hparams
from fedstyle.algorithms.server_opt import SERVER_OPT_HPARAMS, SERVER_OPTS, build_server_opt
from fedstyle.data.augment import BATCH_AUGMENTATIONS, augment_labelled, augmentation_label, parse_options
from fedstyle.errors import ConfigError, FedstyleError, NonFiniteLossError  # noqa: F401 (re-exported)
from fedstyle.payload import Payload
from fedstyle.style import STYLE_OPS

_BN_TYPES = (nn.modules.batchnorm._BatchNorm,)

#: the exchange phases a method may use, and the client hook whose override means it does
PHASE_HOOKS = {"setup": "setup_upload", "query": "round_query", "share": "p2p_share"}

#: topology names: the star (server + clients) and the peer-to-peer graphs of fedstyle.federation.topology
STAR: tuple[str, ...] = ("star",)
PEER_TO_PEER: tuple[str, ...] = ("complete", "ring", "rgg", "erdos_renyi")
#: what a method is, for ``fedstyle methods``: the families a method's ``family`` names
FAMILIES: tuple[str, ...] = ("style-sharing", "feature augmentation", "domain-invariance", "FL heterogeneity",
                             "peer-to-peer", "single-source")


@dataclass
class ClientResult:
    """What ``local_train`` reports; the runtime adds the weights and the sample count."""

    train_loss: float
    payload: Payload = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def batchnorm_keys(model: nn.Module) -> set[str]:
    """State-dict keys of every BatchNorm layer (parameters and running statistics)."""
    keys: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, _BN_TYPES):
            for name, _ in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
                keys.add(f"{prefix}.{name}" if prefix else name)
    return keys


class Algorithm:
    """Base class: FedAvg behaviour plus the local composition options every method accepts."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: one of :data:`FAMILIES`
    family: ClassVar[str] = ""
    #: what travels between sites, in a few words ("weights; once, style statistics")
    shares: ClassVar[str] = "weights"
    topologies: ClassVar[tuple[str, ...]] = STAR

    HPARAMS: ClassVar[tuple[HParam, ...]] = (
        HParam("style", "none", "feature-level style op inside each client (a name of fedstyle.style.STYLE_OPS)",
               choices=("none", *STYLE_OPS.names())),
        HParam("style_p", 0.5, "probability that the style op fires at a stage", low=0.0, high=1.0),
        HParam("style_stages", "layer1,layer2,layer3", "comma-separated backbone stages after which the style op runs"),
        HParam("local_bn", False, "keep BatchNorm layers local to each client (FedBN, Li et al. ICLR'21)"),
        HParam("aggregation", "size", "weight client models by sample count (size) or equally (uniform)",
               choices=("size", "uniform")),
        HParam("augment", "none", "image augmentation of every training batch, on the device (a name of "
               "fedstyle.data.augment.BATCH_AUGMENTATIONS; randconv gives the '+ RC' rows)",
               choices=("none", *BATCH_AUGMENTATIONS.names())),
        HParam("augment_p", 1.0, "probability that a sample is augmented (per sample and view; else it stays clean)",
               low=0.0, high=1.0),
        HParam("augment_views", 0, "0: augment the batch in place; V >= 1: train on the clean batch plus V augmented "
               "copies, labels repeated", low=0),
        HParam("augment_args", "", "the augmentation's options NAME=VALUE,... (lists with /), e.g. "
               "kernel_sizes=1/3,per_sample=true"),
        *SERVER_OPT_HPARAMS,  # a server-side step after aggregate (FedOMG), see fedstyle.algorithms.server_opt
    )
    #: subclasses change defaults of inherited hyperparameters here (e.g. MixStyle sets style=mixstyle)
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    #: client batching: ``("local_train",)`` when this class overrides ``local_train`` only to wrap the base
    #: one (call ``super()`` once and add metrics or payload entries to its result, never touch the model or
    #: the loss), which keeps the method batchable (:meth:`batching_support`); e.g. counting the images the
    #: block made. Only ``local_train`` is honoured: the executor calls it, never ``training_step``
    BATCHING_WRAPPERS: ClassVar[tuple[str, ...]] = ()
    #: step hooks a class overrides only for a boolean hyperparameter (hook -> its name): with it off the
    #: override defers to the base hook, so client batching stays open (FedDG-FFT's ``episodic``)
    GATED_STEP_HOOKS: ClassVar[dict[str, str]] = {}

    def __init__(self, hparams: Mapping[str, Any] | None = None, *, num_classes: int, num_clients: int):
        self.hp = self.resolve(hparams or {})
        self.num_classes = num_classes
        self.num_clients = num_clients
        if self.hp["augment"] != "none":  # bad augment_args fail here, before anything is written
            parse_options(self.hp["augment"], self.hp["augment_args"])
        self.server_opt = build_server_opt(self.hp)  # None without one; bad server_opt_args fail here too

    # -- hyperparameters ----------------------------------------------------------------
    @classmethod
    def declared_hparams(cls) -> list[HParam]:
        """All hyperparameters along the class hierarchy, subclass defaults applied."""
        table: dict[str, HParam] = {}
        for klass in reversed(cls.__mro__):
            for h in klass.__dict__.get("HPARAMS", ()):
                table[h.name] = h
            for name, default in klass.__dict__.get("DEFAULTS", {}).items():
                h = table[name]
                table[name] = HParam(h.name, default, h.help, h.choices, h.low, h.high)
        return list(table.values())

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        return resolve_hparams(cls.declared_hparams(), given, cls.name)

    @classmethod
    def display_name(cls, hp: Mapping[str, Any]) -> str:
        """A table label: the method's label plus the local options that differ from its defaults."""
        defaults = {h.name: h.default for h in cls.declared_hparams()}
        parts = [cls.label or cls.name]
        if hp.get("local_bn") and not defaults["local_bn"]:
            parts.append("FedBN")
        if hp.get("style", "none") != defaults["style"] and hp.get("style") != "none":
            op = STYLE_OPS.get(hp["style"])
            parts.append(getattr(op, "label", hp["style"]))
        augment = hp.get("augment", "none")
        if augment != defaults["augment"] or hp.get("augment_views", 0) != defaults["augment_views"]:
            if augment == "none":
                parts.append("no augmentation")
            else:
                views = hp.get("augment_views", 0)
                note = f" ({views} view{'s' if views > 1 else ''})" if views != defaults["augment_views"] else ""
                parts.append(augmentation_label(augment) + note)
        server_opt = hp.get("server_opt", "none")
        if server_opt != defaults["server_opt"]:  # fedomg with server_opt=none is FedAvg: say so
            parts.append(SERVER_OPTS.get(server_opt).label if server_opt != "none" else "no server step")
        return " + ".join(parts)

    # -- model --------------------------------------------------------------------------
    def configure_model(self, model: nn.Module) -> None:
        """Record the parameter keys and insert the local style op after the chosen stages (training only).

        Subclasses that override this call ``super().configure_model(model)`` first.
        """
        self.param_keys = [k for k, _ in model.named_parameters()]
        if self.hp["style"] == "none":
            return
        make_op = STYLE_OPS.get(self.hp["style"])
        stages = [s.strip() for s in self.hp["style_stages"].split(",") if s.strip()]
        if not stages:
            raise ConfigError("style_stages is empty; give stage names such as layer1,layer2,layer3")
        model.insert_ops(stages, lambda: make_op(p=self.hp["style_p"]))

    def local_keys(self, model: nn.Module) -> set[str]:
        """State keys that never leave a client's control (FedBN: BatchNorm layers)."""
        return batchnorm_keys(model) if self.hp["local_bn"] else set()

    def private_keys(self, model: nn.Module) -> set[str]:
        """Local keys that do not travel up either (default none: local layers go up for the evaluation model,
        as FedBN's); the runtime drops them from the client's update and ``aggregate`` gives their server value."""
        return set()

    @classmethod
    def batching_support(cls, hp: Mapping[str, Any]) -> str | None:
        """None when a round's clients of this method (with hyperparameters ``hp``) may train as one batched
        computation (``--client-batching``, ``fedstyle.federation.batched``), else why they train one by one.

        Batchable: FedAvg's step and loss — ``local_train``, ``training_step`` and ``training_loss`` not
        overridden (a loss term of the weights alone goes in :meth:`weight_penalty`, as FedProx's; an
        override that only wraps the base hook is listed in ``BATCHING_WRAPPERS`` by the class defining
        it) — and no feature-level style op: it draws each client's random numbers inside the forward
        pass, which a vmapped forward cannot draw from each client's own stream. Batch production
        (``training_batches``, ``augment_batch``) may be overridden: it runs per client, outside vmap.
        """
        if STAR[0] not in cls.topologies:
            return "peer-to-peer method: client batching runs star rounds"
        custom = [hook for hook in _STEP_HOOKS if getattr(cls, hook) is not getattr(Algorithm, hook)
                  and not (hook == "local_train" and _wraps_only(cls, hook))
                  and not (hook in cls.GATED_STEP_HOOKS and not hp.get(cls.GATED_STEP_HOOKS[hook]))]
        if custom:
            return "its own " + ", ".join(custom)
        if hp.get("style", "none") != "none":
            return (f"its {hp['style']} style op draws random numbers inside the forward pass, which vmap cannot "
                    "draw from each client's own stream")
        return None

    def uses_phase(self, phase: str) -> bool:
        """Whether this method uses the exchange ``phase`` (``setup``, ``query`` or ``share``):
        by default, whether its class overrides the phase's client hook (:data:`PHASE_HOOKS`)."""
        hook = PHASE_HOOKS[phase]
        return getattr(type(self), hook) is not getattr(Algorithm, hook)

    # -- server -------------------------------------------------------------------------
    def init_server_state(self, server: ServerContext) -> None:
        """Fill ``server.state`` with persistent tensors (default: none)."""

    def setup_broadcast(self, uploads: dict[int, Payload], server: ServerContext) -> Payload:
        """Combine the clients' setup uploads into what every client receives."""
        return {}

    def round_payloads(
        self, server: ServerContext, client_ids: list[int], queries: dict[int, Payload]
    ) -> dict[int, Payload]:
        """Per-client payloads sent beside the model this round (default: none).

        ``queries`` holds what each sampled client answered to ``round_query`` this round (e.g.
        StableFDG's style statistics under the current global model); empty without a query phase.
        """
        return {}

    def aggregate(self, server: ServerContext, updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
        """Weighted average of the clients' weights (Eq. of FedAvg, McMahan et al. 2017)."""
        return weighted_average(updates, uniform=self.hp["aggregation"] == "uniform")

    # -- client -------------------------------------------------------------------------
    def init_client_state(self, ctx: ClientContext, model: nn.Module) -> None:
        """Fill ``ctx.state`` with persistent per-client tensors on first participation."""

    def setup_upload(self, ctx: ClientContext, model: nn.Module) -> Payload:
        """The client's setup upload (e.g. a style); overriding it gives the method a setup phase."""
        return {}

    def setup_download(self, ctx: ClientContext, model: nn.Module, broadcast: Payload) -> dict[str, float] | None:
        """Receive the server's setup broadcast (e.g. augment local data).

        May return metrics of the setup work as ``{name: number}`` (e.g. ``style_seconds``,
        ``stylized_images``); the simulator sums them over clients and the runner logs them.
        """

    def round_query(self, ctx: ClientContext, model: nn.Module) -> Payload:
        """A sampled client's answer before local training, on this round's downloaded weights
        (eval mode); overriding it gives the method a query phase, one more exchange per round."""
        return {}

    def training_loss(self, ctx: ClientContext, model: nn.Module, x, y, payload: Payload) -> torch.Tensor:
        """Loss of one mini-batch: :meth:`functional_loss` of the model's output (cross-entropy, plus
        :meth:`weight_penalty` when a method defines one)."""
        # the weights by name only for a method with a weight penalty: no dict per step on FedAvg's hot path
        has_penalty = type(self).weight_penalty is not Algorithm.weight_penalty
        return self.functional_loss(model(x), y, trainable_weights(model) if has_penalty else {}, ctx.global_weights)

    def functional_loss(self, logits: torch.Tensor, y: torch.Tensor, params: Mapping[str, torch.Tensor],
                        global_weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The mini-batch loss as a pure function of the logits, the labels and the trainable weights: the
        batched client executor evaluates it under ``torch.func.vmap`` for every client at once, so it
        must draw no random numbers and read nothing but its arguments."""
        loss = F.cross_entropy(logits, y)
        penalty = self.weight_penalty(params, global_weights)
        return loss if penalty is None else loss + penalty

    def weight_penalty(self, params: Mapping[str, torch.Tensor],
                       global_weights: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """A loss term of the client's trainable weights ``params`` (name -> tensor) and the round's
        downloaded ``global_weights`` (FedProx's proximal term); None: none. Written functionally, so a
        method that needs only this keeps client batching."""
        return None

    def local_train(self, ctx: ClientContext, model: nn.Module, payload: Payload) -> ClientResult:
        """Local optimisation on the downloaded weights; ``model`` is trained in place.

        What ``training_loss`` records with ``ctx.log`` / ``ctx.timed`` becomes the result's metrics.
        """
        if ctx.scratch.get(DEFER_TRAINING):
            return _read_batches_only(self, ctx)
        head = model.head.parameters() if isinstance(getattr(model, "head", None), nn.Module) else ()
        optimizer = ctx.train.make_optimizer(model.parameters(), head)
        total = torch.zeros((), device=ctx.device)
        steps = 0
        for x, y in self.training_batches(ctx):
            total += self.training_step(ctx, model, optimizer, x, y, payload)
            steps += 1
        return finish_local_train(self, ctx, model, float(total) / max(1, steps))

    def training_batches(self, ctx: ClientContext) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The mini-batches ``(x, y)`` of ``local_train``: this round's batches with the ``augment`` option
        applied (:meth:`augment_batch`). A method that trains on more than (x, y) per batch (PARDON's
        aligned views) overrides this and keeps the rest of the base loop."""
        for x, y, _ in ctx.batches():
            yield self.augment_batch(ctx, x, y)

    def training_step(self, ctx: ClientContext, model: nn.Module, optimizer: torch.optim.Optimizer,
                      x: torch.Tensor, y: torch.Tensor, payload: Payload) -> torch.Tensor:
        """One optimisation step on one mini-batch; returns the detached loss (on the device, no sync).

        Default: one forward-backward pass of ``training_loss`` and an optimiser step. A method that
        changes the step itself (FedSAM's two passes) overrides this, not ``local_train``, so the
        batches, the local options and the logging stay the base loop's.
        """
        loss = self.training_loss(ctx, model, x, y, payload)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def augment_batch(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``augment`` option, applied to each training batch before ``training_loss`` (also in
        peer-to-peer runs; see ``fedstyle.data.augment.augment_labelled``): ``augment_views`` = 0
        augments in place, V >= 1 returns ``[x, view_1, ..., view_V]`` with labels repeated. Draws come
        from torch's generators, seeded by the runtime per client, round and phase; the time spent is
        logged as ``augment_seconds``."""
        if self.hp["augment"] == "none":
            return x, y
        with ctx.timed("augment"):
            return augment_labelled(self.hp["augment"], self.hp["augment_args"], ctx.data.transform, x, y,
                                    self.hp["augment_p"], self.hp["augment_views"])

    def after_local_train(self, ctx: ClientContext, model: nn.Module) -> None:
        """Update persistent client state after local training (e.g. FedDyn's gradient term)."""

    def upload_payload(self, ctx: ClientContext, model: nn.Module) -> Payload:
        """Payload sent up with the weights after local training (default: none)."""
        return {}

    # -- peer-to-peer -------------------------------------------------------------------
    def p2p_share(self, ctx: ClientContext, model: nn.Module, x: torch.Tensor) -> Payload:
        """Payload a device sends its neighbours each iteration, from its current batch (eval mode);
        overriding it gives the method a share phase. Neighbours receive it as ``training_loss``'s
        payload ``{device id: payload}``."""
        return {}


#: the hooks whose override makes a method's step or loss its own (see Algorithm.batching_support)
_STEP_HOOKS = ("local_train", "training_step", "training_loss")

#: ``ctx.scratch`` key the batched client executor sets before calling a wrapped ``local_train``: the base
#: loop then only reads the client's batches (so the wrapper's block sees the data work, e.g. CCST's lazy
#: stylization), restores the generators and returns a placeholder; the executor trains and fills it
DEFER_TRAINING = "fedstyle.defer_training"


def _wraps_only(cls: type, hook: str) -> bool:
    """Whether every class of ``cls``'s hierarchy that overrides ``hook`` lists it in its own BATCHING_WRAPPERS."""
    return all(hook in klass.__dict__.get("BATCHING_WRAPPERS", ()) for klass in cls.__mro__
               if klass is not Algorithm and issubclass(klass, Algorithm) and hook in klass.__dict__)


def trainable_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the optimiser changes (``requires_grad``), by name, in the model's order."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def finish_local_train(algo: Algorithm, ctx: ClientContext, model: nn.Module, mean_loss: float) -> ClientResult:
    """The end of the base ``local_train`` on the trained model (the batched executor ends each client with it)."""
    check_finite(mean_loss, ctx)
    algo.after_local_train(ctx, model)
    return ClientResult(train_loss=mean_loss, payload=algo.upload_payload(ctx, model), metrics=ctx.logged_metrics())


def _read_batches_only(algo: Algorithm, ctx: ClientContext) -> ClientResult:
    """:data:`DEFER_TRAINING`: read every batch, then restore the client's generators and logged values,
    so the executor's replay of ``training_batches`` yields the same batches and logs them once."""
    saved = (dict(ctx._sums), dict(ctx._counts), {k: list(v) for k, v in ctx._timings.items()})
    generator = ctx.generator.get_state()
    with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []):
        for _ in algo.training_batches(ctx):
            pass
    ctx.generator.set_state(generator)
    ctx._sums, ctx._counts, ctx._timings = saved
    return ClientResult(train_loss=float("nan"))


def check_finite(loss: float, ctx: ClientContext) -> None:
    if not torch.isfinite(torch.tensor(loss)):
        raise NonFiniteLossError(
            f"training diverged on client {ctx.client_id} in round {ctx.round + 1} (loss {loss}; learning rate "
            f"{ctx.train.lr:g}); the run stopped and keeps its last good checkpoint — start a new run with a lower "
            "--lr, or check the data"
        )


def apply_reference_code(hp: dict[str, Any], given: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """``reference_code=true``: every value of ``reference`` (a method's public-code choices) replaces the
    default of its hyperparameter, unless that hyperparameter was given explicitly. Returns ``hp``."""
    if hp["reference_code"]:
        for key, value in reference.items():
            if key not in given:
                hp[key] = value
    return hp


def weighted_average(updates: list[ClientUpdate], uniform: bool = False,
                     coefs: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Average of the clients' weights by sample count (or equally, or by the given ``coefs``, which
    are normalised to sum 1); integer buffers are rounded."""
    if not updates:
        raise FedstyleError("no client returned an update this round")
    if coefs is not None:
        if len(coefs) != len(updates):
            raise FedstyleError(f"{len(coefs)} aggregation coefficients for {len(updates)} updates")
        sizes = torch.tensor([float(c) for c in coefs], dtype=torch.float64)
        if not bool(torch.isfinite(sizes).all()) or bool((sizes < 0).any()) or float(sizes.sum()) <= 0:
            raise FedstyleError(f"aggregation coefficients must be finite, >= 0 and not all 0, got {sizes.tolist()}")
    else:
        sizes = torch.tensor([1.0 if uniform else float(u.num_samples) for u in updates], dtype=torch.float64)
    coefs = (sizes / sizes.sum()).tolist()
    out: dict[str, torch.Tensor] = {}
    for key, first in updates[0].weights.items():
        if first.is_floating_point():
            acc = first.detach().to(torch.float32) * coefs[0]
            for c, u in zip(coefs[1:], updates[1:]):
                acc.add_(u.weights[key].to(torch.float32), alpha=c)
            out[key] = acc.to(first.dtype)
        else:  # counters such as BatchNorm's num_batches_tracked
            acc = sum(c * u.weights[key].to(torch.float64) for c, u in zip(coefs, updates))
            out[key] = torch.round(acc).to(first.dtype)
    return out
