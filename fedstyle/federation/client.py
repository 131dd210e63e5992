"""The client side of a star round, shared by every runtime.

The in-process transport calls :func:`run_client_phase` for each client on one shared model
object; the Flower ClientApp calls the same function with the state kept on the site. Keeping
the procedure in one place is what makes "written once, runs on both" true.

Before every hook the procedure loads the downloaded weights, then the client's own local layers
(FedBN), sets the model's mode for the phase (``ClientContext`` / ``PHASE_MODES``: eval except in
training), offers a frozen copy of the round's global model, and seeds torch's generators from
the context's seed.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Callable, Mapping

import torch
from torch import nn

from fedstyle.algorithms.base import Algorithm, ClientResult
from fedstyle.algorithms.context import PHASE_MODES, ClientContext, ClientUpdate
from fedstyle.errors import ConfigError
from fedstyle.models.base import Classifier
from fedstyle.payload import Payload, check_payload

_LOCAL = "local/"
_INITIALISED = "meta/initialised"

#: the client phases of a star run: name -> (context purpose, round the context sees; None: the round's)
PHASES: dict[str, tuple[str, int | None]] = {
    "setup_upload": ("setup", -1),
    "setup_download": ("setup", -1),
    "round_query": ("query", None),
    "train": ("train", None),
}


@torch.no_grad()
def load_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy ``weights`` into the model's parameters and buffers in place (no reallocation)."""
    state = model.state_dict(keep_vars=True)
    for key, value in weights.items():
        target = state[key]
        target.data.copy_(value) if isinstance(target, nn.Parameter) else target.copy_(value)


@torch.no_grad()
def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the model's state (what a client sends back)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class FrozenGlobal:
    """One frozen copy of a model per process: eval mode, no gradients, reloaded only when the
    weights it is asked for change (the simulator hands every client of a round the same dict).

    ``own`` are the asking client's local layers (FedBN's BatchNorm), which the download lacks: the
    client's view of the global model is the global weights with its own local layers, loaded when
    the client changes (the dict is made once per client call)."""

    def __init__(self, model: nn.Module):
        self.copy = copy.deepcopy(model)
        for p in self.copy.parameters():
            p.requires_grad_(False)
            p.grad = None
        self.copy.eval()
        self._loaded: Mapping[str, torch.Tensor] | None = None
        self._own: Mapping[str, torch.Tensor] | None = None

    def get(self, weights: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
        if weights is not self._loaded:
            load_weights(self.copy, weights)
            self._loaded = weights  # keeps the dict alive, so its identity cannot be reused
            self._own = None
        if own and own is not self._own:
            load_weights(self.copy, own)
            self._own = own
        self.copy.eval()
        return self.copy


_FROZEN: "weakref.WeakKeyDictionary[nn.Module, FrozenGlobal]" = weakref.WeakKeyDictionary()


def frozen_global(model: nn.Module, weights: Mapping[str, torch.Tensor],
                  own: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """The frozen copy of ``model`` holding ``weights`` and then ``own`` (the client's local layers;
    made once per model object, on first use)."""
    holder = _FROZEN.get(model)
    if holder is None:
        holder = _FROZEN[model] = FrozenGlobal(model)
    return holder.get(weights, own)


def enter_client(
    algo: Algorithm,
    model: nn.Module,
    ctx: ClientContext,
    global_weights: Mapping[str, torch.Tensor],
    initial_weights: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Load the downloaded weights, then the client's local layers, set the phase's mode, initialise state.

    Keys missing from ``global_weights`` (a client's local layers, which never travel) come from the
    client's state, or — before its first round — from ``initial_weights`` (the run's initial model,
    which every process rebuilds from the config and seed).
    """
    load_weights(model, global_weights)
    local = {k[len(_LOCAL):]: v for k, v in ctx.state.items() if k.startswith(_LOCAL)}
    own = dict(local)  # the client's layers that never travel, for its view of the global model
    if initial_weights is not None:
        missing = {k: v for k, v in initial_weights.items() if k not in global_weights and k not in local}
        if missing:
            load_weights(model, missing)
            own.update(missing)
    if local:
        load_weights(model, local)
    ctx.global_weights = dict(global_weights)
    ctx.global_model_source = lambda: frozen_global(model, global_weights, own)
    if _INITIALISED not in ctx.state:
        algo.init_client_state(ctx, model)
        ctx.state[_INITIALISED] = torch.ones(())
    if isinstance(model, Classifier):
        model.enter_round(ctx.round + 1)  # FixBN's switch (Classifier.set_batchnorm), before the mode is set
    model.train(PHASE_MODES[ctx.phase] == "train")
    # style ops draw from torch's global generator: seed it per client and round for reproducibility
    torch.manual_seed(ctx.seed)


def leave_client(model: nn.Module, ctx: ClientContext, local_keys: set[str]) -> dict[str, torch.Tensor]:
    weights = snapshot(model)
    for key in local_keys:
        ctx.state[_LOCAL + key] = weights[key].clone()
    return weights


def _setup_upload(algo, model, ctx, payload, local_keys) -> Payload:
    return check_payload(algo.setup_upload(ctx, model), f"{type(algo).__name__}.setup_upload")


def _setup_download(algo, model, ctx, payload, local_keys) -> dict[str, float]:
    metrics = algo.setup_download(ctx, model, payload)
    return {k: float(v) for k, v in (metrics or {}).items()}


def _round_query(algo, model, ctx, payload, local_keys) -> Payload:
    return check_payload(algo.round_query(ctx, model), f"{type(algo).__name__}.round_query")


def _train(algo, model, ctx, payload, local_keys) -> ClientUpdate:
    return client_update(algo, model, ctx, algo.local_train(ctx, model, payload), local_keys)


def client_update(algo: Algorithm, model: nn.Module, ctx: ClientContext, result: ClientResult,
                  local_keys: set[str]) -> ClientUpdate:
    """The trained client's reply: its weights (local ones also kept in its state) and ``result``."""
    weights = leave_client(model, ctx, local_keys)
    for key in algo.private_keys(model):  # kept in the client's state by leave_client, never sent
        del weights[key]
    return ClientUpdate(
        client_id=ctx.client_id,
        weights=weights,
        num_samples=len(ctx.data),
        train_loss=result.train_loss,
        payload=check_payload(result.payload, f"{type(algo).__name__}.local_train"),
        metrics={k: float(v) for k, v in result.metrics.items()},
    )


_PROCEDURES: dict[str, Callable[..., Any]] = {
    "setup_upload": _setup_upload,
    "setup_download": _setup_download,
    "round_query": _round_query,
    "train": _train,
}


def run_client_phase(
    phase: str,
    algo: Algorithm,
    model: nn.Module,
    ctx: ClientContext,
    global_weights: Mapping[str, torch.Tensor],
    payload: Payload,
    local_keys: set[str],
    initial_weights: Mapping[str, torch.Tensor],
):
    """One client's part of ``phase``: enter (weights, local layers, mode, seed), then the hook.

    Returns the setup upload or query answer (a payload), the setup metrics, or the training
    :class:`ClientUpdate` (all weights; local ones are also kept in the client's state).
    """
    if phase not in _PROCEDURES:
        raise ConfigError(f"unknown client phase {phase!r}; one of {', '.join(_PROCEDURES)}")
    enter_client(algo, model, ctx, global_weights, initial_weights)
    return _PROCEDURES[phase](algo, model, ctx, payload, local_keys)
