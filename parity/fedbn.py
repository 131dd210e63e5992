"""Parity fixture for FedBN (its default, and its ``reference_code`` mode): two rounds of the authors' training and ``communication``.

The authors' code (``med-air/FedBN``, pinned ``COMMIT``) runs unchanged: ``federated/fed_digits.py``'s ``train``
(lines 87-108: one pass over the client's loader, cross-entropy, plain SGD) for each of three clients, then
``communication`` with ``args.mode = 'fedbn'`` (lines 164-175: every state entry whose name holds ``bn`` stays on
its client; the others are averaged with ``client_weights``, copied into the server model and sent back to every
client). ``client_weights`` is the script's ``[1 / client_num] * client_num`` (line 247): a uniform average, whatever
the clients' sizes. The optimisers are made afresh each round as in its loop (line 282), ``optim.SGD(lr=1e-2)``.

The three clients hold 10, 6 and 14 samples (unequal, so a uniform average differs from an average by size,
``aggregation=size``), batch 4, 2 rounds. The model is the authors' ``DigitModel`` layout narrowed to run in milliseconds
(``conv1``/``bn1``, ``conv2``/``bn2``, ``fc1``/``bn4``, ``fc3``: the names the code's ``'bn' in key`` rule reads),
built on both sides by :func:`build_model`, its weights :func:`parity.common.seeded_weights` (seed 0). The loaders
are plain ``DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)``: the code's own loaders read the Digits
files, and their shuffle is the one random draw of a round; the test feeds fedstyle the same batches in order.

Import stubs: ``fed_digits.py`` and ``utils/data_utils.py`` import torchvision, which does not import with this
torch; it is a stub module (only ``prepare_data`` uses it, which this run never calls). ``communication`` reads the
module global ``client_num``, which the script sets in its ``__main__`` block: the generator sets it.

Stored: the data, the initial weights' sums, every client's whole state after each round's ``communication``
(``client<i>/r<k>/<key>``) and the server model's averaged entries (``server/r<k>/<key>``).

Run: ``.venv/bin/python -m parity.fedbn --checkout /tmp/parity/FedBN``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from parity.common import generate, importable, seeded, seeded_weights, stub_modules, weight_sums

REPOSITORY = "med-air/FedBN"
COMMIT = "2fa38adf627a8c8ba71c5fb515b1f2ba00aa8812"

SIZES = (10, 6, 14)
SETTINGS = {"sizes": list(SIZES), "input_size": 8, "width": 4, "hidden": 6, "classes": 3, "batch_size": 4,
            "lr": 1e-2, "rounds": 2}


class SmallDigitModel(nn.Module):
    """``DigitModel`` (nets/models.py:7-47) with 4 channels, 8 x 8 inputs, one hidden layer of 6."""

    def __init__(self):
        super().__init__()
        s = SETTINGS
        w = s["width"]
        self.conv1 = nn.Conv2d(3, w, 3, 1, 1)
        self.bn1 = nn.BatchNorm2d(w)
        self.conv2 = nn.Conv2d(w, w, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(w)
        self.fc1 = nn.Linear(w * (s["input_size"] // 4) ** 2, s["hidden"])
        self.bn4 = nn.BatchNorm1d(s["hidden"])
        self.fc3 = nn.Linear(s["hidden"], s["classes"])

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn4(self.fc1(x.view(x.shape[0], -1))))
        return self.fc3(x)


def build_model() -> nn.Module:
    model = SmallDigitModel()
    model.load_state_dict(seeded_weights({k: v.shape for k, v in model.state_dict().items()}, seed=0))
    return model


def client_data(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``i``'s images (n, 3, 8, 8), N(i / 2, 1) (a domain shift per client), and labels."""
    n, size = SIZES[i], SETTINGS["input_size"]
    x = seeded(f"client{i}/x", (n, 3, size, size), offset=0.5 * i)
    y = torch.randint(0, SETTINGS["classes"], (n,), generator=torch.Generator().manual_seed(200 + i))
    return x, y


def run(checkout: Path) -> dict[str, torch.Tensor]:
    s = SETTINGS
    data = [client_data(i) for i in range(len(SIZES))]
    server_model = build_model()
    tensors: dict[str, torch.Tensor] = {}
    for i, (x, y) in enumerate(data):
        tensors[f"client{i}/x"], tensors[f"client{i}/y"] = x, y
    tensors.update(weight_sums(server_model.state_dict()))
    loaders = [torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=s["batch_size"],
                                           shuffle=False) for x, y in data]
    with importable(checkout, checkout / "federated"), stub_modules(["torchvision"]):
        import fed_digits

        client_num = len(SIZES)
        fed_digits.client_num = client_num  # set in the script's __main__ block, read by communication()
        client_weights = [1 / client_num for _ in range(client_num)]  # fed_digits.py:247
        models = [copy.deepcopy(server_model) for _ in range(client_num)]
        args = types.SimpleNamespace(mode="fedbn")
        loss_fun = nn.CrossEntropyLoss()
        with contextlib.redirect_stdout(io.StringIO()):
            for r in range(s["rounds"]):
                optimizers = [torch.optim.SGD(params=models[i].parameters(), lr=s["lr"]) for i in range(client_num)]
                for i in range(client_num):
                    fed_digits.train(models[i], loaders[i], optimizers[i], loss_fun, client_num, "cpu")
                server_model, models = fed_digits.communication(args, server_model, models, client_weights)
                for i, model in enumerate(models):
                    for key, value in model.state_dict().items():
                        tensors[f"client{i}/r{r}/{key}"] = value.detach().clone()
                for key, value in server_model.state_dict().items():
                    if "bn" not in key:
                        tensors[f"server/r{r}/{key}"] = value.detach().clone()
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("fedbn", __doc__ or "", REPOSITORY, COMMIT, run, threads=1,
                    description="fed_digits.py train (line 87) and communication (line 164, mode fedbn) for 2 rounds "
                                "on 3 clients of unequal size: every client's state and the server's averaged entries "
                                "after each round",
                    settings=SETTINGS, argv=argv)


if __name__ == "__main__":
    main()
