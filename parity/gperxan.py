"""Parity fixture for gPerXAN's ``reference_code`` mode: two rounds of the authors' ``Client.fit`` and ``FedAvg``.

``lhkhiem28/gPerXAN`` (pinned ``COMMIT``), source/: two clients, each the code's ``Client`` (main/client.py:11-55:
loads the downloaded arrays into the keys without "batchnorm", steps its cosine schedule, runs
``engines.client_fit_fn`` for one epoch: CE of the local ``fc`` plus 0.5 CE of a frozen copy of it, engines.py:4-26,
then returns its whole ``state_dict``), and the code's ``FedAvg`` strategy (strategies.py:13-51: Flower's FedAvg
over every returned array, loaded into the server model, whose arrays without "batchnorm" go back down), run as
server.py and client.py wire them, for two rounds.

Run here as the code runs, with three things swapped in: the model is fedstyle's BatchNorm ConvNet (16 x 16
inputs, 4 channels, 3 classes) with each BatchNorm2d replaced by the code's ``eXplicitOptimizedNorm2d``
(models/modules/normalization.py) and the head as ``fc`` beside a ``backbone`` attribute (engines.py:22 calls
``client_model.backbone``, which the torchvision ResNet-50 of client.py:85 lacks); ``client_fit_fn`` gets
``device=cpu`` (client.py:48 passes cuda); ``libs.py``'s packages that are not installed here or not used
(pytorch_lightning, cv2, albumentations, torchvision) are stubs. The optimiser is the code's SGD with weight decay
5e-4 but momentum 0 and lr 0.05 (client.py:96-99 has momentum 0.9 and lr 2e-3 in one optimiser kept across
rounds; fedstyle builds one per round, so momentum would differ from round 2 on) and the cosine schedule's
T_max is 4 rounds (client.py:23-26; stepped before each round: lr 0.05 (1 + cos(pi r / 4)) / 2, r = 1, 2).
Weights: :func:`parity.common.seeded_weights` on fedstyle's names (``fc`` is fedstyle's ``head``). Data: two
clients of 16 and 24 seeded uint8 images (batches of 8, unshuffled), through fedstyle's tiny transform.

Stored: the images and labels; per round the clients' learning rates, every step's loss (as ``backward`` is
called on it), each client's returned state and the server model after aggregation (the evaluation model);
the weight sums.

Run: ``.venv/bin/python -m parity.gperxan --checkout /tmp/parity/gPerXAN``.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from torch import nn

from parity.common import backward_calls, generate, importable, patched, seeded, seeded_weights, stub_modules
from parity.common import weight_sums

REPOSITORY = "lhkhiem28/gPerXAN"
COMMIT = "9eebbc1141e298d42e0133ab2ed94afadf8fda5a"
SIZES, BATCH = (16, 24), 8
CLIENTS = len(SIZES)
SETTINGS = {"input_size": 16, "channels": 4, "classes": 3, "sizes": list(SIZES), "batch": BATCH, "rounds": 2,
            "t_max": 4, "lr": 0.05, "momentum": 0.0, "weight_decay": 5e-4}
STUBS = ("pytorch_lightning", "cv2", "albumentations", "torchvision")


def fedstyle_model(algo=None) -> nn.Module:
    """fedstyle's classifier configured by ``algo`` (a gPerXAN; by default reference_code=true) with the seeded weights."""
    from fedstyle.algorithms import METHODS
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    model = Classifier(ConvNet(SETTINGS["input_size"], SETTINGS["channels"]), SETTINGS["classes"])
    if algo is None:
        algo = METHODS.get("gperxan")({"reference_code": True}, num_classes=SETTINGS["classes"], num_clients=CLIENTS)
    algo.configure_model(model)
    model.load_state_dict(seeded_weights({k: v.shape for k, v in model.state_dict().items()}))
    return model


class AuthorsNet(nn.Module):
    """``backbone`` then ``fc``: the attributes engines.py uses."""

    def __init__(self, backbone: nn.Module, fc: nn.Linear):
        super().__init__()
        self.backbone, self.fc = backbone, fc

    def forward(self, x):
        return self.fc(self.backbone(x))


