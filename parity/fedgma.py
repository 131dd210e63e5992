"""Parity fixture for FedGMA's ``reference_code`` mode: the server's masked aggregation of the FedDG
benchmark and of PARDON's fork of it.

FedGMA has no code of its own authors (baselines notes §4); fedstyle's ``reference_code=true`` follows
the two FedDG codebases that ship it, so this generator runs both, from two checkouts:

- ``judydnguyen/PARDON-FedDG`` (``--checkout``, pinned ``COMMIT``): ``FedGMA.aggregate``
  (src/server.py:278-309), with ``hparam = {"mask_threshold": 0.4, "step_size": 1.0}`` (its PACS configs,
  config/FedGMA/pacs/scheme-01/*.json:21-22);
- ``inouye-lab/FedDG_Benchmark`` (``--benchmark``, pinned ``BENCHMARK_COMMIT``): ``FedGMA.aggregate``
  (src/server.py:351-381), with ``hparam = {"hparam1": 0.4}`` (the threshold, which that code also uses as
  the server step size, src/server.py:379).

Both are called as unbound methods on a bare server object (``object.__new__`` of their class) that holds
only what ``aggregate`` reads: ``model`` (the global model), ``clients`` (objects with a ``model``) and
``hparam``. The models are fedstyle's Digits-DG ConvNet (16 x 16 inputs, 4 channels, BatchNorm) with a
4-class head: the aggregation only reads ``state_dict()``, so both sides use the same module and keys.
Inputs: the global state from :func:`parity.common.seeded_weights` (seed 0) and four client states
``global + 0.01 * seeded("client<i>/<key>")`` with about a third of each client's coordinates left
unchanged (a zero update: sign 0), running statistics moved the same way and the BatchNorm counters
advanced by 5 + i steps. The aggregation weights are the clients' sizes (30, 50, 20, 40) over their sum,
as the benchmark's ``train_federated_model`` passes them. There are no random draws.

Import stubs (:func:`parity.common.feddg_benchmark_imports`): the two ``src/server.py`` pull in their whole
training stack at import time. The packages they name that are not installed here and that ``aggregate`` never
touches — torchvision, wandb, wilds, termcolor, transformers, torch_scatter — are replaced by empty stub modules
while the authors' modules import; PARDON's ``src/adain_net.py`` (the AdaIN VGG and decoder) is stubbed too,
and ``torch.load`` returns an empty dict during that import, because ``src/server.py:22-30`` and
``src/client.py:28-36`` load ``src/models/*.pth`` (not in the repository) at module level.

Stored: the client states and the global state (whole: the model is small), each codebase's aggregated
state, the weight sums.

Run: ``.venv/bin/python -m parity.fedgma --checkout /tmp/parity/PARDON-FedDG --benchmark /tmp/parity/FedDG_Benchmark``.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

from parity.common import (feddg_benchmark_imports, generator_name, importable, parse_args, require_checkout, seeded,
                           seeded_weights, weight_sums, write_fixture)

REPOSITORY = "judydnguyen/PARDON-FedDG"
COMMIT = "e5df7dd8de43142413885b336e66210104ce9162"
BENCHMARK_REPOSITORY = "inouye-lab/FedDG_Benchmark"
BENCHMARK_COMMIT = "da58f764cffc98e537209dc799009ffdf2f36574"

SIZES = (30, 50, 20, 40)
TAU = 0.4
PARDON_STEP = 1.0
SETTINGS = {"input_size": 16, "channels": 4, "classes": 4, "sizes": list(SIZES), "tau": TAU,
            "pardon_step_size": PARDON_STEP, "benchmark_hparam1": TAU, "update_scale": 0.01}


def build_model() -> torch.nn.Module:
    """The model both sides aggregate (fedstyle's ConvNet with a head; only its state is used)."""
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    return Classifier(ConvNet(SETTINGS["input_size"], SETTINGS["channels"]), SETTINGS["classes"])


def inputs() -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The global state and the four clients' states (see the module docstring)."""
    shapes = {k: v.shape for k, v in build_model().state_dict().items()}
    base = seeded_weights(shapes, seed=0)
    clients = []
    for i in range(len(SIZES)):
        state = {}
        for key, value in base.items():
            if not value.is_floating_point():
                state[key] = value + 5 + i
                continue
            step = seeded(f"client{i}/{key}", value.shape) * SETTINGS["update_scale"]
            keep = seeded(f"client{i}/{key}/unchanged", value.shape) > 0.43  # about a third unchanged
            state[key] = torch.where(keep, value, value + step)
        clients.append(state)
    return base, clients


#: the FedDG benchmark's src/server.py also imports these (not installed here, unused by aggregate())
BENCHMARK_STUBS = ("transformers", "torch_scatter")


def run_aggregate(checkout: Path, hparam: dict, base, clients) -> dict[str, torch.Tensor]:
    """The codebase's ``FedGMA.aggregate`` on a bare server holding ``base`` and the ``clients``' states."""
    with importable(checkout), feddg_benchmark_imports(*BENCHMARK_STUBS):
        import src.server as server_module

        server = object.__new__(server_module.FedGMA)
        server.hparam = dict(hparam)
        server.model = build_model()
        server.model.load_state_dict(base)
        server.clients = []
        for state in clients:
            model = build_model()
            model.load_state_dict(state)
            server.clients.append(types.SimpleNamespace(model=model))
        coefficients = [s / sum(SIZES) for s in SIZES]
        server.aggregate(list(range(len(clients))), coefficients)
        return {k: v.detach().clone() for k, v in server.model.state_dict().items()}


def main(argv: list[str] | None = None) -> Path:
    args = parse_args("fedgma", (__doc__ or "").split("\n")[0], REPOSITORY, COMMIT, argv,
                      others={"benchmark": (BENCHMARK_REPOSITORY, BENCHMARK_COMMIT)})
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    benchmark_commit = require_checkout(args.benchmark, BENCHMARK_COMMIT, args.allow_unpinned)

    base, clients = inputs()
    pardon = run_aggregate(args.checkout, {"mask_threshold": TAU, "step_size": PARDON_STEP}, base, clients)
    benchmark = run_aggregate(args.benchmark, {"hparam1": TAU}, base, clients)

    tensors = {f"global/{k}": v for k, v in base.items()}
    for i, state in enumerate(clients):
        tensors.update({f"client{i}/{k}": v for k, v in state.items()})
    tensors.update({f"pardon/{k}": v for k, v in pardon.items()})
    tensors.update({f"benchmark/{k}": v for k, v in benchmark.items()})
    tensors.update(weight_sums(base))
    settings = dict(SETTINGS, benchmark_repository=BENCHMARK_REPOSITORY, benchmark_commit=benchmark_commit)
    return write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name("fedgma"),
                         description="FedGMA.aggregate of PARDON's fork (src/server.py:278) and of the FedDG "
                                     "benchmark (src/server.py:351) on a fixed global state and four client states",
                         settings=settings)


if __name__ == "__main__":
    main()
