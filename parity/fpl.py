"""Parity fixture for ``fpl``: FPL's server clustering and client loss in WenkeHuang/RethinkFL.

Runs, from a checkout of the authors' repository at ``COMMIT``:

* ``FPL.proto_aggregation`` (``models/fpl.py:52-88``), with their FINCH (``utils/finch.py:119``), on fixed
  client prototypes: 6 clients x 64-d prototypes of classes 0-3, client c from "domain" c % 3 (class 0 held
  by all six clients, class 1 by four, class 2 by three, class 3 by two), so FINCH's coarsest partition gives
  3, 2, 1 and 1 clusters. The prototypes are ``seeded`` (they are stored too: 18 x 64 floats).
* ``FPL._train_net`` (``models/fpl.py:134-197``: CE + per-sample ``hierarchical_info_loss`` =
  ``calculate_infonce`` against the cluster prototypes + MSE to the unbiased prototype, ``:90-121``), one
  local epoch on one batch of 10 ``seeded`` 16 x 16 images with labels 0-4 (class 4 has no prototype) of
  client 0, on fedstyle's ConvNet (``build_model("convnet", 5, 16)``, weights from ``seeded_weights``), its
  ``features`` the authors' ``net.features`` and its ``head`` their ``net.classifier``; temperature
  ``--infoNCET`` 0.02 (``main.py:55`` at this commit). Recorded: the CE, every sample's InfoNCE and MSE
  term (by wrapping the instance's methods), the gradients of every weight after their backward (read
  before the optimiser's next zero_grad) and the local prototypes the client would upload
  (``agg_func``, ``models/fpl.py:19-33``: the class means of the batch's features).

No random draw is involved: the online clients are taken in id order (the code draws their order, which
changes neither FINCH's partition nor the loss), and there is no augmentation.

Stubs (their code imports them for things these functions never use): ``torchvision`` (a type annotation of
``models/utils/federated_model.py``), ``utils.args`` (``models/fpl.py``'s argparse helpers, which would import
every dataset module), and a ``models`` package without ``models/__init__.py`` (which imports every model
from the current directory).

Needs numpy < 1.24 (their code builds ``np.array`` of lists of tensors: numpy 1.24+ raises on the ragged
list and coerces the equal-shaped one to a float array, ``models/fpl.py:91-95``) and a scipy / scikit-learn
that go with it, in a scratch folder on PYTHONPATH, e.g.:
``.venv/bin/pip install --target /tmp/parity-deps/fpl -c constraints.txt numpy==1.23.5 scipy==1.10.1
scikit-learn==1.2.2``.

Run: ``PYTHONPATH=/tmp/parity-deps/fpl .venv/bin/python -m parity.fpl --checkout /tmp/parity/RethinkFL``.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path

import torch

from parity.common import (detached, generator_name, gradient_record, importable, parse_args, recorder,
                           require_checkout, seeded, seeded_weights, stub_modules, weight_sums, write_fixture)

REPOSITORY = "WenkeHuang/RethinkFL"
COMMIT = "74201b3762746e6328fdf5b8fc6cb8ecca768aef"
NAME = "fpl"

NUM_CLASSES, SIZE, BATCH = 5, 16, 10
DIM = 64  # the ConvNet's feature width at 16 x 16
TAU = 0.02  # main.py:55 (--infoNCET) at COMMIT
LR = 0.01  # utils/best_args.py (local_lr), irrelevant to the recorded step
#: classes each client holds (client c's "domain" is c % 3)
CLIENT_CLASSES = ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2), (0, 1), (0,), (0,))
LABELS = (0, 1, 2, 3, 4, 0, 1, 2, 0, 4)
SETTINGS = {"num_classes": NUM_CLASSES, "size": SIZE, "batch": BATCH, "tau": TAU, "client_classes": CLIENT_CLASSES,
            "labels": LABELS, "model": "convnet", "seed": 0}


def client_prototypes() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(protos (K_c, 64), classes (K_c,)) per client: non-negative like ConvNet features, grouped by domain."""
    out = []
    for c, classes in enumerate(CLIENT_CLASSES):
        rows = []
        for k in classes:
            base = seeded(f"fpl/base/{k}", (DIM,)).abs()
            domain = seeded(f"fpl/domain/{c % 3}/{k}", (DIM,)).abs()
            rows.append((base + 0.8 * domain + 0.05 * seeded(f"fpl/noise/{c}/{k}", (DIM,))).clamp_min(0.0))
        out.append((torch.stack(rows), torch.tensor(classes)))
    return out


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("fpl/x", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def model_state() -> dict[str, torch.Tensor]:
    from fedstyle.models import build_model

    return seeded_weights({k: v.shape for k, v in build_model("convnet", NUM_CLASSES, SIZE).state_dict().items()})


def stubs(checkout: Path):
    """``torchvision``, ``utils.args`` and a bare ``models`` package in sys.modules while the block runs."""
    def no_arguments(parser):
        return None

    return stub_modules(attrs={
        "torchvision": {}, "torchvision.transforms": {},
        "utils.args": {"ArgumentParser": ArgumentParser, "add_management_args": no_arguments,
                       "add_experiment_args": no_arguments,
                       "__all__": ["ArgumentParser", "add_management_args", "add_experiment_args"]},
        "models": {"__path__": [str(checkout / "models")]}})


class AuthorsNet(torch.nn.Module):
    """fedstyle's ConvNet with the interface ``_train_net`` calls: ``features`` and ``classifier``."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.logits = None

    def features(self, x):
        return self.model.features(x)

    def classifier(self, f):
        self.logits = self.model.head(f)
        return self.logits


def run(checkout: Path) -> dict[str, torch.Tensor]:
    import numpy as np

    if tuple(int(v) for v in np.__version__.split(".")[:2]) >= (1, 24):
        raise SystemExit(f"error: numpy {np.__version__}: the authors' code needs numpy < 1.24 (see --help); "
                         "put one on PYTHONPATH, e.g. PYTHONPATH=/tmp/parity-deps/fpl")
    import torch.nn.functional as F
    from torch import nn

    from fedstyle.models import build_model

    with stubs(checkout), importable(checkout):
        from models.fpl import FPL

        algo = FPL.__new__(FPL)  # its __init__ makes checkpoint folders; set what these methods read
        nn.Module.__init__(algo)
        algo.device = torch.device("cpu")
        algo.infoNCET, algo.local_epoch, algo.local_lr = TAU, 1, LR
        algo.online_clients = list(range(len(CLIENT_CLASSES)))
        clients = client_prototypes()
        algo.local_protos = {c: {int(k): p for p, k in zip(protos, classes)} for c, (protos, classes) in
                             enumerate(clients)}
        algo.global_protos = algo.proto_aggregation(algo.local_protos)

        out: dict[str, torch.Tensor] = {}
        for c, (protos, classes) in enumerate(clients):
            out[f"client/{c}/protos"], out[f"client/{c}/classes"] = protos, classes
        for k in sorted(algo.global_protos):
            out[f"cluster/{k}"] = torch.cat([p.reshape(1, -1) for p in algo.global_protos[k]]).float()

        # one local step of client 0 against these cluster prototypes
        torch.manual_seed(0)
        model = build_model("convnet", NUM_CLASSES, SIZE)
        state = model_state()
        model.load_state_dict(state)
        model.train()
        net = AuthorsNet(model)
        algo.calculate_infonce = recorder(algo.calculate_infonce, detached)
        algo.hierarchical_info_loss = recorder(algo.hierarchical_info_loss, detached)
        terms, infonce = algo.hierarchical_info_loss.values, algo.calculate_infonce.values
        x, y = batch()
        algo.local_protos = {}
        algo._train_net(0, net, [(x, y)])
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}

    ce = F.cross_entropy(net.logits.detach(), y)  # their nn.CrossEntropyLoss() on these logits
    total_info = torch.stack([t.reshape(()) for t in terms]).sum() / len(LABELS)
    cpcl = torch.stack([t.reshape(()) for t in infonce]).sum() / len(LABELS)
    out.update({"labels": y, "loss/ce": ce.reshape(1), "loss/cpcl": cpcl.reshape(1),
                "loss/upcr": (total_info - cpcl).reshape(1), "loss/total": (ce + total_info).reshape(1)})
    for k, proto in sorted(algo.local_protos[0].items()):
        out[f"local/{k}"] = proto.detach().reshape(-1).float()
    out.update(gradient_record(grads))
    out.update(weight_sums(state))
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(NAME, __doc__.splitlines()[0], REPOSITORY, COMMIT, argv)
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    tensors = run(args.checkout)
    counts = {k: int(v.shape[0]) for k, v in tensors.items() if k.startswith("cluster/")}
    assert sorted(counts.values()) != [1] * len(counts), f"FINCH made one cluster per class: {counts}"
    write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name(NAME),
                  description="FPL: FINCH cluster prototypes of fixed client prototypes; one local step's CE, "
                              "InfoNCE (CPCL) and MSE (UPCR) terms, gradients and batch prototypes",
                  settings=dict(SETTINGS, clusters=counts))


if __name__ == "__main__":
    main()
