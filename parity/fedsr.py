"""Parity fixture for FedSR: the authors' model (atuannguyen/FedSR) — its Monte-Carlo prediction and one
local training step (representation sample, L2R, CMI, total loss and gradients).

Runs, from a checkout of the authors' repository (``src/`` on the path):

- ``methods.FedSR.Model`` (src/methods/FedSR.py:15-22) built on ``methods.base.Base`` (src/methods/base.py:13-50),
  with ``back_bone='resnet18'``, ``z_dim`` 8, 4 classes, ``num_samples`` 20, SGD;
- ``Model.forward`` in eval mode (src/methods/base.py:80-91, ``featurize`` :65-78): the softmax averaged over
  20 samples of z, returned as its log;
- ``Model.train_client(loader, steps=1)`` (src/methods/FedSR.py:24-73): CE on one sample z, L2R = mean ||z||
  (:43), CMI with the learnable scale C (:45-54), ``obj.backward()`` and the SGD step. lr = 0 and weight
  decay 0, so the step leaves the weights as they were and ``.grad`` holds the step's gradients.

The backbone: ``torchvision.models.resnet18(pretrained=True)`` (src/methods/base.py:22) is replaced by a
stub (torchvision does not import here) that returns fedstyle's Digits-DG ConvNet (32 x 32 inputs,
16 channels, BatchNorm: 64 flattened features) followed by the ``fc`` layer the authors' code replaces
with its own ``Linear(features, 2 z_dim)`` (:23) — so the compared pieces are all the authors': the
Gaussian head, sampling, classifier, regularisers, loss and prediction rule; the backbone is the same
module on both sides. The model's weights, keyed by the authors' names (``net.backbone.*``, ``net.fc.*``,
``cls.*``, ``r_mu``, ``r_sigma``, ``C``), come from :func:`parity.common.seeded_weights` (seed 0), except
C = ``C_VALUE`` (a seeded scalar near 0 would make log(C sigma) meaningless).

Draws: torch's ``Normal.rsample`` draws eps through ``torch.distributions.normal._standard_normal``; the
generator replaces that function while the authors' code runs. For the prediction it returns
``torch.randn((20, B, z_dim), generator=torch.Generator().manual_seed(0))`` — exactly the draw fedstyle's
``GaussianNeck`` makes with ``mc_seed=0`` — and for the training step ``seeded("eps/train", (1, B, z_dim))``;
both are stored (``eps/predict``, ``eps/train``). The input batch is ``seeded("x", (8, 3, 32, 32))`` (rebuilt by
the test, not stored) and labels ``arange(8) % 4``.

Stored: the prediction's log-probabilities, mu and sigma of the batch, the sampled z, CE, L2R, CMI, the total
loss (the tensor ``obj.backward()`` was called on), every parameter's gradient, the weight sums.

Run: ``.venv/bin/python -m parity.fedsr --checkout /tmp/parity/FedSR``.
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path

import torch
from torch import nn

from parity.common import (backward_calls, generator_name, gradient_record, importable, parse_args, patched,
                           require_checkout, seeded, seeded_weights, stub_modules, weight_sums, write_fixture)

REPOSITORY = "atuannguyen/FedSR"
COMMIT = "ba8d894a90fab9da3d62cce570bc8fe17a312a2d"

SETTINGS = {"input_size": 32, "channels": 16, "z_dim": 8, "classes": 4, "batch": 8, "num_samples": 20,
            "L2R_coeff": 0.1, "CMI_coeff": 0.05, "C": 1.15, "weights_seed": 0, "mc_seed": 0}
C_VALUE = SETTINGS["C"]

#: the authors' parameter names -> fedstyle's (Classifier with FedSR's GaussianNeck)
RENAME = (("net.backbone.", "backbone."), ("net.fc.", "neck.fc."), ("cls.", "head."),
          ("r_mu", "neck.ref_mu"), ("r_sigma", "neck.ref_rho"), ("C", "neck.ref_scale"))


def fedstyle_name(name: str) -> str:
    for old, new in RENAME:
        if name == old or (old.endswith(".") and name.startswith(old)):
            return new + name[len(old):] if old.endswith(".") else new
    raise KeyError(name)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    b, size = SETTINGS["batch"], SETTINGS["input_size"]
    return seeded("x", (b, 3, size, size)), torch.arange(b) % SETTINGS["classes"]


def backbone() -> nn.Module:
    from fedstyle.models.convnet import ConvNet

    return ConvNet(SETTINGS["input_size"], SETTINGS["channels"])


class _ResNetStandIn(nn.Module):
    """What the stubbed ``torchvision.models.resnet18`` returns: a backbone, then ``fc`` (replaced by the caller)."""

    def __init__(self):
        super().__init__()
        self.backbone = backbone()
        self.fc = nn.Linear(self.backbone.feature_dim, 1000)

    def forward(self, x):
        return self.fc(self.backbone(x))


@contextlib.contextmanager
def authors_code(checkout: Path):
    """The authors' ``src`` importable, with ``torchvision`` and ``torchvision.models`` stub modules whose
    ``resnet18`` returns the stand-in."""
    stand_in = {"resnet18": lambda pretrained=False, **kwargs: _ResNetStandIn()}
    with stub_modules(attrs={"torchvision": {}, "torchvision.models": stand_in}), importable(checkout / "src"):
        yield


@contextlib.contextmanager
def draws(make):
    """``Normal.rsample``'s eps from ``make(shape)`` (recorded in the returned list) while the block runs."""
    import torch.distributions.normal as normal

    seen = []

    def standard_normal(shape, dtype, device):
        eps = make(tuple(shape)).to(dtype=dtype, device=device)
        seen.append(eps.clone())
        return eps

    with patched(normal, _standard_normal=standard_normal):
        yield seen


