"""Parity fixture for DSU's ``reference_code`` mode: the authors' ``DistributionUncertainty`` and ``UResNet``.

Runs, from a checkout of ``lixiaotong97/DSU`` at ``COMMIT`` (the repository's root on ``sys.path``; its
``dsu.py`` is "the core code of our method", README; nothing is stubbed):

1. ``DistributionUncertainty.forward`` (dsu.py:52-68, p = 0.5, eps = 1e-6) in training mode on
   ``x = seeded("x", (6, 8, 5, 5), scale=2, offset=0.5)``. Its firing draw ``np.random.random()``
   (dsu.py:53) returns ``0.25`` (the module's ``np`` is replaced by a fixed sequence while it runs); the
   two noise tensors (``torch.randn_like`` in ``_reparameterize``, dsu.py:44: first for the mean, then for
   the standard deviation) are the authors' draws after ``torch.manual_seed(0)``, recorded. Stored: the
   noise, the output and d(sum(out * w))/dx for ``w = seeded("w", x.shape)``.
2. One training step of ``UResNet`` (dsu.py:152-251) with its ``BasicBlock`` (dsu.py:73-102),
   ``layers=[1, 1, 1, 1]``, ``pertubration=DistributionUncertainty``, ``uncertainty=0.5``, followed by a
   linear head ``head`` (512 -> 5; the UResNet returns pooled features, dsu.py:245-251), training mode,
   weights :func:`parity.common.seeded_weights` (seed 0) under the authors' names, on
   ``images = seeded("images", (6, 3, 64, 64))`` and labels ``LABELS``, loss ``F.cross_entropy``. The six
   firing draws are ``FIRE_DRAWS``: ``pertubration0`` (between conv1 and bn1, which fedstyle cannot place)
   and ``pertubration3`` (after layer2) do not fire, the other four (after the max-pooling, layer1, layer3
   and layer4) do; their noise is the authors' draws after ``torch.manual_seed(1)``, recorded. Stored:
   draws, logits, loss, every parameter's gradient (whole up to ``FULL_LIMIT`` elements, else sketched).

``UResNet.__init__`` calls ``pertubration(dim=..., p=...)`` (dsu.py:166-171) but this file's
``DistributionUncertainty.__init__`` takes no ``dim`` (dsu.py:37; the copy in
multi-domain-generalization/dassl/modeling/backbone/uresnet.py:40 does), so the generator passes
``lambda dim, p: DistributionUncertainty(p=p)``.

Run: ``.venv/bin/python -m parity.dsu --checkout /tmp/parity/DSU``.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from parity.common import (FixedDraws, detached, generate, gradient_record, importable, patched, recording, seeded,
                           seeded_weights, weight_sums)

REPOSITORY = "lixiaotong97/DSU"
COMMIT = "82a1de036351b72620abef1a9c4cc561751264a2"

P, EPS = 0.5, 1e-6
X_SHAPE = (6, 8, 5, 5)
MODULE_FIRE_DRAW = 0.25
BATCH, CLASSES, SIZE = 6, 5, 64
LABELS = (0, 3, 1, 4, 2, 3)
#: np.random.random() of pertubration0..5; > P: not fired (dsu.py:53)
FIRE_DRAWS = (0.9, 0.2, 0.4, 0.7, 0.1, 0.3)
#: fedstyle's stages at the authors' pertubration1..5
#: gradients with more elements are stored as a sketch (parity.common.gradient_record)
FULL_LIMIT = 4096
STAGES = ("stem", "layer1", "layer2", "layer3", "layer4")
SETTINGS = {"p": P, "eps": EPS, "x_shape": list(X_SHAPE), "module_fire_draw": MODULE_FIRE_DRAW, "batch": BATCH,
            "classes": CLASSES, "size": SIZE, "labels": list(LABELS), "fire_draws": list(FIRE_DRAWS),
            "stages": list(STAGES), "layers": [1, 1, 1, 1], "weight_seed": 0}


def module_input() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("x", X_SHAPE, scale=2.0, offset=0.5), seeded("w", X_SHAPE)


def model_input() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("images", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def run(checkout: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    with importable(checkout):
        import dsu

        # 1. the module (np.random.random() and torch.randn_like are the draws of dsu.py)
        op = dsu.DistributionUncertainty(p=P, eps=EPS).train()
        x, w = module_input()
        x.requires_grad_(True)
        torch.manual_seed(0)
        with patched(dsu, np=types.SimpleNamespace(random=FixedDraws(random=[MODULE_FIRE_DRAW]))), \
                recording(torch, "randn_like", detached) as record:
            out = op(x)
        (out * w).sum().backward()
        assert len(record) == 2
        tensors.update({"module/noise_mean": record[0], "module/noise_std": record[1],
                        "module/out": out.detach(), "module/grad_x": x.grad})

        # 2. a UResNet step
        backbone = dsu.UResNet(dsu.BasicBlock, [1, 1, 1, 1],
                               pertubration=lambda dim, p: dsu.DistributionUncertainty(p=p), uncertainty=P)
        model = nn.ModuleDict({"backbone": backbone, "head": nn.Linear(512, CLASSES)})
        shapes = {k: v.shape for k, v in backbone.state_dict().items()}
        shapes.update({f"head.{k}": v.shape for k, v in model["head"].state_dict().items()})
        state = seeded_weights(shapes, seed=0)
        backbone.load_state_dict({k: v for k, v in state.items() if not k.startswith("head.")})
        model["head"].load_state_dict({k[len("head."):]: v for k, v in state.items() if k.startswith("head.")})
        model.train()
        fixed = FixedDraws(random=FIRE_DRAWS)
        images, labels = model_input()
        torch.manual_seed(1)
        with patched(dsu, np=types.SimpleNamespace(random=fixed)), \
                recording(torch, "randn_like", detached) as record:
            logits = model["head"](backbone(images))
        loss = F.cross_entropy(logits, labels)
        model.zero_grad()
        loss.backward()
    fired = [u <= P for u in FIRE_DRAWS]
    assert fixed.left("random") == [] and len(record) == 2 * sum(fired) and not fired[0]
    tensors["model/fired"] = torch.tensor(fired)
    for i, noise in enumerate(record):
        tensors[f"model/noise{i}"] = noise
    grads = {k: p.grad for k, p in backbone.named_parameters()}
    grads.update({f"head.{k}": p.grad for k, p in model["head"].named_parameters()})
    tensors.update({"model/logits": logits.detach(), "model/loss": loss.detach().reshape(1)})
    tensors.update(gradient_record(grads, prefix="model/grad/", full_limit=FULL_LIMIT))
    tensors.update(weight_sums(state, prefix="model/weight_sum/"))
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate("dsu", __doc__, REPOSITORY, COMMIT, run, argv=argv, threads=1,
                    description="DistributionUncertainty.forward (dsu.py) on a fixed input with fixed noise; one step "
                                "of dsu.py's UResNet [1,1,1,1] with DSU at its six positions (the first not firing)",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