def authors_model(norm_class) -> AuthorsNet:
    """The same network with the authors' norm layer in each block, the seeded weights loaded under their names."""
    from fedstyle.models.convnet import ConvNet

    backbone = ConvNet(SETTINGS["input_size"], SETTINGS["channels"])
    for name in backbone.stage_names:
        block = getattr(backbone, name)
        block[1] = norm_class(block[1].num_features)
    net = AuthorsNet(backbone, nn.Linear(backbone.feature_dim, SETTINGS["classes"]))
    theirs = {to_authors(k): v for k, v in fedstyle_model().state_dict().items()}
    net.load_state_dict(theirs)
    return net


def to_authors(key: str) -> str:
    return "fc." + key[5:] if key.startswith("head.") else key


def to_fedstyle(key: str) -> str:
    return "head." + key[3:] if key.startswith("fc.") else key


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for i, n in enumerate(SIZES):
        images = (seeded(f"images{i}", (n, 3, 16, 16)) * 60 + 128).clamp(0, 255).to(torch.uint8)
        out.append((images, (torch.arange(n) * (i + 1)) % SETTINGS["classes"]))
    return out


def transform(images: torch.Tensor) -> torch.Tensor:
    from fedstyle.data.transforms import BatchTransform

    return BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")(images, train=False)


def run(checkout: Path) -> dict[str, torch.Tensor]:
    import flwr
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    tensors = weight_sums(fedstyle_model().state_dict())
    loaders = []
    for i, (images, labels) in enumerate(data()):
        tensors.update({f"images{i}": images, f"labels{i}": labels})
        dataset = torch.utils.data.TensorDataset(transform(images), labels)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)
        loaders.append({"fit": loader, "evaluate": loader})
    with importable(checkout / "source"), stub_modules(STUBS), tempfile.TemporaryDirectory() as scratch:
        from main import client as client_module  # client.py: Client; it imports libs, strategies, engines
        from models.modules.normalization import eXplicitOptimizedNorm2d
        import strategies

        def fit_on_cpu(fit_loaders, num_epochs, model, optim, device=None, __real=client_module.client_fit_fn):
            return __real(fit_loaders, num_epochs, model, optim, device=torch.device("cpu"))

        clients = []
        for i in range(CLIENTS):
            model = authors_model(eXplicitOptimizedNorm2d)
            optim = torch.optim.SGD(model.parameters(), lr=SETTINGS["lr"], momentum=SETTINGS["momentum"],
                                    weight_decay=SETTINGS["weight_decay"])
            optim.num_rounds = SETTINGS["t_max"]
            clients.append(client_module.Client(loaders[i], 1, model, optim, scratch))
        server_model = authors_model(eXplicitOptimizedNorm2d)
        keys = list(server_model.state_dict())
        down = [v.numpy() for k, v in server_model.state_dict().items() if "batchnorm" not in k]  # server.py:32
        strategy = strategies.FedAvg(server_model=server_model, save_ckp_dir=scratch, min_available_clients=CLIENTS,
                                     min_fit_clients=CLIENTS, initial_parameters=ndarrays_to_parameters(down))
        for r in range(SETTINGS["rounds"]):
            results = []
            with patched(client_module, client_fit_fn=fit_on_cpu), backward_calls() as losses:
                for client in clients:
                    arrays, n, metrics = client.fit(copy.deepcopy(down), {})
                    results.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)))
            for i, (client, (_, res)) in enumerate(zip(clients, results)):
                tensors[f"round{r}/client{i}/lr"] = torch.tensor([client.client_optim.param_groups[0]["lr"]])
                arrays = flwr.common.parameters_to_ndarrays(res.parameters)
                tensors.update({f"round{r}/client{i}/{to_fedstyle(k)}": torch.from_numpy(a.copy())
                                for k, a in zip(keys, arrays)})
            tensors[f"round{r}/losses"] = torch.stack([loss.reshape(()) for loss in losses])
            parameters, _ = strategy.aggregate_fit(r + 1, results, [])
            tensors.update({f"round{r}/server/{to_fedstyle(k)}": v.detach().clone()
                            for k, v in strategy.server_model.state_dict().items()})
            down = flwr.common.parameters_to_ndarrays(parameters)
            tensors[f"round{r}/down_count"] = torch.tensor([len(down)])
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("gperxan", __doc__ or "", REPOSITORY, COMMIT, run, argv=argv, settings=SETTINGS, threads=1,
                    description="two rounds of main/client.py Client.fit on two clients and strategies.py FedAvg, "
                                "fedstyle's ConvNet with the code's eXplicitOptimizedNorm2d swapped in")


if __name__ == "__main__":
    main()
