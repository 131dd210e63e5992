"""Parity fixture for MOON: the authors' local training step (QinbinLi/MOON, MIT) — the model-contrastive
loss against a frozen global and previous model, the step's loss and gradients.

Runs, from a checkout of the authors' repository (its root on the path, ``main.py`` imported):

- ``ModelFedCon`` (model.py:536-587): features -> ``l1`` -> ReLU -> ``l2`` (the projection z) -> ``l3`` (the
  classifier on z); ``forward`` returns (h, z, logits);
- ``train_net_fedcon`` (main.py:246-340) for one epoch over a one-batch loader: the local net in training
  mode, ``global_net(x)`` and each ``previous_net(x)``, logits [cos(z, z_glob), cos(z, z_prev)...] / tau with
  target 0 (main.py:294-311), ``loss = CE(out, y) + mu * CE(logits, 0)``, ``loss.backward()`` and the SGD step
  (lr = 0 and ``args.reg`` = 0: the weights stay as they were and ``.grad`` holds the step's gradients).
  The global and previous nets are frozen in eval mode as ``main.py`` leaves them (main.py:86-97).

Two runs: one previous model (the public code's default ``model_buffer_size`` 1: loss, its two terms and every
gradient stored) and two previous models (the pool of 2: the contrastive term only).

The features: ``ModelFedCon('simple-cnn', ...)`` is built as the authors' code builds it, then its
``features`` module (their LeNet-style ``SimpleCNN_header``, 84 outputs) is replaced by fedstyle's Digits-DG
ConvNet (32 x 32 inputs, 21 channels, BatchNorm: 84 flattened features), so the backbone is the same module
on both sides and everything the method adds — projection head, classifier on z, the frozen models' modes,
the contrastive logits, loss and step — is the authors' code. Weights, keyed by the authors' names
(``features.*``, ``l1.*``, ``l2.*``, ``l3.*``), from :func:`parity.common.seeded_weights`: seed 0 for the
local net, 1 for the global net, 2 and 3 for the previous nets. There are no random draws. Inputs:
``seeded("x", (8, 3, 32, 32))`` (rebuilt by the test, not stored), labels ``arange(8) % 4``.

CPU: ``train_net_fedcon`` moves everything with ``.cuda()``; while it runs, ``torch.Tensor.cuda`` and
``nn.Module.cuda`` return their object unchanged (``nn.DataParallel`` runs its module directly without GPUs).
Import stubs: torchvision (model.py:5, utils.py:5, datasets.py:4-5; only its datasets and transforms are
named, never used by the step) is an empty stub module while ``main.py`` imports.

Run: ``.venv/bin/python -m parity.moon --checkout /tmp/parity/MOON``.
"""

from __future__ import annotations

import contextlib
import logging
import types
from pathlib import Path

import torch
from torch import nn

from parity.common import (backward_calls, generator_name, gradient_record, importable, no_cuda, parse_args,
                           recording, require_checkout, seeded, seeded_weights, stub_modules, weight_sums,
                           write_fixture)

REPOSITORY = "QinbinLi/MOON"
COMMIT = "8fcba3c4efc9a47eb24687a91ba94cfb2005103f"

SETTINGS = {"input_size": 32, "channels": 21, "out_dim": 16, "classes": 4, "batch": 8, "mu": 5.0,
            "temperature": 0.5, "seeds": {"local": 0, "global": 1, "previous": 2, "previous2": 3}}

#: the authors' parameter names -> fedstyle's (Classifier with MOON's ProjectionNeck)
RENAME = (("features.", "backbone."), ("l1.", "neck.proj.0."), ("l2.", "neck.proj.2."), ("l3.", "head."))


def fedstyle_name(name: str) -> str:
    for old, new in RENAME:
        if name.startswith(old):
            return new + name[len(old):]
    raise KeyError(name)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    b, size = SETTINGS["batch"], SETTINGS["input_size"]
    return seeded("x", (b, 3, size, size)), torch.arange(b) % SETTINGS["classes"]


def backbone() -> nn.Module:
    from fedstyle.models.convnet import ConvNet

    return ConvNet(SETTINGS["input_size"], SETTINGS["channels"])


@contextlib.contextmanager
def authors_code(checkout: Path):
    """The checkout importable on the CPU (:func:`parity.common.no_cuda`), torchvision a stub package, the
    logging level restored after."""
    level = logging.getLogger().level
    try:
        with stub_modules(["torchvision"]), no_cuda(), importable(checkout):
            yield
    finally:
        logging.getLogger().setLevel(level)


@contextlib.contextmanager
def recorded():
    """Records the tensors ``.backward()`` is called on and every cross-entropy computed with gradients."""
    def cross_entropy(out, module, input, target):
        return torch.is_grad_enabled(), input.detach().clone(), out.detach().clone()

    with backward_calls() as backward, recording(nn.CrossEntropyLoss, "forward", cross_entropy) as calls:
        seen = {"backward": backward, "ce": []}
        yield seen
    seen["ce"] = [(input, out) for with_grad, input, out in calls if with_grad]


def main(argv: list[str] | None = None) -> Path:
    args = parse_args("moon", (__doc__ or "").split("\n")[0], REPOSITORY, COMMIT, argv)
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    s = SETTINGS
    x, y = batch()
    tensors = {"y": y}
    with authors_code(args.checkout):
        import main as moon

        logging.getLogger().setLevel(logging.WARNING)  # utils.py sets INFO at import; restored after
        def net(role: str) -> nn.Module:
            model = moon.ModelFedCon("simple-cnn", s["out_dim"], s["classes"])
            model.features = backbone()
            state = seeded_weights({k: v.shape for k, v in model.state_dict().items()}, seed=s["seeds"][role])
            model.load_state_dict(state)
            tensors.update(weight_sums(state, prefix=f"weight_sum/{role}/"))
            if role != "local":  # frozen as main.py leaves the global model and the pool (main.py:86-97, 147-151)
                model.eval()
                for p in model.parameters():
                    p.requires_grad = False
            return model

        frozen = {role: net(role) for role in ("global", "previous", "previous2")}
        for run, previous in (("k1", ["previous"]), ("k2", ["previous", "previous2"])):
            local = net("local")
            before = {k: v.clone() for k, v in local.state_dict().items()}
            with recorded() as seen:
                moon.train_net_fedcon(0, local, frozen["global"], [frozen[p] for p in previous], [(x, y)], [(x, y)],
                                      1, 0.0, "sgd", s["mu"], s["temperature"], types.SimpleNamespace(reg=0.0),
                                      1, device="cpu")
            assert len(seen["backward"]) == 1 and len(seen["ce"]) == 2
            (logits, con), (_, ce) = seen["ce"]  # main.py:311 (mu * CE(logits, 0)) then :314 (CE(out, y))
            tensors[f"{run}/logits"] = logits
            tensors[f"{run}/con"] = con.reshape(1)
            tensors[f"{run}/ce"] = ce.reshape(1)
            tensors[f"{run}/loss"] = seen["backward"][0].reshape(1)
            for key, value in local.state_dict().items():  # lr = 0: the step moved no weight
                if "running" not in key and "num_batches" not in key:
                    assert torch.equal(value, before[key]), key
            if run == "k1":
                tensors.update(gradient_record({fedstyle_name(k): p.grad for k, p in local.named_parameters()}))
    return write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name("moon"),
                         description="MOON train_net_fedcon (main.py:246) for one batch on ModelFedCon "
                                     "(model.py:536) with one and with two previous models",
                         settings=SETTINGS)


if __name__ == "__main__":
    main()