def main(argv: list[str] | None = None) -> Path:
    args = parse_args("fedsr", (__doc__ or "").split("\n")[0], REPOSITORY, COMMIT, argv)
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    s = SETTINGS
    torch.manual_seed(0)
    with authors_code(args.checkout):
        from methods.FedSR import Model

        options = types.SimpleNamespace(
            z_dim=s["z_dim"], num_classes=s["classes"], back_bone="resnet18", device="cpu", optim="SGD", lr=0.0,
            weight_decay=0.0, L2R_coeff=s["L2R_coeff"], CMI_coeff=s["CMI_coeff"], num_samples=s["num_samples"])
        model = Model(options)
        named = dict(model.named_parameters()) | dict(model.named_buffers())
        state = seeded_weights({k: v.shape for k, v in named.items()}, seed=s["weights_seed"])
        state["C"] = torch.tensor(C_VALUE)
        with torch.no_grad():
            for name, tensor in named.items():
                tensor.copy_(state[name])
        x, y = batch()

        # Monte-Carlo prediction (eval mode: BatchNorm's running statistics), with fedstyle's mc_seed draw
        model.eval()
        mc = torch.Generator().manual_seed(s["mc_seed"])
        with torch.no_grad(), draws(lambda shape: torch.randn(shape, generator=mc)) as eps_predict:
            log_probs = model(x)
        # mu, sigma of the batch in training mode (batch statistics), as the step sees them
        model.train()
        with torch.no_grad(), draws(lambda shape: torch.zeros(shape)):
            _, (mu, sigma) = model.featurize(x, return_dist=True)
        # one training step; lr = 0 leaves the weights and .grad holds the gradients
        model.train()
        seen_z = []
        hook = model.cls.register_forward_hook(lambda module, inputs, output: seen_z.append(inputs[0].detach().clone()))
        with draws(lambda shape: seeded("eps/train", shape)) as eps_train, backward_calls() as losses:
            stats = model.train_client([(x, y)], steps=1)
        hook.remove()
    assert len(eps_predict) == 1 and len(eps_train) == 1 and len(losses) == 1
    for name, tensor in named.items():  # lr = 0: the step moved nothing
        if tensor.is_floating_point() and "running" not in name:
            assert torch.equal(tensor.detach(), state[name]), name
    grads = {fedstyle_name(k): p.grad for k, p in model.named_parameters()}
    assert len(seen_z) == 1
    z = seen_z[0]  # the classifier's input in the step: the sampled representation
    tensors = {"y": y, "predict/log_probs": log_probs, "eps/predict": eps_predict[0], "eps/train": eps_train[0],
               "train/mu": mu, "train/sigma": sigma, "train/z": z, "loss/total": losses[0].reshape(1),
               "loss/ce": torch.as_tensor(stats["loss"]).reshape(1).float(),
               "loss/l2r": torch.as_tensor(stats["regL2R"]).reshape(1).float(),
               "loss/cmi": torch.as_tensor(stats["regCMI"]).reshape(1).float()}
    tensors.update(gradient_record(grads))
    tensors.update(weight_sums(state))
    return write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name("fedsr"),
                         description="FedSR Model (src/methods/FedSR.py, src/methods/base.py): Monte-Carlo "
                                     "prediction and one train_client step on seeded weights",
                         settings=SETTINGS)


if __name__ == "__main__":
    main()
