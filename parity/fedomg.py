"""Parity fixture for FedOMG's ``reference_code`` mode: the server step of the authors' DG code.

``skydvn/FedOMG`` (pinned ``COMMIT``), FedOMG-DG/algorithms/FedOMG/utils/fed_merge.py: ``FedOMG`` (:59-79), which
flattens each site's parameter update times its weight, solves ``OMG`` (:82-125, its CAGrad-form dual by 20
steps of softmax SGD) and adds ``global_lr`` times the result to the global model's parameters
(``vector_to_parameters``: buffers untouched). It is called as train_pacs_OMG.py:84 calls it, on
``model_dict`` (three site models), ``weight_dict`` (their weights), the global model, a ``dataobj`` holding
only ``train_domain_list`` (all ``FedOMG`` reads of it) and the two scalars. ``OMG`` is passed ``num_tasks = 3``
(:72), so the fixture has three clients. No random draws; the function imports only torch and numpy.

Models: fedstyle's Digits-DG ConvNet (16 x 16 inputs, 4 channels, BatchNorm) with a 4-class head, the same
module on both sides (the step reads ``parameters()`` and ``state_dict()``). Inputs: the global state from
:func:`parity.common.seeded_weights` (seed 0); client i's state is ``global + 0.01 * (shared + 1.5 *
seeded("client<i>/<key>"))`` for every floating entry (a common direction and conflicting ones, so that the dual's
solution is not uniform), with BatchNorm counters advanced by 5 + i. Two cases: ``weighted`` (weights 30, 50, 20
over their sum, c = 0.5, global_lr = 0.5: train_pacs_OMG.py's defaults) and ``equal`` (weights 1/3, c = 1,
global_lr = 1).

Stored: the client states, the global state, each case's new global state as the code computes it (float32)
and with the models and torch's default dtype in float64 (``<case>64/``; the code unchanged), the weight sums.

Run: ``.venv/bin/python -m parity.fedomg --checkout /tmp/parity/FedOMG``.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

from parity.common import generate, importable, seeded, seeded_weights, weight_sums

REPOSITORY = "skydvn/FedOMG"
COMMIT = "ac53731102b956db1a89768fc5dedb4cc12a1859"
SITES = ("site0", "site1", "site2")
CASES = {"weighted": {"sizes": [30, 50, 20], "c": 0.5, "global_lr": 0.5},
         "equal": {"sizes": [1, 1, 1], "c": 1.0, "global_lr": 1.0}}
SETTINGS = {"input_size": 16, "channels": 4, "classes": 4, "update_scale": 0.01, "conflict": 1.5, "cases": CASES}


def build_model() -> torch.nn.Module:
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    return Classifier(ConvNet(SETTINGS["input_size"], SETTINGS["channels"]), SETTINGS["classes"])


def inputs() -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The global state and the three clients' states (see the module docstring)."""
    base = seeded_weights({k: v.shape for k, v in build_model().state_dict().items()}, seed=0)
    clients = []
    for i in range(len(SITES)):
        state = {}
        for key, value in base.items():
            if not value.is_floating_point():
                state[key] = value + 5 + i
                continue
            move = seeded(f"shared/{key}", value.shape) + SETTINGS["conflict"] * seeded(f"client{i}/{key}", value.shape)
            state[key] = value + SETTINGS["update_scale"] * move
        clients.append(state)
    return base, clients


def run_fedomg(checkout: Path, case: dict, base, clients, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """fed_merge.FedOMG's new global state (see the module docstring); ``dtype`` float64: the models and torch's
    default dtype (its solver's weights, ``torch.zeros``) in float64, the code unchanged."""
    default = torch.get_default_dtype()
    with importable(checkout / "FedOMG-DG" / "algorithms" / "FedOMG"):
        from utils.fed_merge import FedOMG

        torch.set_default_dtype(dtype)
        try:
            global_model = build_model().to(dtype)
            global_model.load_state_dict(base)
            model_dict = {}
            for site, state in zip(SITES, clients):
                model_dict[site] = build_model().to(dtype)
                model_dict[site].load_state_dict(state)
            sizes = case["sizes"]
            weight_dict = {site: n / sum(sizes) for site, n in zip(SITES, sizes)}
            out = FedOMG(model_dict, weight_dict, global_model, types.SimpleNamespace(train_domain_list=list(SITES)),
                         case["global_lr"], case["c"])
        finally:
            torch.set_default_dtype(default)
        return {k: v.detach().clone() for k, v in out.items()}


def run(checkout: Path) -> dict[str, torch.Tensor]:
    base, clients = inputs()
    tensors = {f"global/{k}": v for k, v in base.items()}
    for i, state in enumerate(clients):
        tensors.update({f"client{i}/{k}": v for k, v in state.items()})
    for name, case in CASES.items():
        tensors.update({f"{name}/{k}": v for k, v in run_fedomg(checkout, case, base, clients).items()})
        in64 = run_fedomg(checkout, case, base, clients, torch.float64)
        tensors.update({f"{name}64/{k}": v for k, v in in64.items()})
    tensors.update(weight_sums(base))
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("fedomg", __doc__ or "", REPOSITORY, COMMIT, run, argv=argv, settings=SETTINGS,
                    description="fed_merge.FedOMG (FedOMG-DG/algorithms/FedOMG/utils/fed_merge.py:59) on a fixed "
                                "global state and three client states, two cases of weights, c and global_lr")


if __name__ == "__main__":
    main()
