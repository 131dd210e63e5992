"""Parity fixture for MixStyle's ``reference_code`` mode: the authors' MixStyle module and their ResNet.

Runs, from a checkout of ``KaiyangZhou/mixstyle-release`` at ``COMMIT`` (folder ``reid`` on ``sys.path``,
so ``models.mixstyle`` and ``models.resnet_ms`` import as the package ``models``; nothing is stubbed):

1. ``MixStyle.forward`` (reid/models/mixstyle.py:85-122, ``mix='random'``, p = 0.5, alpha = 0.1,
   eps = 1e-6) in training mode on ``x = seeded("x", (6, 8, 5, 5), scale=2, offset=0.5)``. Its firing draw
   ``random.random()`` (mixstyle.py:89) returns ``0.25`` (the module's ``random`` is replaced by a fixed
   sequence); lambda (``self.beta.sample``, mixstyle.py:100) and the permutation (``torch.randperm``,
   mixstyle.py:105) are the authors' own draws after ``torch.manual_seed(0)``, recorded. Stored: lambda,
   the permutation, the output and d(sum(out * w))/dx for ``w = seeded("w", x.shape)``.
2. One training step of ``ResNet`` (reid/models/resnet_ms.py:159-395) with their ``BasicBlock``
   (resnet_ms.py:54-104), ``layers=[1, 1, 1, 1]``, 5 classes, ``loss='softmax'``, MixStyle after layer1,
   layer2 and layer3 (``mixstyle_layers``, resnet_ms.py:353-375; p = 0.5, alpha = 0.1), training mode,
   weights :func:`parity.common.seeded_weights` (seed 0) under the authors' names, on
   ``images = seeded("images", (6, 3, 64, 64))`` and labels ``LABELS``. The three firing draws are the
   fixed sequence ``FIRE_DRAWS`` (0.3, 0.8, 0.1: fires after layer1 and layer3, not after layer2); the
   lambdas and permutations of the two calls that fire are the authors' draws after
   ``torch.manual_seed(1)``, recorded. Loss: ``F.cross_entropy`` of the logits, as the imcls trainer
   (imcls/trainers/vanilla2.py:34). Stored: draws, logits, loss, every parameter's gradient (whole up to
   ``FULL_LIMIT`` elements, else sketched, :func:`parity.common.gradient_record`).

Run: ``.venv/bin/python -m parity.mixstyle --checkout /tmp/parity/mixstyle-release``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from parity.common import (FixedDraws, generate, gradient_record, importable, patched, recorder, recording, seeded,
                           seeded_weights, weight_sums)

REPOSITORY = "KaiyangZhou/mixstyle-release"
COMMIT = "16f7cf1fe2c7b1b3c660c72b32817ebb0545397a"

P, ALPHA, EPS = 0.5, 0.1, 1e-6
X_SHAPE = (6, 8, 5, 5)
MODULE_FIRE_DRAW = 0.25
BATCH, CLASSES, SIZE = 6, 5, 64
LABELS = (0, 3, 1, 4, 2, 3)
FIRE_DRAWS = (0.3, 0.8, 0.1)
#: gradients with more elements are stored as a sketch (parity.common.gradient_record)
FULL_LIMIT = 4096
STAGES = ("layer1", "layer2", "layer3")
SETTINGS = {"p": P, "alpha": ALPHA, "eps": EPS, "x_shape": list(X_SHAPE), "module_fire_draw": MODULE_FIRE_DRAW,
            "batch": BATCH, "classes": CLASSES, "size": SIZE, "labels": list(LABELS), "fire_draws": list(FIRE_DRAWS),
            "stages": list(STAGES), "layers": [1, 1, 1, 1], "weight_seed": 0}


def module_input() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("x", X_SHAPE, scale=2.0, offset=0.5), seeded("w", X_SHAPE)


def model_input() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("images", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def record_lambda(beta, record: list) -> None:
    """The authors' ``torch.distributions.Beta`` samples as it does and keeps ("lambda", what it drew) in ``record``."""
    beta.sample = recorder(beta.sample, lambda out, *args, **kwargs: ("lambda", out.clone()), into=record)


def recording_randperm(record: list):
    """``torch.randperm`` keeps ("perm", what it drew) in ``record`` while the block runs."""
    return recording(torch, "randperm", lambda out, *args, **kwargs: ("perm", out.clone()), into=record)


def run(checkout: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    with importable(checkout / "reid"):
        from models import mixstyle as ms_module
        from models import resnet_ms

        # 1. the module (random.random(), lambda and the permutation are the draws of mixstyle.py)
        op = ms_module.MixStyle(p=P, alpha=ALPHA, eps=EPS, mix="random").train()
        record: list = []
        record_lambda(op.beta, record)
        x, w = module_input()
        x.requires_grad_(True)
        torch.manual_seed(0)
        with patched(ms_module, random=FixedDraws(random=[MODULE_FIRE_DRAW])), recording_randperm(record):
            out = op(x)
        (out * w).sum().backward()
        assert [kind for kind, _ in record] == ["lambda", "perm"], record
        tensors.update({"module/lambda": record[0][1], "module/perm": record[1][1], "module/out": out.detach(),
                        "module/grad_x": x.grad})

        # 2. a ResNet step
        model = resnet_ms.ResNet(CLASSES, "softmax", resnet_ms.BasicBlock, [1, 1, 1, 1],
                                 mixstyle_layers=list(STAGES), mixstyle_p=P, mixstyle_alpha=ALPHA)
        state = seeded_weights({k: v.shape for k, v in model.state_dict().items()}, seed=0)
        model.load_state_dict(state)
        model.train()
        record = []
        record_lambda(model.mixstyle.beta, record)
        fixed = FixedDraws(random=FIRE_DRAWS)
        images, labels = model_input()
        torch.manual_seed(1)
        with patched(ms_module, random=fixed), recording_randperm(record):
            logits = model(images)
        loss = F.cross_entropy(logits, labels)
        model.zero_grad()
        loss.backward()
    assert fixed.left("random") == [] and [k for k, _ in record] == ["lambda", "perm"] * 2, record
    fired = [u <= P for u in FIRE_DRAWS]  # mixstyle.py:89: skipped when random.random() > p
    assert sum(fired) == 2
    tensors["model/fired"] = torch.tensor(fired)
    for i in range(2):
        tensors[f"model/lambda{i}"] = record[2 * i][1]
        tensors[f"model/perm{i}"] = record[2 * i + 1][1]
    grads = {k: p.grad for k, p in model.named_parameters()}
    tensors.update({"model/logits": logits.detach(), "model/loss": loss.detach().reshape(1)})
    tensors.update(gradient_record(grads, prefix="model/grad/", full_limit=FULL_LIMIT))
    tensors.update(weight_sums(state, prefix="model/weight_sum/"))
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("mixstyle", __doc__, REPOSITORY, COMMIT, run, argv=argv, threads=1,
                    description="MixStyle.forward (reid/models/mixstyle.py) on a fixed input with fixed draws; one "
                                "step of reid/models/resnet_ms.py's ResNet [1,1,1,1] with MixStyle after layer1-3",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
