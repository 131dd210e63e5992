"""A SuperNode's node config as fedstyle reads it (torch-free: the ClientApp's identify imports only this).

``partition-id=K`` (which client of the partition the site holds; Flower's simulation engine sets it),
``data-root="DIR"`` (the site's own copy of the dataset), ``state-dir="DIR"`` (its clients' state folder).
"""

from __future__ import annotations

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


#: set by Flower's simulation engine (with partition-id) and never by fedstyle's deployments
SIMULATION_KEY = "num-partitions"


def in_simulation_engine(context: Context) -> bool:
    """Whether this node is one of Flower's simulation engine's (one process plays every party): it sets
    ``num-partitions`` and never ``state-dir``, which every site of ``fedstyle deploy`` / ``fedstyle site`` has.
    Anything else is a deployment, where what the site releases crosses a trust boundary."""
    return SIMULATION_KEY in context.node_config and STATE_DIR_KEY not in context.node_config


def node_config(partition_id: int, state_dir: str | Path, data_root: str | Path | None = None) -> str:
    """``flower-supernode --node-config`` for a site of fedstyle's (paths made absolute)."""
    config = f'{PARTITION_KEY}={int(partition_id)} {STATE_DIR_KEY}="{Path(state_dir).expanduser().resolve()}"'
    if data_root:
        config += f' {DATA_ROOT_KEY}="{Path(data_root).expanduser().resolve()}"'
    return config
