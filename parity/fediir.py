"""Parity fixture for FedIIR's ``reference_code`` mode: two rounds of the authors' ``FedIIR.update``.

``YamingGuo98/FedIIR`` (pinned ``COMMIT``), domainbed/algorithms.py: ``FedIIR.update`` (:185-221) computes the
mean classifier gradient of the global model over every batch of the sampled clients (``mean_grad`` :164-182,
into the moving average ``grad_mean`` with ``ema``), trains each client from the global model with SGD
(momentum 0.9, :94-99) on CE + ``penalty`` ||grad_classifier CE - grad_mean||^2 (create_graph, :203-212) and
averages the clients' states equally (:101-123). Called as main.py:230 calls it, ``update(sampled_clients,
local_epochs)``, with ``sampled_clients`` a list of (index, batches) and 1 local epoch, twice.

The networks are fedstyle's (the same modules on both sides): the featurizer is a ConvNet without BatchNorm
(16 x 16 inputs, 4 channels; train and eval modes then agree), the classifier ``Sequential(Linear(16, 8), ReLU,
Linear(8, 3))`` made of fedstyle's ``neck.hidden`` and ``head``; they replace the ``featurizer`` and
``classifier`` the constructor built (an ``MNIST_CNN``; ``torchvision``, imported at the top of networks.py and
unused here, is a stub), and ``grad_mean`` is reset to zeros of the new classifier's shapes (its constructor's
init, :162). Weights: :func:`parity.common.seeded_weights` on fedstyle's names. Data: three clients of 2, 1 and
3 batches of 8 seeded uint8 images (3 classes; unequal, so the code's pooling of batches weighs them 2:1:3),
through fedstyle's tiny transform (eval: normalisation only). hparams: lr 0.01, weight decay 0, penalty 0.05,
ema 0.95. No random draws.

Stored: the images and labels, after each round the moving average, the 6 step losses (CE + penalty term, as
``backward`` is called on them), each client's trained state and the averaged global state; the weight sums.

Run: ``.venv/bin/python -m parity.fediir --checkout /tmp/parity/FedIIR``.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path

import torch
from torch import nn

from parity.common import backward_calls, generate, importable, patched, seeded, seeded_weights, stub_modules
from parity.common import weight_sums

REPOSITORY = "YamingGuo98/FedIIR"
COMMIT = "3e7a785e30002ac75d9b3575e3e9062d8e22ea42"
BATCHES, BATCH = (2, 1, 3), 8  # batches per client (unequal: the code weighs a client by its batches)
CLIENTS = len(BATCHES)
HPARAMS = {"lr": 0.01, "weight_decay": 0.0, "penalty": 0.05, "ema": 0.95, "nonlinear_classifier": True}
SETTINGS = {"input_size": 16, "channels": 4, "classes": 3, "hidden": 8, "clients": CLIENTS, "batches": list(BATCHES),
            "batch": BATCH, "rounds": 2, "hparams": HPARAMS}


def build_model(algo=None) -> nn.Module:
    """fedstyle's model with FedIIR's two-layer classifier (``hidden`` units), BatchNorm-free ConvNet, configured by
    ``algo`` (a fedstyle FedIIR; by default one with ``hidden`` set), then given the seeded weights."""
    from fedstyle.algorithms import METHODS
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    model = Classifier(ConvNet(SETTINGS["input_size"], SETTINGS["channels"], batch_norm=False), SETTINGS["classes"])
    if algo is None:
        algo = METHODS.get("fediir")({"hidden": SETTINGS["hidden"]}, num_classes=SETTINGS["classes"],
                                     num_clients=CLIENTS)
    algo.configure_model(model)
    model.load_state_dict(seeded_weights({k: v.shape for k, v in model.state_dict().items()}))
    return model


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per client, (batches * batch, 3, 16, 16) uint8 images and their labels 0..2."""
    out = []
    for i, batches in enumerate(BATCHES):
        n = batches * BATCH
        images = (seeded(f"images{i}", (n, 3, 16, 16)) * 60 + 128).clamp(0, 255).to(torch.uint8)
        out.append((images, (torch.arange(n) + i) % SETTINGS["classes"]))
    return out


def transform(images: torch.Tensor) -> torch.Tensor:
    from fedstyle.data.transforms import BatchTransform

    return BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")(images, train=False)


#: the authors' classifier Sequential's names -> fedstyle's
CLASSIFIER_NAMES = {"0.weight": "neck.hidden.weight", "0.bias": "neck.hidden.bias", "2.weight": "head.weight",
                    "2.bias": "head.bias"}


def fedstyle_state(featurizer_state, classifier_state) -> dict[str, torch.Tensor]:
    out = {f"backbone.{k}": v.detach().clone() for k, v in featurizer_state.items()}
    out.update({CLASSIFIER_NAMES[k]: v.detach().clone() for k, v in classifier_state.items()})
    return out


def run(checkout: Path) -> dict[str, torch.Tensor]:
    clients, tensors = [], {}
    for i, (images, labels) in enumerate(data()):
        clients.append((i, [(transform(images[b * BATCH:(b + 1) * BATCH]), labels[b * BATCH:(b + 1) * BATCH])
                            for b in range(BATCHES[i])]))
        tensors.update({f"images{i}": images, f"labels{i}": labels})
    model = build_model()
    tensors.update(weight_sums(model.state_dict()))
    with importable(checkout), stub_modules(["torchvision"]):
        from domainbed import algorithms

        args = types.SimpleNamespace(device=torch.device("cpu"))
        algo = algorithms.FedIIR((3, 28, 28), SETTINGS["classes"], CLIENTS, dict(HPARAMS), args)
        algo.featurizer = copy.deepcopy(model.backbone)
        algo.classifier = nn.Sequential(copy.deepcopy(model.neck.hidden), nn.ReLU(), copy.deepcopy(model.head))
        algo.grad_mean = tuple(torch.zeros_like(p) for p in algo.classifier.parameters())
        for r in range(SETTINGS["rounds"]):
            trained = []

            def keep(model_client, __real=algo.aggregation_client):
                trained.extend(copy.deepcopy(model_client))
                return __real(model_client)

            with patched(algo, aggregation_client=keep), backward_calls() as losses:
                algo.update(clients, 1)
            for key, g in zip(CLASSIFIER_NAMES.values(), algo.grad_mean):
                tensors[f"round{r}/ema/{key}"] = g.detach().clone()
            tensors[f"round{r}/losses"] = torch.stack([loss.reshape(()) for loss in losses])
            for i, (featurizer_state, classifier_state) in enumerate(trained):
                tensors.update({f"round{r}/client{i}/{k}": v for k, v in
                                fedstyle_state(featurizer_state, classifier_state).items()})
            tensors.update({f"round{r}/global/{k}": v for k, v in
                            fedstyle_state(algo.featurizer.state_dict(), algo.classifier.state_dict()).items()})
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("fediir", __doc__ or "", REPOSITORY, COMMIT, run, argv=argv, settings=SETTINGS, threads=1,
                    description="two rounds of domainbed/algorithms.py FedIIR.update (:185) on three clients of two "
                                "batches, fedstyle's featurizer and two-layer classifier swapped in")


if __name__ == "__main__":
    main()
