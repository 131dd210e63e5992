"""Parity fixture for ``fedadg``: one adversarial local step of FedADG's public code.

The authors' repository (github.com/wzml/FedADG) cannot be fetched here; its mirror Haoxiang-Wang/FedADG
(pinned below) is what was run. From a checkout at ``COMMIT`` it runs ``localTrain.train_step``
(``pacs-ours/localTrain.py:65-108``, the PACS code fedstyle follows) once, on one batch of 8 ``seeded`` 16 x 16
images with labels 0-6, with

* F = fedstyle's ConvNet body (``build_model("convnet", 7, 16)``: backbone + neck, 64-d features) and C = its
  linear head, in place of their AlexNet and two-layer MLP (``pacs-ours/Nets.py:33``, ``:83``);
* their distribution generator ``GeneDistrNet(input_size=32, hidden_size=64)`` (``pacs-ours/Nets.py:7``; 7
  labels and 4,096 hidden units are fixed there) and discriminator ``Discriminator(64, 7, rp_size=32)``
  (``pacs-ours/Nets.py:109``);
* every weight from ``seeded_weights`` (keyed ``backbone.*``/``head.*`` as fedstyle names them,
  ``generator.*`` and ``discriminator.*`` plus the authors' names), the fixture keeping their sums;
* their optimisers as ``localTrain.__init__`` and ``train.py:59-71`` make them (SGD, momentum 0.9, weight decay
  1e-5, lr0 0.01 for F and C, lr1 0.007 for G and D), including the warm-up scheduler's first step, which sets
  the learning rates to (lr - 1e-7) / ite_warmup + 1e-7 before the first batch; ``--ite-warmup 1`` here, so the
  step runs at lr0 and lr1 and D's update visibly moves the F and G steps after it (the README's commands use
  100 and 500: a round's first step at lr / 100); the rates are recorded and the test uses them;
* ``LabelSmoothingLoss(0.2, 7)`` (``utils/utilss.py:6-21``; 0.2 = the VLCS command's value).

The one random draw, the generator's noise ``torch.rand(8, 32)`` (``localTrain.py:70``), comes from torch's
global generator seeded with 0 and is stored. Recorded: the four losses (CE, L_advd, L_advf, L_advg) and the
gradients each of the three optimiser steps applies (D, then F and C, then G), read when each step is taken.

Stubs: ``torchvision`` (imported by ``models/test.py`` for ``transforms``, which ``test1`` does not need).
Nothing needs installing besides the project's environment.

Run: ``.venv/bin/python -m parity.fedadg --checkout /tmp/parity/FedADG``.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import torch
from torch import nn

from parity.common import (detached, generate, gradient_record, importable, patched, recorder, seeded, seeded_weights,
                           stub_modules, weight_sums)

REPOSITORY = "Haoxiang-Wang/FedADG"
COMMIT = "1d34f2ad5b3299ccbdab0f804756d3f0a747f793"
NAME = "fedadg"

NUM_CLASSES, SIZE, BATCH = 7, 16, 8
NOISE, RP, WIDTH = 32, 32, 64
LR0, LR1, MOMENTUM, WEIGHT_DECAY = 0.01, 0.007, 0.9, 1e-5
LABEL_SMOOTHING = 0.2
ALPHA = 0.85  # train_step's weight of the classification loss (localTrain.py:66)
#: --ite-warmup: the scheduler's first step sets lr = (lr - 1e-7) / WARMUP + 1e-7 (1: the base rates)
WARMUP = 1
LABELS = (0, 1, 2, 3, 4, 5, 6, 2)
SETTINGS = {"num_classes": NUM_CLASSES, "size": SIZE, "batch": BATCH, "noise": NOISE, "rp_size": RP,
            "lr0": LR0, "lr1": LR1, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY,
            "label_smoothing": LABEL_SMOOTHING, "labels": LABELS, "model": "convnet", "ite_warmup": WARMUP, "seed": 0}
#: fedstyle's names of the authors' generator and discriminator weights
GENERATOR_NAMES = {"generator.genedistri.fc1.weight": "fedadg_generator.fc1.weight",
                   "generator.genedistri.fc1.bias": "fedadg_generator.fc1.bias",
                   "generator.genedistri.fc2.weight": "fedadg_generator.fc2.weight",
                   "generator.genedistri.fc2.bias": "fedadg_generator.fc2.bias"}
DISCRIMINATOR_NAMES = {"discriminator.features_pro.0.weight": "fedadg_discriminator.fc1.weight",
                       "discriminator.features_pro.0.bias": "fedadg_discriminator.fc1.bias",
                       "discriminator.features_pro.2.weight": "fedadg_discriminator.fc2.weight",
                       "discriminator.features_pro.2.bias": "fedadg_discriminator.fc2.bias",
                       "discriminator.projection.weight": "fedadg_discriminator.projection.weight"}
GENERATOR_HIDDEN, DISCRIMINATOR_HIDDEN = 4096, 1024  # fixed in pacs-ours/Nets.py:12-15, :114-116


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("fedadg/x", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def weight_shapes() -> dict[str, tuple[int, ...]]:
    """The shapes of every weight, by the fixture's names (fedstyle's model, then the authors' G and D)."""
    from fedstyle.models import build_model

    shapes = {k: tuple(v.shape) for k, v in build_model("convnet", NUM_CLASSES, SIZE).state_dict().items()}
    shapes.update({"generator.genedistri.fc1.weight": (GENERATOR_HIDDEN, NOISE + NUM_CLASSES),
                   "generator.genedistri.fc1.bias": (GENERATOR_HIDDEN,),
                   "generator.genedistri.fc2.weight": (WIDTH, GENERATOR_HIDDEN),
                   "generator.genedistri.fc2.bias": (WIDTH,),
                   "discriminator.features_pro.0.weight": (DISCRIMINATOR_HIDDEN, RP + NUM_CLASSES),
                   "discriminator.features_pro.0.bias": (DISCRIMINATOR_HIDDEN,),
                   "discriminator.features_pro.2.weight": (1, DISCRIMINATOR_HIDDEN),
                   "discriminator.features_pro.2.bias": (1,),
                   "discriminator.projection.weight": (RP, WIDTH)})
    return shapes


