"""``fedstyle run --backend flower-sim``: the same run on Flower's simulation engine (Ray).

One virtual SuperNode per client (Flower gives node i the node config ``partition-id=i``); Ray
actors run the ClientApp — the same one a deployment runs — and keep the rebuilt run in memory
between messages. The ServerApp runs in a thread of this process on the experiment already built
here, and writes the same run directory as the in-process simulator.

Where the actors run:

- by default (``--ray-address`` unset or ``local``) on a private Ray instance this run starts on
  this machine with its CPUs (Flower's ``backend_config["init_args"]`` go to ``ray.init``);
- with ``--ray-address auto|HOST:PORT`` on a running Ray cluster (``ray start --head`` on one node,
  ``ray start --address HEAD:PORT`` on the others): this process joins it as a driver with
  ``ray.init(address=...)`` before Flower starts, so Flower's engine (which calls ``ray.init`` only
  when Ray is not initialised yet) uses the cluster, and its actor pool counts the actors that fit
  on every node (``pool_size_from_resources`` walks ``ray.nodes()``). ``auto`` is Ray's: the
  ``RAY_ADDRESS`` environment variable if set, else the cluster ``ray start`` last started on this
  node. At the end Flower calls ``ray.shutdown()``, which disconnects this driver; the cluster keeps
  running. Workers on the cluster were started by its raylets, not by this process, so what they
  need from here travels in the job's ``runtime_env``: this process's ``sys.path`` as ``PYTHONPATH``
  (as Flower does for its private instance: fedstyle must be installed at the same path, or in the
  same environment, on every node) and the torch thread count.

Resources per actor (Ray's ``client_resources``): ``--client-cpus`` CPUs (default 1; the actor's
torch threads too) and ``--client-gpus`` GPUs (default: 0 with ``--device cpu``; on CUDA the GPUs
shared evenly by the actors the CPUs allow, at most one each). For bitwise-identical results with
``--backend sim``, run both with the same torch thread count (one for 1-CPU actors).

Ray starts one actor per CPU (``client_resources.num_cpus = 1``), each with one torch thread;
for bitwise-identical results with ``--backend sim`` run both with one torch thread.

Per-client state is kept where a deployment's sites keep it — in a state folder, here
``<run dir>/flower/state`` — so ``fedstyle run --resume`` of a flower-sim run continues every
client's state (FedDyn, FedBN's local layers) exactly as the in-process simulator does from its
checkpoint.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from fedstyle.errors import ConfigError
from fedstyle.runtimes.flower import require_ray
from fedstyle.runtimes.flower.node_config import SIMULATION_MARKER_ENV, SIMULATION_MARKER_VALUE
from fedstyle.runtimes.site_state import STATE_DIR_ENV

#: the clients' state folder inside the run directory (as a local `fedstyle deploy` keeps it)
SITE_STATE = "flower/state"

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def local_cpus() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def actor_threads(client_cpus: float) -> int:
    """torch threads of an actor holding ``client_cpus`` CPUs (at least one)."""
    return max(1, int(client_cpus))


def actor_gpus(config, device_type: str, total_cpus: float, total_gpus: float) -> float:
    """GPUs per actor: ``--client-gpus``, else 0 on CPU, else the GPUs shared by the actors the CPUs allow."""
    if config.client_gpus is not None:
        return float(config.client_gpus)
    if device_type != "cuda":
        return 0.0
    if total_gpus <= 0:
        raise ConfigError("--device cuda, but the Ray cluster has no GPUs; use --device cpu, or add GPU nodes")
    return min(1.0, total_gpus * config.client_cpus / max(total_cpus, config.client_cpus))


def join_cluster(address: str, threads: int, quiet: bool, extra_env: dict[str, str] | None = None) -> dict[str, float]:
    """Connect this process to the Ray cluster at ``address`` as a driver; its total resources."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if address != "auto":  # fail in seconds, not after Ray's own retries, when nothing listens there
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as err:
            raise ConfigError(f"--ray-address {address}: cannot join a Ray cluster (nothing answers there: "
                              f"{err.strerror or err}); start one with `ray start --head` (docs/guide/deploy.md: "
                              "Many clients), or leave --ray-address out for a private Ray instance") from None
    pythonpath = os.pathsep.join(sys.path)
    env = {"PYTHONPATH": pythonpath, **{k: str(threads) for k in THREAD_VARIABLES}, **(extra_env or {})}
    try:
        ray.init(address=address, runtime_env={"env_vars": env}, logging_level=logging.ERROR,
                 log_to_driver=not quiet)
    except (ConnectionError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--ray-address {address}: cannot join a Ray cluster ({first}); start one with "
                          "`ray start --head` (docs/guide/deploy.md: Many clients), or leave --ray-address out for "
                          "a private Ray instance") from None
    return {k: float(v) for k, v in ray.cluster_resources().items()}


