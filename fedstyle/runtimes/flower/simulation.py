"""``fedstyle run --backend flower-sim``: the same run on Flower's simulation engine (Ray).

One virtual SuperNode per client (Flower gives node i the node config ``partition-id=i``); Ray
actors run the ClientApp — the same one a deployment runs — and keep the rebuilt run in memory
between messages. The ServerApp runs in a thread of this process on the experiment already built
here, and writes the same run directory as the in-process simulator.

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
from pathlib import Path
from typing import Any

from fedstyle.runtimes.flower import require_ray
from fedstyle.runtimes.site_state import STATE_DIR_ENV

#: the clients' state folder inside the run directory (as a local `fedstyle deploy` keeps it)
SITE_STATE = "flower/state"

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def train_on_flower_sim(exp, out: Path, *, quiet: bool, checkpoint) -> dict[str, Any]:
    """Run ``exp`` into ``out`` with its clients on Flower's simulation engine."""
    require_ray()
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedstyle.runtimes.flower.clientapp import app as client_app
    from fedstyle.runtimes.flower.serverapp import FaultPolicy, serve

    # keep Ray's current GPU-visibility behaviour without its FutureWarning about changing it
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    result: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        # the checkpoint passed in is the one serve() reads from `out` (None for a new run)
        result["summary"] = serve(grid, Path(out), FaultPolicy(min_sites=1, wait_timeout=120.0),
                                  quiet=quiet, log_events=not quiet, experiment=exp)

    cpus = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "logging_level": "ERROR", "log_to_driver": not quiet},
    }
    if exp.device.type == "cuda":  # share the GPU between the actors
        backend_config["client_resources"]["num_gpus"] = 1.0 / cpus
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if quiet:
        flwr_logger.setLevel(logging.ERROR)
    # Ray's workers inherit this environment: one torch thread per 1-CPU actor, whatever the caller's
    # OMP_NUM_THREADS says, so results match a 1-thread --backend sim (this process's torch is unaffected)
    # ... and keep the clients' state in the run directory (read by the ClientApp in the actors)
    saved_env = {k: os.environ.get(k) for k in (*THREAD_VARIABLES, STATE_DIR_ENV)}
    os.environ.update({k: "1" for k in THREAD_VARIABLES})
    os.environ[STATE_DIR_ENV] = str((Path(out) / SITE_STATE).resolve())
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
    if "summary" not in result:
        raise RuntimeError("Flower's simulation ended without finishing the run; see the log above")
    return result["summary"]
