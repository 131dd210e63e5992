"""The runtimes a run trains on, by name (``--backend``): a registry the runtime packages fill.

``sim`` (the in-process simulators) is fedstyle's own. Runtimes above the experiments layer —
``fedstyle.runtimes`` registers ``flower-sim`` — add themselves when imported; the runner never
imports them. A name that is not registered yet is looked up in the ``fedstyle.backends`` entry
points (pyproject.toml declares fedstyle's own), so ``run_experiment`` finds ``flower-sim`` from
plain Python too, and a third-party runtime plugs in the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

from fedstyle.errors import ConfigError
from fedstyle.registry import Registry

ENTRY_POINT_GROUP = "fedstyle.backends"


@dataclass(frozen=True)
class Backend:
    """A runtime: ``train(experiment, out, quiet=, checkpoint=)`` runs the round loop into ``out``;
    ``check()`` raises a ConfigError naming the install command when the runtime cannot run here
    (called before the run directory is written)."""

    name: str
    train: Callable[..., dict[str, Any]]
    check: Callable[[], None] = lambda: None
    star_only: bool = True
    help: str = ""


BACKENDS: Registry[Backend] = Registry("backend")


def register_backend(backend: Backend) -> Backend:
    if backend.name not in BACKENDS:
        BACKENDS.add(backend.name, backend)
    return backend


def _load_entry_points() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()  # importing the runtime package registers its backends


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        _load_entry_points()
    if name not in BACKENDS:
        raise ConfigError(f"unknown --backend {name!r}; choose one of: {', '.join(BACKENDS.names())}")
    return BACKENDS.get(name)


def refuse_peer_to_peer(config, runtime: str) -> None:
    """Raise a one-line ConfigError when a star-only runtime (Flower: ``--backend flower-sim``,
    ``fedstyle deploy``) is asked for a peer-to-peer graph or a peer-to-peer method (DSGD, StyleDDG),
    naming fedstyle's in-process simulator, which runs them."""
    from fedstyle.algorithms import METHODS

    topologies = METHODS.get(config.method).topologies
    only = f"{runtime} runs star-topology methods only (Flower has no peer-to-peer runtime)"
    if "star" not in topologies:
        raise ConfigError(f"{only}; {config.method} is peer-to-peer: run it on fedstyle's in-process simulator, "
                          f"fedstyle run --backend sim --method {config.method} --topology {topologies[0]}")
    if config.topology != "star":
        raise ConfigError(f"{only}; use --topology star, or run --topology {config.topology} on fedstyle's "
                          "in-process simulator (--backend sim)")


def train_on(name: str, experiment, out: Path, *, quiet: bool, checkpoint) -> dict[str, Any]:
    return get_backend(name).train(experiment, out, quiet=quiet, checkpoint=checkpoint)
