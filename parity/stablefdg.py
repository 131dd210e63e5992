"""Parity fixture for StableFDG: one training step of the authors' ResNet-18 pipeline.

Runs, from a checkout of savertm/StableFDG_github (Dassl.pytorch inside it), the authors' forward of
``resnet18_OMA_ms_l123`` (dassl/modeling/backbone/resnet.py:211-256: ``style_insert`` after layer1,
``OMA`` after layer1-3, the ``AFH`` attention module on layer4's output, ``torch.sum`` pooling) and
the classifier ``nn.Linear(2 * 512, K)`` (dassl/engine/trainer.py:63-88), then the cross-entropy and its
backward, on a 64 px batch of 32 images of 7 classes with a received style, exactly as
``Vanilla2.forward_backward_fed`` (trainer.py vanilla2.py:37-50) does without its class-balanced batch
(no class has a single sample in the batch, so the supplemental samples are never read).

Fixed draws: Python's ``random.random`` (which decides whether the shift and each OMA stage fire) is
replaced by a scripted sequence; everything else the authors' code draws is recorded as drawn:
scikit-learn's k-means centres (``style_insert.kmeans_plus``), the noise of the shift
(``torch.randn_like``), the oversampled indices (``np.random.choice`` at oma.py:155), MixStyle's lambda
(``OMA.beta.sample``) and permutation (``torch.randperm``). Two scenarios: ``a`` (shift fires; layer1
and layer3 fire, layer2 not: oversampling and exploration at layer1, MixStyle only at layer3) and ``b``
(no shift; layer2 and layer3 fire: oversampling and exploration at layer2).

The fixture holds the inputs' seeds, the labels, the received style, the draws, the logits, the enlarged
batch's labels, the loss and the gradient of every parameter (``cad3.qkv_conv``'s query and key rows
under ``cad3.q.*`` / ``cad3.k.*``; its value rows get no gradient). Weights: :func:`parity.common.seeded_weights`
on the authors' parameter names (the sums are stored).

Run: ``.venv/bin/python -m parity.stablefdg --checkout /tmp/parity/StableFDG_github``.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from parity.common import (FixedDraws, detached, generator_name, gradient_record, importable, parse_args, patched,
                           recorder, recording, require_checkout, seeded, seeded_weights, weight_sums, write_fixture)

REPOSITORY = "savertm/StableFDG_github"
COMMIT = "77eac350f8515c45630f60d2564863e3da8c8687"
NAME = "stablefdg"
SIZE, BATCH, CLASSES = 64, 32, 7
#: 32 labels of 7 classes, none alone in the batch (the supplemental-sample path stays unused)
LABELS = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 3, 5, 6, 0, 2, 4, 0, 1]
#: random.random() values: the shift, then OMA at layer1, layer2, layer3 (<= 0.5 fires)
SCENARIOS = {"a": [0.1, 0.2, 0.9, 0.3], "b": [0.9, 0.8, 0.2, 0.4]}
EXPLORATION, OVERSAMPLING = 3.0, 32


def received_style(channels: int = 64) -> list[torch.Tensor]:
    """[mean (mu, sigma), spread (mu, sigma)] of a plausible other client, as ``style_collect`` returns them."""
    mean = torch.cat([seeded("style/mu", (channels,), scale=0.2, offset=0.4),
                      seeded("style/sigma", (channels,), scale=0.1).abs() + 0.5])
    spread = seeded("style/spread", (2 * channels,), scale=0.05).abs() + 0.05
    return [mean, spread]


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("x", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def run_scenario(fires: list[float]) -> dict[str, torch.Tensor]:
    resnet = sys.modules["dassl.modeling.backbone.resnet"]
    style_module = sys.modules["dassl.modeling.ops.style_insert"]
    torch.manual_seed(0)
    np.random.seed(0)
    backbone = resnet.resnet18_OMA_ms_l123(pretrained=False)
    classifier = nn.Linear(2 * backbone.out_features, CLASSES)
    shapes = {k: v.shape for k, v in backbone.state_dict().items()}
    shapes.update({"classifier." + k: v.shape for k, v in classifier.state_dict().items()})
    state = seeded_weights(shapes)
    backbone.load_state_dict({k: v for k, v in state.items() if not k.startswith("classifier.")})
    classifier.load_state_dict({k[len("classifier."):]: v for k, v in state.items() if k.startswith("classifier.")})
    backbone.train()
    x, y = inputs()
    draws: dict[str, list[torch.Tensor]] = {"centres": [], "noise": [], "extra": [], "lam": [], "perm": []}

    script = FixedDraws(random=fires)
    np_choice = np.random.choice

    def choice(a, *args, **kwargs):
        out = np_choice(a, *args, **kwargs)
        frame = sys._getframe(1)
        if frame.f_code.co_filename.endswith("oma.py") and frame.f_lineno == 155:  # add_index += ...
            draws["extra"].append(torch.as_tensor(np.asarray(out), dtype=torch.long))
        return out

    backbone.OMA.beta.sample = recorder(backbone.OMA.beta.sample, lambda out, *args, **kwargs: out.reshape(-1).clone(),
                                        into=draws["lam"])
    with patched(random, random=script.random), patched(np.random, choice=choice), \
            recording(style_module, "kmeans_plus", lambda out, *args, **kwargs: out.detach().clone().float(),
                      into=draws["centres"]), \
            recording(torch, "randn_like", detached, into=draws["noise"]), \
            recording(torch, "randperm", detached, into=draws["perm"]):
        v, labels = backbone(x, torch.zeros(BATCH, dtype=torch.long), y.clone(), supplemental_samples=None,
                             style=received_style(), StableFDG_param=(EXPLORATION, OVERSAMPLING))
        logits = classifier(v)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
    if script.left("random"):
        raise AssertionError(f"the scripted random.random() values were not all used: {script.left('random')} left")
    grads = {n: p.grad for n, p in backbone.named_parameters() if p.grad is not None}
    grads.update({"classifier." + n: p.grad for n, p in classifier.named_parameters()})
    qkv_w, qkv_b = grads.pop("cad3.qkv_conv.weight"), grads.pop("cad3.qkv_conv.bias")
    if qkv_w[60:].abs().max() != 0:
        raise AssertionError("the attention's value rows got a gradient: the AFH module changed")
    grads.update({"cad3.q.weight": qkv_w[:30], "cad3.k.weight": qkv_w[30:60],
                  "cad3.q.bias": qkv_b[:30], "cad3.k.bias": qkv_b[30:60]})
    out = {"logits": logits.detach(), "labels": labels, "loss": loss.detach().reshape(1)}
    out.update(gradient_record(grads, full_limit=8192))
    out["draw/extra"] = torch.cat(draws.pop("extra")) if draws["extra"] else torch.zeros(0, dtype=torch.long)
    for key, values in draws.items():
        for i, value in enumerate(values):
            out[f"draw/{key}/{i}"] = value
    out.update(weight_sums(state))
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(NAME, __doc__.splitlines()[0], REPOSITORY, COMMIT, argv)
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    torch.set_num_threads(1)
    tensors: dict[str, torch.Tensor] = {}
    with importable(args.checkout / "Dassl.pytorch"):
        import dassl.modeling.backbone.resnet  # noqa: F401  (registers the modules run_scenario reads)

        for name, fires in SCENARIOS.items():
            for key, value in run_scenario(fires).items():
                if key.startswith("weight_sum/"):
                    tensors[key] = value
                else:
                    tensors[f"{name}/{key}"] = value
    x, y = inputs()
    tensors["labels"] = y
    style = received_style()
    tensors["style/mean"], tensors["style/spread"] = style
    write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name(NAME),
                  description="one ResNet-18 training step of StableFDG (shift, oversampling, exploration, "
                              "MixStyle, attention) on 32 seeded 64 px images; two firing scenarios",
                  settings={"size": SIZE, "batch": BATCH, "classes": CLASSES, "labels": LABELS,
                            "scenarios": SCENARIOS, "exploration_level": EXPLORATION,
                            "oversampling_size": OVERSAMPLING, "input": "seeded('x')"})


if __name__ == "__main__":
    main()
