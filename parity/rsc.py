"""Parity fixture for RSC's ``reference_code`` mode: the self-challenging forward of the authors' ResNet.

Runs, from a checkout of ``DeLightCMU/RSC`` at ``COMMIT`` (folder ``Domain_Generalization`` on
``sys.path``), ``ResNet.forward(x, gt, flag=True, epoch=0)`` (Domain_Generalization/models/resnet.py:59-154:
Grad-CAM scores, spatial or channel muting, the batch rule, the muted forward) and the cross-entropy of
its logits (Domain_Generalization/train.py:80-91), then one backward pass. The model is the authors'
``ResNet`` (resnet.py:13-54, 5 classes) with ``layer1``-``layer3`` replaced by identities and ``layer4`` by
one 3 x 3 convolution 64 -> 512 and a ReLU (``nn.Sequential``), so that 28 x 28 images give the 7 x 7 maps
of 512 channels its code requires (``AvgPool2d(7)``, resnet.py:26, and the 49 of resnet.py:111) at a
fraction of a full ResNet's cost; fedstyle's test makes the same replacement in its own ResNet. Weights:
:func:`parity.common.seeded_weights` (seed 0) under the authors' names, training mode, on
``images = seeded("images", (8, 3, 28, 28))`` and labels ``LABELS``; ``epoch=0`` sets the batch share to
0.3 (resnet.py:71-73). Run twice, from the same weights: with the spatial/channel draw
``random.randint(0, 9)`` (resnet.py:106) fixed to 2 (spatial) and to 7 (channel). The train script's
horizontally flipped copy of the batch (train.py:86-88) is data augmentation and is not added.

Stubs and patches while the authors' code runs (its files are not changed): ``torchvision.models.resnet``
(imported by resnet.py:3 for ``BasicBlock``, ``Bottleneck`` and ``model_urls``; the blocks it builds are
replaced as above and the URLs are never read) is a stub module; ``.cuda()`` returns the tensor itself
(:func:`parity.common.no_cuda`; resnet.py calls it on its masks, so it needs a GPU otherwise); the module's
``random`` is a stub whose ``randint`` returns the fixed choice; its ``Variable`` is wrapped to record the final
mask (resnet.py:149). Stored per mode: the mask (B, 1, 7, 7) or (B, 512, 1, 1), the logits, the loss, and the
gradients of every parameter (whole up to ``FULL_LIMIT`` elements, else sketched).

Run: ``.venv/bin/python -m parity.rsc --checkout /tmp/parity/RSC``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from parity.common import (TORCHVISION_RESNET_STUBS, FixedDraws, generate, gradient_record, importable, no_cuda,
                           patched, recorder, reduced_layer4, seeded, seeded_weights, stub_modules, weight_sums)

REPOSITORY = "DeLightCMU/RSC"
COMMIT = "bf6d280c5d74910f009ea8963c59167252659666"

BATCH, CLASSES, SIZE, WIDTH = 8, 5, 28, 512
LABELS = (0, 3, 1, 4, 2, 3, 1, 0)
EPOCH = 0
#: gradients with more elements are stored as a sketch (parity.common.gradient_record)
FULL_LIMIT = 4096
#: random.randint(0, 9) per mode; <= 4 is spatial (resnet.py:106-107)
CHOICE = {"spatial": 2, "channel": 7}
SETTINGS = {"batch": BATCH, "classes": CLASSES, "size": SIZE, "labels": list(LABELS), "epoch": EPOCH,
            "choice": CHOICE, "layer4": "conv3x3(64->512)+relu", "weight_seed": 0}


def model_input() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("images", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def run(checkout: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    with stub_modules(attrs=TORCHVISION_RESNET_STUBS), no_cuda(), importable(checkout / "Domain_Generalization"):
        from models import resnet as rsc

        model = rsc.ResNet(rsc.BasicBlock, [1, 1, 1, 1], classes=CLASSES)
        model.layer1 = model.layer2 = model.layer3 = nn.Identity()
        model.layer4 = reduced_layer4()
        state = seeded_weights({k: v.shape for k, v in model.state_dict().items()}, seed=0)
        tensors.update(weight_sums(state))
        for mode, choice in CHOICE.items():
            model.load_state_dict(state)
            model.train()
            draws = FixedDraws(randint=[choice])  # random.randint(0, 9), resnet.py:106
            variable = recorder(rsc.Variable, lambda result, t, *args, **kwargs: t.detach().clone())
            images, labels = model_input()
            model.zero_grad()
            with patched(rsc, random=draws, Variable=variable):
                logits = model(images, labels, True, EPOCH)
                loss = nn.CrossEntropyLoss()(logits, labels)
                loss.backward()
            assert draws.left("randint") == []
            mask = variable.values[-1]  # resnet.py:149, the mask after the batch rule
            assert mask.shape == ((BATCH, 1, 7, 7) if mode == "spatial" else (BATCH, WIDTH, 1, 1)), mask.shape
            assert abs(model.pecent - 0.3) < 1e-12
            tensors.update({f"{mode}/mask": mask, f"{mode}/logits": logits.detach(),
                            f"{mode}/loss": loss.detach().reshape(1)})
            tensors.update(gradient_record({k: p.grad for k, p in model.named_parameters()}, prefix=f"{mode}/grad/",
                                           full_limit=FULL_LIMIT))
            muted = (mask.reshape(BATCH, -1) == 0).any(1)
            print(f"{mode}: muted samples {muted.nonzero().flatten().tolist()}, "
                  f"muted entries per muted sample {(mask.reshape(BATCH, -1) == 0).sum(1).tolist()}")
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("rsc", __doc__, REPOSITORY, COMMIT, run, argv=argv, threads=1,
                    description="Domain_Generalization/models/resnet.py ResNet.forward(flag=True, epoch=0) with "
                                "layer1-3 replaced by identities and layer4 by conv3x3(64->512)+ReLU, spatial and "
                                "channel muting, cross-entropy and its gradients",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
