"""Parity fixture for FedCCRL's ``reference_code`` mode: the authors' statistics, pool and two local steps.

``SanphouWang/FedCCRL`` (pinned ``COMMIT``), algorithm/client/fedccrl.py, run unchanged: ``compute_statistic``
(:20-44) on three clients (upload ratio ``r`` 0.25: the first 4 of 16 images), ``download_statistic_pool`` (:46-53)
for client 0 (the other clients' rows), then ``train`` (:65-128) for one epoch of two batches of 8: per batch the
clean forward, two views ``sample_statistic`` (:55-63) -> the code's ``MixStyle`` (model/models.py:259-282) ->
``AugMixAugmentation`` (:154-165), CE on all three, the supervised contrastive loss of each view against the clean
features (:130-146) and the Jensen-Shannon term (:92-100).

Stand-ins, for what does not import here or is not compared: ``torchvision`` is a stub whose ``AugMix`` returns its
uint8 batch unchanged (the 8-bit round trip around it, :157-164, still runs: denormalise with ImageNet's statistics,
x 255, cast to uint8, / 255, normalise) and whose ``Normalize`` is (x - mean) / std; ``pynvml``, ``matplotlib``
are stubs; ``move2new_device`` is a no-op (CPU). The client is made without its constructor (no dataset, no
torchvision model): its ``MixStyle`` is the code's, built as the constructor builds it (:18), its model a wrapper of
fedstyle's (``base`` = the representation, ``classifier`` = the head) on a ConvNet with BatchNorm (16 x 16 inputs,
4 channels, 3 classes), its loader the two batches in order, its optimiser plain SGD (lr 0.05) that records each
step's gradients, its scheduler and logger no-ops. Draws recorded: ``torch.randperm`` (the pool rows) and the
``Beta(0.1, 0.1)`` lambdas; Python's ``random.random`` fires MixStyle always (p = 1). The images are uint8 in
[90, 165] and the pool is made of the same kind, so the restyled pixels stay inside [0, 255] (the code's uint8 cast
of a float outside that range is undefined: the generator checks it is not exercised).

Stored: the images and labels, each client's statistics, client 0's pool, per step the drawn rows and lambdas, each
view's restyled pixels as the code cast them to uint8, the loss ``backward`` was called on and every gradient; the
weight sums.

Run: ``.venv/bin/python -m parity.fedccrl --checkout /tmp/parity/FedCCRL``.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path

import torch
from torch import nn

from parity.common import (backward_calls, detached, generate, importable, patched, recording, seeded, seeded_weights,
                           stub_modules, weight_sums)

REPOSITORY = "SanphouWang/FedCCRL"
COMMIT = "60b2d9b4531ce79a039c0e69696a438f5803913f"
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # the code's AugMixAugmentation hard-codes them
ARGS = {"r": 0.25, "p": 1.0, "epsilon": 1e-6, "lambda1": 0.1, "lambda2": 0.1, "t": 0.1, "num_epochs": 1,
        "batch_size": 8}
SETTINGS = {"input_size": 16, "channels": 4, "classes": 3, "clients": 3, "images": 16, "lr": 0.05, "args": ARGS}


def build_model() -> nn.Module:
    """fedstyle's ConvNet classifier (with BatchNorm) and the seeded weights."""
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    model = Classifier(ConvNet(SETTINGS["input_size"], SETTINGS["channels"], batch_norm=True), SETTINGS["classes"])
    model.load_state_dict(seeded_weights({k: v.shape for k, v in model.state_dict().items()}))
    return model


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per client, 16 uint8 images in [90, 165] (a brightness per image and noise) and labels 0..2."""
    out = []
    n, size = SETTINGS["images"], SETTINGS["input_size"]
    for i in range(SETTINGS["clients"]):
        level = 128 + 15 * seeded(f"level{i}", (n, 3, 1, 1))
        images = (level + 10 * seeded(f"noise{i}", (n, 3, size, size))).clamp(90, 165).round().to(torch.uint8)
        out.append((images, (torch.arange(n) + i) % SETTINGS["classes"]))
    return out


def transform():
    from fedstyle.data.transforms import BatchTransform

    return BatchTransform(*IMAGENET, "none")


class _Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.as_tensor(mean).view(-1, 1, 1), torch.as_tensor(std).view(-1, 1, 1)

    def __call__(self, x):
        return (x - self.mean) / self.std


class _AugMixUnchanged:
    """torchvision's AugMix stand-in: the uint8 batch as it came (the 8-bit round trip around it still runs)."""

    casts: list = []

    def __call__(self, images):
        assert images.dtype == torch.uint8
        return images


