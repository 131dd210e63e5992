"""Parity fixture for JiGen's ``reference_code`` mode: the authors' jigsaw loader and training step.

Runs, from a checkout of ``fmcarlucci/JigenDG`` at ``COMMIT`` (its root on ``sys.path`` and as the working
folder, since the loader reads ``permutations_30.npy`` from there):

1. ``JigsawDataset`` (data/JigsawLoader.py:47-109) with ``jig_classes=30``, ``patches=False`` (the ResNet
   setting: tiles re-assembled by ``torchvision.utils.make_grid``, JigsawLoader.py:63-66) and
   ``bias_whole_image=BIAS``: its permutations (``__retrieve_permutations``, JigsawLoader.py:103-109) and
   ``__getitem__`` (JigsawLoader.py:81-98) on six images ``seeded("images", (6, 3, 27, 27))`` (9 x 9
   tiles). ``get_image`` returns the image (in a stand-in with PIL's ``size`` and ``crop``) and the tile
   transform is the identity, so what is compared is the tile cut, the permutation and the grid; the
   authors' image and tile augmentations (random resized crop, greyscale, ``ToTensor``/normalisation,
   data/data_helper.py:107-119) are not run. Draws: NumPy's ``np.random.randint`` (the class) and
   Python's ``random()`` (the bias), JigsawLoader.py:88-91, after ``np.random.seed(DRAW_SEED)`` and
   ``random.seed(DRAW_SEED)``; both recorded, with the classes they gave.
2. ``Trainer._do_epoch`` (train_jigsaw.py:79-125) on that batch, as one iteration: a ``Trainer`` made with
   ``object.__new__`` holding the model, a one-batch ``source_loader``, ``jig_weight=JIG_WEIGHT``,
   ``target_id=None``, no test loaders, a logger that records the logged losses and an optimizer whose
   ``step`` records the gradients; once with ``only_non_scrambled`` False (the public default, every
   image classified) and once True (``--classify_only_sane``, ordered images only). The model is the
   authors' ``ResNet`` (models/resnet.py:6-64, ``jigsaw_classes=31``, ``classes=5``) with ``layer1``-``layer3``
   replaced by identities and ``layer4`` by one 3 x 3 convolution 64 -> 512 and a ReLU, so that 27 x 27
   images give the 7 x 7 maps its ``AvgPool2d(7)`` needs (a full ResNet at 222 px is too slow for the
   test); fedstyle's test makes the same replacement. Weights: :func:`parity.common.seeded_weights`
   (seed 0) under the authors' names; training mode; labels ``LABELS``.

Stubs while the authors' code imports (its files are not changed): ``torchvision`` (not importable with
this torch) with ``torchvision.utils.make_grid`` loaded from torchvision's own source file (found with
``importlib.util.find_spec``: install it without its dependencies, ``pip install --no-deps --target
/tmp/parity-deps torchvision`` and ``PYTHONPATH=/tmp/parity-deps``) and, unused here,
``torchvision.transforms`` and ``torchvision.models.resnet`` (blocks that are replaced as above);
``IPython.core.debugger``, ``data.data_helper``, ``models.model_factory``, ``optimizer.optimizer_helper``
and ``utils.Logger``, which train_jigsaw.py imports (lines 4-12) for things ``_do_epoch`` does not use.

Stored: the permutations, the draws and classes, the shuffled batch, per setting the logits, the logged
jigsaw and class losses, the total loss, and every parameter's gradient (whole up to ``FULL_LIMIT``
elements, else sketched).

Run: ``PYTHONPATH=/tmp/parity-deps .venv/bin/python -m parity.jigen --checkout /tmp/parity/JigenDG``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import random
import types
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from parity.common import (TORCHVISION_RESNET_STUBS, generator_name, gradient_record, importable, load_functions,
                           parse_args, patched, recorder, reduced_layer4, require_checkout, seeded, seeded_weights,
                           stub_modules, weight_sums, write_fixture)

REPOSITORY = "fmcarlucci/JigenDG"
COMMIT = "8522c291233588b72aa689f3665a8c14f0ab1a74"

BATCH, CLASSES, SIZE, WIDTH = 6, 5, 27, 512
PERMUTATIONS = 30
LABELS = (0, 3, 1, 4, 2, 3)
BIAS = 0.5
JIG_WEIGHT = 0.7
#: gradients with more elements are stored as a sketch (parity.common.gradient_record)
FULL_LIMIT = 4096
SETTINGS = {"batch": BATCH, "classes": CLASSES, "size": SIZE, "permutations": PERMUTATIONS, "labels": list(LABELS),
            "bias_whole_image": BIAS, "jig_weight": JIG_WEIGHT, "layer4": "conv3x3(64->512)+relu", "weight_seed": 0}
#: fedstyle's classify for the authors' only_non_scrambled
CLASSIFY = {"all": False, "ordered": True}


def images() -> torch.Tensor:
    return seeded("images", (BATCH, 3, SIZE, SIZE))


def torchvision_make_grid():
    """``torchvision.utils.make_grid`` from torchvision's source, without importing torchvision."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: torchvision's source is needed for make_grid: pip install --no-deps --target "
                         "/tmp/parity-deps torchvision, and run with PYTHONPATH=/tmp/parity-deps")
    path = Path(list(spec.submodule_search_locations)[0]) / "utils.py"
    namespace = {"torch": torch, "math": math, "Union": Union, "Optional": Optional,
                 "_log_api_usage_once": lambda obj: None}
    return load_functions(path, ("make_grid",), namespace)["make_grid"]