def train_on_flower_sim(exp, out: Path, *, quiet: bool, checkpoint) -> dict[str, Any]:
    """Run ``exp`` into ``out`` with its clients on Flower's simulation engine."""
    require_ray()
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedstyle.runtimes.flower import quiet_flower_noise
    from fedstyle.runtimes.flower.clientapp import app as client_app
    from fedstyle.runtimes.flower.serverapp import FaultPolicy, serve

    # keep Ray's current GPU-visibility behaviour without its FutureWarning about changing it
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    quiet_flower_noise()
    result: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        # the checkpoint passed in is the one serve() reads from `out` (None for a new run)
        result["summary"] = serve(grid, Path(out), FaultPolicy(min_sites=1, wait_timeout=120.0),
                                  quiet=quiet, log_events=not quiet, experiment=exp)

    config = exp.config
    threads = actor_threads(config.client_cpus)
    # the clients' state lives where a deployment's sites keep it, in a state folder (here in the run
    # directory), so a resumed flower-sim run continues every client's state
    state_dir = str((Path(out) / SITE_STATE).resolve())
    address = config.ray_address if config.ray_address not in (None, "local") else None
    if address is None:
        import torch

        cpus = local_cpus()
        gpus = actor_gpus(config, exp.device.type, cpus, torch.cuda.device_count() if exp.device.type == "cuda" else 0)
        init_args = {"num_cpus": cpus, "logging_level": "ERROR", "log_to_driver": not quiet}
    else:
        resources = join_cluster(address, threads, quiet, {STATE_DIR_ENV: state_dir,
                                                           SIMULATION_MARKER_ENV: SIMULATION_MARKER_VALUE})
        gpus = actor_gpus(config, exp.device.type, resources.get("CPU", 0.0), resources.get("GPU", 0.0))
        init_args = {}  # Ray is initialised: Flower's engine uses the cluster as it is
    backend_config = {"client_resources": {"num_cpus": config.client_cpus, "num_gpus": gpus},
                      "init_args": init_args}
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if quiet:
        flwr_logger.setLevel(logging.ERROR)
    # A private instance's workers inherit this environment: the actors' torch threads, whatever the
    # caller's OMP_NUM_THREADS says, so results match --backend sim at that thread count (this
    # process's torch is unaffected). A cluster's workers get them from the runtime_env instead.
    # and the positive marker of this simulation engine (node_config.in_simulation_engine): its sites may take
    # the run's seeded noise, one process playing every party; removed again below
    saved_env = {k: os.environ.get(k) for k in (*THREAD_VARIABLES, STATE_DIR_ENV, SIMULATION_MARKER_ENV)}
    os.environ.update({k: str(threads) for k in THREAD_VARIABLES})
    os.environ[STATE_DIR_ENV] = state_dir
    os.environ[SIMULATION_MARKER_ENV] = SIMULATION_MARKER_VALUE
    try:
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=exp.simulator.num_clients,
                       backend_config=backend_config)
    finally:
        flwr_logger.setLevel(level)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if address is not None:
            import ray

            if ray.is_initialized():  # Flower disconnects on success; after an error, do it here
                ray.shutdown()
    if "summary" not in result:
        raise RuntimeError("Flower's simulation ended without finishing the run; see the log above")
    return result["summary"]