class _Wrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.classifier = model.head

    def base(self, x):
        return self.model.features(x)


class _RecordingSGD:
    def __init__(self, model, lr, grads):
        self.params, self.lr, self.grads = list(model.named_parameters()), lr, grads

    def zero_grad(self):
        for _, p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.grads.append({name: p.grad.detach().clone() for name, p in self.params})
        for _, p in self.params:
            p -= self.lr * p.grad


def run(checkout: Path) -> dict[str, torch.Tensor]:
    tensors, loaders = {}, []
    normalize = transform()
    for i, (images, labels) in enumerate(data()):
        tensors.update({f"images{i}": images, f"labels{i}": labels})
        batches = [(normalize(images[s:s + 8], train=False), labels[s:s + 8]) for s in (0, 8)]
        loaders.append(types.SimpleNamespace(dataset=range(len(images)), batches=batches))
    model = build_model()
    tensors.update(weight_sums(model.state_dict()))
    vision = {"torchvision": {}, "torchvision.transforms": {"AugMix": _AugMixUnchanged, "Normalize": _Normalize},
              "torchvision.models": {}}
    with importable(checkout), stub_modules(["pynvml", "matplotlib"], vision):
        from algorithm.client.fedccrl import FedCCRLClient
        from model.models import MixStyle

        args = types.SimpleNamespace(**ARGS)
        clients = []
        for i, loader in enumerate(loaders):
            client = FedCCRLClient.__new__(FedCCRLClient)
            loader_iter = type("Loader", (), {"__iter__": lambda self, b=loader.batches: iter(b),
                                              "__len__": lambda self, b=loader.batches: len(b)})()
            loader_iter.dataset = loader.dataset
            client.args, client.client_id, client.train_loader = args, i, loader_iter
            client.device = torch.device("cpu")
            client.MixStyle = MixStyle(args.p, 0.1, args.epsilon)
            clients.append(client)
        with patched(FedCCRLClient, move2new_device=lambda self: None):
            pool = {"mean": [], "std": []}
            for i, client in enumerate(clients):
                stats = client.compute_statistic()
                pool["mean"].append(stats["mean"])
                pool["std"].append(stats["std"])
                tensors[f"stats{i}/mu"], tensors[f"stats{i}/sigma"] = stats["mean"].flatten(1), stats["std"].flatten(1)
            learner = clients[0]
            learner.download_statistic_pool(copy.deepcopy(pool))
            tensors["pool/mu"] = learner.statistic_pool["mean"].flatten(1).clone()
            tensors["pool/sigma"] = learner.statistic_pool["std"].flatten(1).clone()
            grads = []
            learner.classification_model = _Wrapper(model)
            learner.optimizer = _RecordingSGD(model, SETTINGS["lr"], grads)
            learner.scheduler = types.SimpleNamespace(step=lambda: None)
            learner.logger = types.SimpleNamespace(log=lambda *a, **k: None)
            casts = []

            def checked_uint8(tensor, *a, __real=torch.Tensor.to, **k):
                out = __real(tensor, *a, **k)
                if a and a[0] is torch.uint8:  # the code's cast of the restyled pixels: inside [0, 255]
                    casts.append((float(tensor.min()) >= 0 and float(tensor.max()) < 256, out.clone()))
                return out

            with recording(torch, "randperm", detached) as rows, \
                    recording(learner.MixStyle.beta, "sample", detached) as lambdas, \
                    patched(torch.Tensor, to=checked_uint8), backward_calls() as losses:
                learner.train()
            assert casts and all(ok for ok, _ in casts), "a restyled pixel left [0, 255]: the code's cast is undefined"
    for step in range(2):
        tensors[f"step{step}/loss"] = losses[step].reshape(())
        for view in range(2):
            tensors[f"step{step}/view{view}/rows"] = rows[2 * step + view]
            tensors[f"step{step}/view{view}/lambda"] = lambdas[2 * step + view].flatten()
            tensors[f"step{step}/view{view}/uint8"] = casts[2 * step + view][1]
        tensors.update({f"step{step}/grad/{k}": g for k, g in grads[step].items()})
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("fedccrl", __doc__ or "", REPOSITORY, COMMIT, run, argv=argv, settings=SETTINGS, threads=1,
                    description="algorithm/client/fedccrl.py compute_statistic on 3 clients, download_statistic_pool "
                                "and train (two steps) of client 0, fedstyle's ConvNet swapped in, AugMix unchanged")


if __name__ == "__main__":
    main()
