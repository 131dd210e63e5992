"""Every star-topology method, as registered, runs under Flower unchanged: through the real ServerApp and
ClientApp (tests/flower_grid.py: every message in Flower's wire format, the clients' state in the sites' state
folder) it gives the in-process simulator's metrics, bytes and final weights, bitwise. A new method is picked up
from the registry. The processes around those apps (Ray, SuperLink and SuperNodes) are method-independent and
tested in test_flower_sim.py and test_flower_deploy.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs fedstyle[flower] (flwr not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.algorithms import METHODS  # noqa: E402
from fedstyle.experiments.runner import run_experiment  # noqa: E402
from flower_grid import run_under_flower  # noqa: E402
from run_records import evaluations  # noqa: E402

#: cheaper settings of the same code paths (CCST and PARDON: the FFT style transfer, not the decoder network)
FAST_HPARAMS = {"ccst": {"style_backend": "fft", "k": 1}, "pardon": {"style_backend": "fft"}}

STAR_METHODS = [name for name, cls in METHODS.items() if "star" in cls.topologies]
#: modes with exchanges of their own: FedDyn's reference mode sends the clients' sizes in a setup exchange, for
#: an alpha per client (clients of unequal size, or every scale would be 1)
#: FedDG-FFT's episodic mode trains on an aligned view of each image (its amplitude-exchanged copy), which the
#: sites keep in their own data as the simulator's clients do
MODES = [("feddyn", {"reference_code": True}), ("feddg_fft", {"episodic": True})]
UNEQUAL_CLIENTS = {"partition": "dirichlet", "clients": 3}


def test_the_matrix_holds_every_star_method():
    assert len(STAR_METHODS) >= 20 and {"fedavg", "ccst", "stablefdg", "pardon", "fedgca"} <= set(STAR_METHODS)


@pytest.mark.parametrize("method,hparams", [(m, FAST_HPARAMS.get(m, {})) for m in STAR_METHODS] + MODES,
                         ids=STAR_METHODS + [f"{m}-{'-'.join(h)}" for m, h in MODES])
def test_a_method_under_flower_equals_the_simulator(tiny_config, tmp_path, method, hparams):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = tiny_config.updated(method=method, hparams=hparams, rounds=2, lr_schedule="constant",
                                     **(UNEQUAL_CLIENTS if method == "feddyn" and hparams else {}))
        simulated = run_experiment(config, tmp_path / "sim", quiet=True)
        flower = run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(before)
    assert flower["targets"] == simulated["targets"]
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")  # accuracies, losses, terms, bytes
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    weights = [k for k in a if k.startswith("global/")]
    assert weights and all(torch.equal(a[k], b[k]) for k in weights)
    if method == "feddyn" and hparams:  # the exchange gave the clients different alphas, the same in both runtimes
        scales = {k: v for k, v in a.items() if k.endswith("feddyn/alpha_scale")}
        assert len({float(v) for v in scales.values()}) == 3, scales
