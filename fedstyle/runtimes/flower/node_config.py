"""A SuperNode's node config as fedstyle reads it (torch-free: the ClientApp's identify imports only this).

``partition-id=K`` (which client of the partition the site holds; Flower's simulation engine sets it),
``data-root="DIR"`` (the site's own copy of the dataset), ``state-dir="DIR"`` (its clients' state folder),
and the site's own privacy settings, which no coordinator can change (docs/privacy.md):
``dp-min-noise=Z`` (the smallest noise multiplier the site releases a defended style with),
``dp-max-clip=C`` (the largest clip it accepts), ``dp-max-epsilon=EPS`` (its budget: the eps, at
``dp-budget-delta``, default 1e-5, that its release ledger may reach; refused beyond).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedstyle.errors import ConfigError

if TYPE_CHECKING:
    from flwr.app import Context

PARTITION_KEY = "partition-id"
DATA_ROOT_KEY = "data-root"
STATE_DIR_KEY = "state-dir"


def client_id_of(context: Context, num_clients: int) -> int:
    """The client this node holds, checked against the run's number of clients."""
    if PARTITION_KEY not in context.node_config:
        raise ConfigError(f"this SuperNode has no {PARTITION_KEY!r} in its node config; start it with "
                          f"--node-config '{PARTITION_KEY}=K' (K = 0..{num_clients - 1})")
    cid = int(context.node_config[PARTITION_KEY])
    if not 0 <= cid < num_clients:
        raise ConfigError(f"node config {PARTITION_KEY}={cid} but the run has clients 0..{num_clients - 1}")
    return cid


#: set by Flower's simulation engine (with partition-id); Flower's deployment guides set it too
#: (``--node-config "partition-id=0 num-partitions=2"``), so it alone says nothing
SIMULATION_KEY = "num-partitions"
#: the positive marker of fedstyle's own simulation engine (``--backend flower-sim``,
#: :func:`fedstyle.runtimes.flower.simulation.train_on_flower_sim` sets it in the environment of the Ray
#: workers it starts and only there). An environment variable: a coordinator sends messages, never a
#: site's environment; the private name and value keep an operator from setting it by accident.
SIMULATION_MARKER_ENV = "_FEDSTYLE_FLOWER_SIM_ENGINE"
SIMULATION_MARKER_VALUE = "fedstyle flower-sim: one process plays every party"


def in_simulation_engine(context: Context) -> bool:
    """Whether this node is one of fedstyle's flower-sim engine's (one process plays every party, so seeded
    noise protects nothing and costs nothing): the marker :data:`SIMULATION_MARKER_ENV` in the environment,
    and Flower's simulation node config (``partition-id`` and ``num-partitions``, no ``state-dir``, which
    every site of ``fedstyle deploy`` / ``fedstyle site`` has). Anything else is a deployment, where what
    the site releases crosses a trust boundary; Flower's usual deployment node config
    ``partition-id=0 num-partitions=2`` is one."""
    return (os.environ.get(SIMULATION_MARKER_ENV) == SIMULATION_MARKER_VALUE
            and SIMULATION_KEY in context.node_config and STATE_DIR_KEY not in context.node_config)


MIN_NOISE_KEY = "dp-min-noise"
MAX_CLIP_KEY = "dp-max-clip"
MAX_EPSILON_KEY = "dp-max-epsilon"
BUDGET_DELTA_KEY = "dp-budget-delta"


@dataclass(frozen=True)
class SitePrivacy:
    """The site operator's privacy settings (node config), applied whatever the coordinator's config says.

    ``min_noise``: the noise multiplier z is at least this (0: no floor); ``max_clip``: the clip C is at
    most this (0: no cap; with a floor and a coordinator that sends no clip, C = ``max_clip``);
    ``max_epsilon``: the eps the site's release ledger may reach at ``budget_delta`` (inf: no budget)."""

    min_noise: float = 0.0
    max_clip: float = 0.0
    max_epsilon: float = math.inf
    budget_delta: float = 1e-5

    def __post_init__(self) -> None:
        for key, flag, value in ((MIN_NOISE_KEY, "--min-noise", self.min_noise), (MAX_CLIP_KEY, "--max-clip", self.max_clip)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{key} (fedstyle deploy site {flag}) must be a finite number >= 0, got {value}")
        if not (self.max_epsilon > 0 and not math.isnan(self.max_epsilon)):
            raise ConfigError(f"{MAX_EPSILON_KEY} (--max-epsilon) must be > 0, got {self.max_epsilon}")
        if not 0 < self.budget_delta < 1:
            raise ConfigError(f"{BUDGET_DELTA_KEY} (--budget-delta) must be in (0, 1), got {self.budget_delta}; "
                              "1e-5 is usual")

    @property
    def floor_set(self) -> bool:
        return self.min_noise > 0 or self.max_clip > 0


def _number(context: Context, key: str, default: float) -> float:
    if key not in context.node_config:
        return default
    raw = context.node_config[key]
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"node config {key}={raw!r} is not a number; restart the SuperNode with "
                          f"--node-config '{key}=...' fixed (docs/privacy.md)") from None


def site_privacy(context: Context) -> SitePrivacy:
    """The operator's :class:`SitePrivacy` from the node config (defaults: no floor, no cap, no budget)."""
    return SitePrivacy(min_noise=_number(context, MIN_NOISE_KEY, 0.0), max_clip=_number(context, MAX_CLIP_KEY, 0.0),
                       max_epsilon=_number(context, MAX_EPSILON_KEY, math.inf),
                       budget_delta=_number(context, BUDGET_DELTA_KEY, 1e-5))


def node_config(partition_id: int, state_dir: str | Path, data_root: str | Path | None = None,
                privacy: SitePrivacy | None = None) -> str:
    """``flower-supernode --node-config`` for a site of fedstyle's (paths made absolute; the site's privacy
    settings where set)."""
    config = f'{PARTITION_KEY}={int(partition_id)} {STATE_DIR_KEY}="{Path(state_dir).expanduser().resolve()}"'
    if data_root:
        config += f' {DATA_ROOT_KEY}="{Path(data_root).expanduser().resolve()}"'
    if privacy is not None:
        for key, value, unset in ((MIN_NOISE_KEY, privacy.min_noise, 0.0), (MAX_CLIP_KEY, privacy.max_clip, 0.0),
                                  (MAX_EPSILON_KEY, privacy.max_epsilon, math.inf),
                                  (BUDGET_DELTA_KEY, privacy.budget_delta, 1e-5)):
            if value != unset:
                config += f" {key}={float(value)!r}"
    return config
