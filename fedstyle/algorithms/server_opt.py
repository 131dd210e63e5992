"""Server optimisers: a step the server takes after a method's own aggregation (``--hp server_opt=NAME``).

A method's ``aggregate`` says how the clients' models combine (FedAvg's average, FedDG-GA's weights,
FedGMA's mask). A server optimiser then moves the global model from the round's starting weights w^r,
given that aggregate w_agg and every client's own update Delta_i = w_i - w^r. It reads nothing else, so it
composes with every star method: ``--method ccst --hp server_opt=omg`` is CCST's clients and aggregation
with FedOMG's on-server gradient matching on top (FedOMG calls itself orthogonal to other methods).

Its options travel in one hyperparameter, ``server_opt_args`` (``NAME=VALUE,...``, declared and checked by
the optimiser: ``--hp server_opt_args=kappa=0.3,lr=1``), so every method accepts every server optimiser
without declaring its options. An optimiser is a :class:`ServerOptimizer` registered in
:data:`SERVER_OPTS` by the file of its method (``fedstyle/algorithms/fedomg.py``); a run without one
(``server_opt=none``, the default) is the method's aggregation alone.

It moves the trainable parameters the clients share (``keys``: the run's parameters less the clients'
local layers); buffers (BatchNorm's running statistics) and local layers are the method's aggregate's
unless the optimiser says otherwise. What it logs in ``server.metrics`` reaches the round's metrics.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Mapping, Sequence

import torch

from fedstyle.algorithms.context import ClientUpdate, ServerContext
from fedstyle.algorithms.hparams import HParam, resolve_hparams
from fedstyle.errors import ConfigError
from fedstyle.registry import Registry

#: the server optimisers by name (filled by the method files that define them)
SERVER_OPTS: Registry = Registry("server optimiser")

#: the names ``server_opt`` accepts; tests/test_fedomg.py checks it against :data:`SERVER_OPTS`
SERVER_OPT_CHOICES = ("none", "omg")

#: the two hyperparameters every method carries (see ``Algorithm.HPARAMS``)
SERVER_OPT_HPARAMS = (
    HParam("server_opt", "none", "a server-side step after the method's aggregation (none, or omg: FedOMG's "
           "on-server gradient matching, Nguyen et al. ICLR'25; see fedstyle.algorithms.fedomg)",
           choices=SERVER_OPT_CHOICES),
    HParam("server_opt_args", "", "the server optimiser's options NAME=VALUE,... (omg: kappa, lr, steps, "
           "rescale, reference_code), e.g. kappa=0.3,lr=1"),
)


class ServerOptimizer:
    """Base class: declares its options in ``HPARAMS`` and implements :meth:`step`."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    HPARAMS: ClassVar[tuple[HParam, ...]] = ()

    def __init__(self, options: Mapping[str, Any]):
        self.hp = resolve_hparams(self.HPARAMS, options, f"server_opt={self.name}")

    def step(self, server: ServerContext, updates: list[ClientUpdate], aggregated: dict[str, torch.Tensor],
             keys: Sequence[str], uniform: bool) -> dict[str, torch.Tensor]:
        """The new global weights from ``server.weights`` (w^r), the clients' ``updates`` and the method's
        ``aggregated`` weights; moves ``keys`` (``uniform``: the method weighs clients equally)."""
        raise NotImplementedError


def parse_server_opt_args(text: str) -> dict[str, str]:
    """``"k=v,k2=v2"`` as a dict (values still strings; the optimiser's HParams parse them)."""
    out: dict[str, str] = {}
    for entry in (e.strip() for e in str(text).split(",")):
        if not entry:
            continue
        key, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not key:
            raise ConfigError(f"server_opt_args expects NAME=VALUE entries separated by commas, got {entry!r} "
                              "(e.g. --hp server_opt_args=kappa=0.3,lr=1)")
        out[key] = value
    return out


def build_server_opt(hp: Mapping[str, Any]) -> ServerOptimizer | None:
    """The server optimiser a method's resolved hyperparameters ask for (None for ``server_opt=none``)."""
    if hp["server_opt"] == "none":
        if hp["server_opt_args"].strip():
            raise ConfigError("server_opt_args is given but server_opt is none; add --hp server_opt=omg")
        return None
    return SERVER_OPTS.get(hp["server_opt"])(parse_server_opt_args(hp["server_opt_args"]))


def server_update(algo, server: ServerContext, updates: list[ClientUpdate],
                  keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """The round's new global weights: ``algo.aggregate``, then its server optimiser (if any) on ``keys``,
    whose numbers and ``server_opt_seconds`` join ``server.metrics``."""
    aggregated = algo.aggregate(server, updates)
    optimizer = getattr(algo, "server_opt", None)
    if optimizer is None:
        return aggregated
    start = time.perf_counter()
    out = optimizer.step(server, updates, aggregated, keys, uniform=algo.hp["aggregation"] == "uniform")
    server.metrics["server_opt_seconds"] = time.perf_counter() - start
    return out
