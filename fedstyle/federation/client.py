"""The client side of a star round, shared by every runtime.

The simulator calls these functions for each sampled client on one shared model object; the
Flower ClientApp calls the same functions with the state kept in Flower's context. Keeping
the procedure in one place is what makes "written once, runs on both" true.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.federation.context import ClientContext, ClientUpdate
from fedstyle.federation.payload import Payload, check_payload

_LOCAL = "local/"
_INITIALISED = "meta/initialised"


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


def enter_client(algo: Algorithm, model: nn.Module, ctx: ClientContext, global_weights: Mapping[str, torch.Tensor]) -> None:
    """Load the downloaded weights, then the client's own local layers, and initialise its state."""
    load_weights(model, global_weights)
    local = {k[len(_LOCAL):]: v for k, v in ctx.state.items() if k.startswith(_LOCAL)}
    if local:
        load_weights(model, local)
    ctx.global_weights = dict(global_weights)
    if _INITIALISED not in ctx.state:
        algo.init_client_state(ctx, model)
        ctx.state[_INITIALISED] = torch.ones(())
    # style ops draw from torch's global generator: seed it per client and round for reproducibility
    torch.manual_seed(ctx.seed)


def leave_client(model: nn.Module, ctx: ClientContext, local_keys: set[str]) -> dict[str, torch.Tensor]:
    weights = snapshot(model)
    for key in local_keys:
        ctx.state[_LOCAL + key] = weights[key].clone()
    return weights


def client_setup_upload(
    algo: Algorithm, model: nn.Module, ctx: ClientContext, global_weights: Mapping[str, torch.Tensor]
) -> Payload | None:
    enter_client(algo, model, ctx, global_weights)
    upload = algo.setup_upload(ctx, model)
    return None if upload is None else check_payload(upload, f"{type(algo).__name__}.setup_upload")


def client_setup_download(
    algo: Algorithm, model: nn.Module, ctx: ClientContext, global_weights: Mapping[str, torch.Tensor], broadcast: Payload
) -> dict[str, float]:
    """Hand the broadcast to the client; returns the setup metrics it reports ({} when none)."""
    enter_client(algo, model, ctx, global_weights)
    metrics = algo.setup_download(ctx, model, broadcast)
    return {k: float(v) for k, v in (metrics or {}).items()}


def client_round_query(
    algo: Algorithm, model: nn.Module, ctx: ClientContext, global_weights: Mapping[str, torch.Tensor]
) -> Payload | None:
    enter_client(algo, model, ctx, global_weights)
    answer = algo.round_query(ctx, model)
    return None if answer is None else check_payload(answer, f"{type(algo).__name__}.round_query")


def client_round(
    algo: Algorithm,
    model: nn.Module,
    ctx: ClientContext,
    global_weights: Mapping[str, torch.Tensor],
    payload: Payload,
    local_keys: set[str],
) -> ClientUpdate:
    """One client's round: download, local training, upload (all keys; local ones stay local too)."""
    enter_client(algo, model, ctx, global_weights)
    result = algo.local_train(ctx, model, payload)
    weights = leave_client(model, ctx, local_keys)
    return ClientUpdate(
        client_id=ctx.client_id,
        weights=weights,
        num_samples=len(ctx.data),
        train_loss=result.train_loss,
        payload=check_payload(result.payload, f"{type(algo).__name__}.local_train"),
        metrics=dict(result.metrics),
    )