def stubs():
    """torchvision (its ``make_grid`` real), IPython's debugger and the train script's helpers as stub modules."""
    return stub_modules(attrs={
        **TORCHVISION_RESNET_STUBS, "torchvision.utils": {"make_grid": torchvision_make_grid()},
        "torchvision.transforms": {}, "IPython": {}, "IPython.core": {},
        "IPython.core.debugger": {"set_trace": lambda *a, **k: None},
        "data.data_helper": {"available_datasets": []}, "models.model_factory": {"nets_map": {}},
        "optimizer.optimizer_helper": {"get_optim_and_scheduler": None}, "utils.Logger": {"Logger": None}})


class FakeImage:
    """What ``JigsawDataset.get_tile`` needs of a PIL image: ``size`` (W, H) and ``crop((left, upper, right,
    lower))``."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.size = (tensor.shape[2], tensor.shape[1])

    def crop(self, box):
        left, upper, right, lower = box
        assert all(float(v).is_integer() for v in box), box
        return self.tensor[:, int(upper):int(lower), int(left):int(right)]


class RecordingLogger:
    def __init__(self):
        self.losses = []

    def log(self, it, iters, losses, samples_right, total_samples):
        self.losses.append(dict(losses))


class RecordingOptimizer:
    """``zero_grad`` and a ``step`` that keeps the gradients (and changes nothing)."""

    def __init__(self, model: nn.Module):
        self.model, self.grads = model, None

    def zero_grad(self):
        self.model.zero_grad()

    def step(self):
        self.grads = {k: p.grad.detach().clone() for k, p in self.model.named_parameters()}


def draw_seed() -> int:
    """The first seed whose six draws give 2 to 4 ordered images (both kinds in the batch)."""
    for seed in range(1000):
        np.random.seed(seed)
        random.seed(seed)
        orders = []
        for _ in range(BATCH):
            order = np.random.randint(PERMUTATIONS + 1)
            orders.append(0 if BIAS > random.random() else order)
        if 2 <= orders.count(0) <= 4:
            return seed
    raise AssertionError("no seed gives a mixed batch")


def run(checkout: Path) -> tuple[dict[str, torch.Tensor], int]:
    tensors: dict[str, torch.Tensor] = {}
    with stubs(), importable(checkout), contextlib.chdir(checkout):
        from data import JigsawLoader as loader
        from models import resnet as jigen_resnet
        import train_jigsaw

        x = images()
        dataset = loader.JigsawDataset([f"image{i}" for i in range(BATCH)], list(LABELS), jig_classes=PERMUTATIONS,
                                       img_transformer=None, tile_transformer=lambda tile: tile, patches=False,
                                       bias_whole_image=BIAS)
        dataset.get_image = lambda index: FakeImage(x[index])
        perms = torch.from_numpy(np.asarray(dataset.permutations)).long()
        seed = draw_seed()
        np.random.seed(seed)
        random.seed(seed)
        randint, uniform = recorder(np.random.randint), recorder(random.random)
        with patched(loader, np=types.SimpleNamespace(random=types.SimpleNamespace(randint=randint)), random=uniform):
            items = [dataset[i] for i in range(BATCH)]
        data = torch.stack([item[0] for item in items])
        jig_l = torch.tensor([item[1] for item in items])
        class_l = torch.tensor([item[2] for item in items])
        assert class_l.tolist() == list(LABELS) and data.shape == x.shape
        tensors.update({"permutations": perms, "draw/class": torch.tensor(randint.values),
                        "draw/uniform": torch.tensor(uniform.values, dtype=torch.float64), "orders": jig_l,
                        "shuffled": data})

        model = jigen_resnet.ResNet(jigen_resnet.BasicBlock, [1, 1, 1, 1], jigsaw_classes=PERMUTATIONS + 1,
                                    classes=CLASSES)
        model.layer1 = model.layer2 = model.layer3 = nn.Identity()
        model.layer4 = reduced_layer4()
        state = seeded_weights({k: v.shape for k, v in model.state_dict().items()}, seed=0)
        tensors.update(weight_sums(state))
        for classify, only_sane in CLASSIFY.items():
            model.load_state_dict(state)
            trainer = object.__new__(train_jigsaw.Trainer)
            trainer.model, trainer.device = model, torch.device("cpu")
            trainer.source_loader = [((data, jig_l, class_l), torch.zeros(BATCH, dtype=torch.long))]
            trainer.optimizer, trainer.logger = RecordingOptimizer(model), RecordingLogger()
            trainer.jig_weight, trainer.only_non_scrambled, trainer.target_id = JIG_WEIGHT, only_sane, None
            trainer.n_classes, trainer.test_loaders = CLASSES, {}
            outputs = []
            hook = model.register_forward_hook(lambda module, args, out: outputs.append([o.detach() for o in out]))
            trainer._do_epoch()
            hook.remove()
            (logged,) = trainer.logger.losses
            jigsaw, ce = torch.tensor(logged["jigsaw"]), torch.tensor(logged["class"])
            tensors.update({f"{classify}/jigsaw_logits": outputs[0][0], f"{classify}/class_logits": outputs[0][1],
                            f"{classify}/jigsaw_loss": jigsaw.reshape(1), f"{classify}/class_loss": ce.reshape(1),
                            f"{classify}/loss": (ce + jigsaw * JIG_WEIGHT).reshape(1)})  # train_jigsaw.py:111
            tensors.update(gradient_record(trainer.optimizer.grads, prefix=f"{classify}/grad/", full_limit=FULL_LIMIT))
    return tensors, seed


def main(argv: list[str] | None = None) -> None:
    args = parse_args("jigen", __doc__.splitlines()[0], REPOSITORY, COMMIT, argv)
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    torch.set_num_threads(1)
    tensors, seed = run(args.checkout.resolve())
    write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name("jigen"),
                  description="data/JigsawLoader.py JigsawDataset (permutations, tile shuffle, draws) on six 27 x 27 "
                              "images; train_jigsaw.py Trainer._do_epoch on them (all and ordered-only classification) "
                              "with models/resnet.py's ResNet, layer1-3 identities and layer4 conv3x3(64->512)+ReLU",
                  settings={**SETTINGS, "draw_seed": seed})


if __name__ == "__main__":
    main()