def model_state() -> dict[str, torch.Tensor]:
    return seeded_weights(weight_shapes())


class Body(nn.Module):
    """fedstyle's feature extractor F = neck(backbone(x)), the authors' ``fetExtrac``."""

    def __init__(self, model):
        super().__init__()
        self.backbone, self.neck = model.backbone, model.neck

    def forward(self, x):
        return self.neck(self.backbone.forward_maps(x))


class Head(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.head = model.head

    def forward(self, z):
        return self.head(z)


def run(checkout: Path) -> dict[str, torch.Tensor]:
    from torch import optim

    from fedstyle.models import build_model

    state = model_state()
    with stub_modules(attrs={"torchvision": {}, "torchvision.transforms": {}}), \
            importable(checkout, checkout / "pacs-ours"):
        from localTrain import localTrain
        from Nets import Discriminator, GeneDistrNet

        torch.manual_seed(0)
        model = build_model("convnet", NUM_CLASSES, SIZE)
        model.load_state_dict({k: v for k, v in state.items() if not k.startswith(("generator.", "discriminator."))})
        generator = GeneDistrNet(NOISE, WIDTH, optim.SGD, LR1, MOMENTUM, WEIGHT_DECAY)  # as train.py:65
        generator.load_state_dict({k[len("generator."):]: v for k, v in state.items() if k.startswith("generator.")})
        discriminator = Discriminator(WIDTH, NUM_CLASSES, RP)
        discriminator.load_state_dict({k[len("discriminator."):]: v for k, v in state.items()
                                       if k.startswith("discriminator.")})
        discriminator.optimizer = optim.SGD(discriminator.parameters(), LR1, MOMENTUM, weight_decay=WEIGHT_DECAY)
        args = Namespace(device=torch.device("cpu"), label_smoothing=LABEL_SMOOTHING, lr0=LR0, momentum=MOMENTUM,
                         weight_dec=WEIGHT_DECAY, factor=0.2, patience=20, lr_threshold=1e-4, ite_warmup=WARMUP,
                         input_size=NOISE, num_labels=NUM_CLASSES, epochs=1, i_epochs=0)
        body, head = Body(model), Head(model)
        names = {id(p): n for n, p in model.named_parameters()}
        names.update({id(p): "generator." + n for n, p in generator.named_parameters()})
        names.update({id(p): "discriminator." + n for n, p in discriminator.named_parameters()})

        steps: list[dict[str, torch.Tensor]] = []
        sgd_step = torch.optim.SGD.step

        def step(optimizer, *args, **kwargs):
            """Appends {name: the gradient it applies} (parameters holding one) to ``steps``, then steps."""
            steps.append({names[id(p)]: p.grad.detach().clone() for group in optimizer.param_groups
                          for p in group["params"] if p.grad is not None})
            return sgd_step(optimizer, *args, **kwargs)

        # every SGD step, recorded from before the schedulers wrap the optimisers' step methods
        with patched(torch.optim.SGD, step=step):
            trainer = localTrain(body, head, generator, discriminator, None, None, args)
            lrs = {"task": trainer.opti_task.param_groups[0]["lr"],
                   "generator": generator.optimizer.param_groups[0]["lr"],
                   "discriminator": discriminator.optimizer.param_groups[0]["lr"]}
            generator.forward = recorder(generator.forward, lambda result, y, x, device: x.detach().clone())
            trainer.lossFunc = recorder(trainer.lossFunc, detached)
            torch.manual_seed(0)
            total, adv_d, adv_f, adv_g = trainer.train_step(batch())
        noise, ce = generator.forward.values, trainer.lossFunc.values

    assert len(steps) == 3 and all(torch.equal(n, noise[0]) for n in noise), "expected D, F+C and G steps, one noise"
    out = {"noise": noise[0], "labels": torch.tensor(LABELS), "loss/ce": ce[0].reshape(1),
           "loss/adv_d": torch.tensor([adv_d]), "loss/adv_f": torch.tensor([adv_f]),
           "loss/adv_g": torch.tensor([adv_g]), "loss/total": torch.tensor([total])}
    out.update({f"lr/{k}": torch.tensor([v], dtype=torch.float64) for k, v in lrs.items()})
    for label, grads in zip(("d_step/", "task_step/", "g_step/"), steps):
        out.update(gradient_record(grads, prefix=label))
    out.update(weight_sums(state))
    return out


def main(argv: list[str] | None = None) -> Path:
    return generate(NAME, __doc__, REPOSITORY, COMMIT, run, argv=argv,
                    description="FedADG (pacs-ours/localTrain.py train_step): one step's CE, L_advd, L_advf, L_advg "
                                "and the gradients of its D, F+C and G optimiser steps",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
