"""Parity fixture for StableFDG: one training step of the authors' ResNet-18 pipeline, their Phi, their pairing.

Runs, from a checkout of savertm/StableFDG_github (Dassl.pytorch inside it), **in float64** (issue 49: the
float32 step's gradients sit within 10x of float32's cross-CPU noise, 1.2e-3 on AVX-512 against 1.4e-4 on AVX2;
in float64 both sides agree to about 1e-12, so the test's bars can be 1e-5 whatever the CPU):

* the authors' forward of ``resnet18_OMA_ms_l123`` (dassl/modeling/backbone/resnet.py:211-256: ``style_insert``
  after layer1, ``OMA`` after layer1-3, the ``AFH`` attention module on layer4's output, ``torch.sum`` pooling)
  and the classifier ``nn.Linear(2 * 512, K)`` (dassl/engine/trainer.py:63-88), then the cross-entropy and its
  backward, on a 64 px batch of 32 images of 7 classes with a received style, exactly as
  ``Vanilla2.forward_backward_fed`` (vanilla2.py:37-50) does without its class-balanced batch (no class has a
  single sample in the batch, so the supplemental samples are never read);
* ``TrainerX_fed.style_collect`` (trainer.py:676-722, Phi of a client: one training batch through a copy of the
  model's ``forward_cb``; the method's source, run alone);
* the server's pairing loop of ``TrainerX_fed.run_epoch`` (trainer.py:601-610, the ``while True`` statement, run
  alone) for two rounds of three participants: one where every participant gets another's style, one where the
  last one gets its own.

The model is built with float64 as torch's default dtype (so the code's own tensors, MixStyle's Beta included,
are float64) and loaded with the float32 seeded weights (exact in float64).

Fixed draws: Python's ``random.random`` (which decides whether the shift and each OMA stage fire) is
replaced by a scripted sequence; everything else the authors' code draws is recorded as drawn:
scikit-learn's k-means (``style_insert.kmeans_plus``; numpy's global generator is seeded with
``KMEANS_SEED`` just before each call, so ``KMeans(random_state=KMEANS_SEED)`` repeats it; its input points
and centres are kept), the noise of the shift (``torch.randn_like``), the oversampling draws
(``np.random.choice`` at oma.py:142, 146 and 155, kept as positions in the arrays drawn from: the order
of each level's classes and each extra's member), MixStyle's lambda (``OMA.beta.sample``) and permutation
(``torch.randperm``). Two scenarios: ``a`` (shift fires; layer1 and layer3 fire, layer2 not: oversampling and
exploration at layer1, MixStyle only at layer3) and ``b`` (no shift; layer2 and layer3 fire: oversampling and
exploration at layer2). The received style has a few channels whose sigma mean sits below its spread, so some
draws of sigma' are negative (the code clamps them at 0, style_insert.py:64); the shifted map's mean and standard
deviation per sample and channel are kept.
The pairing's ``random.sample`` of a set (which Python >= 3.11 refuses, so the loop never ends there) gets the
tuple of the set, as Python 3.10 did, drawn by ``random.Random(PAIRING_SEEDS[round])``.

The fixture holds the inputs' seeds, the labels, the received style, the draws, the logits, the enlarged
batch's labels, the loss and the gradient of every parameter (``cad3.qkv_conv``'s query and key rows
under ``cad3.q.*`` / ``cad3.k.*``; its value rows get no gradient), Phi, and the pairings with the draws that
made them. Weights: :func:`parity.common.seeded_weights` on the authors' parameter names (the sums are stored).

Run: ``.venv/bin/python -m parity.stablefdg --checkout /tmp/parity/StableFDG_github``.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import random
import sys
import types
from pathlib import Path

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
DTYPE = torch.float64
#: 32 labels of 7 classes, none alone in the batch (the supplemental-sample path stays unused)
LABELS = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 3, 5, 6, 0, 2, 4, 0, 1]
#: random.random() values: the shift, then OMA at layer1, layer2, layer3 (<= 0.5 fires)
SCENARIOS = {"a": [0.1, 0.2, 0.9, 0.3], "b": [0.9, 0.8, 0.2, 0.4]}
EXPLORATION, OVERSAMPLING = 3.0, 32
#: numpy's global seed just before each k-means (scikit-learn's KMeans without random_state draws from it)
KMEANS_SEED = 1234
#: received-style channels whose sigma mean (0.05) sits below its spread (0.3): about 43 % of their draws of
#: sigma' are negative
LOW_SIGMA_CHANNELS = (3, 17, 40)
#: the pairing's participants (client ids, the code's ``idxs_users``) and each round's seed of ``random.Random``:
#: round 0 gives a derangement, round 1 the last participant its own style (the first seeds that do)
PARTICIPANTS = [7, 2, 19]
PAIRING_SEEDS = (0, 4)
#: Phi's batch (style_collect): images of this many
PHI_BATCH = 16


def received_style(channels: int = 64) -> list[torch.Tensor]:
    """[mean (mu, sigma), spread (mu, sigma)] of a plausible other client, as ``style_collect`` returns them
    (float32 values; a few sigma means below their spread, :data:`LOW_SIGMA_CHANNELS`)."""
    sigma = seeded("style/sigma", (channels,), scale=0.1).abs() + 0.5
    spread = seeded("style/spread", (2 * channels,), scale=0.05).abs() + 0.05
    low = torch.tensor(LOW_SIGMA_CHANNELS)
    sigma[low] = 0.05
    spread[channels + low] = 0.3
    # spreads on a grid of 2^-12: their squares (fedstyle's payload holds variances, in float32) are exact in
    # float32, so sqrt(var) gives the spread back exactly in float64
    spread = torch.round(spread * 4096) / 4096
    return [torch.cat([seeded("style/mu", (channels,), scale=0.2, offset=0.4), sigma]), spread]


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return seeded("x", (BATCH, 3, SIZE, SIZE)), torch.tensor(LABELS)


def phi_inputs() -> torch.Tensor:
    return seeded("phi/x", (PHI_BATCH, 3, SIZE, SIZE), scale=0.8, offset=0.1)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype while the block runs (the authors' code in float64: its own tensors too)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def seeded_backbone(resnet: types.ModuleType) -> tuple[nn.Module, nn.Module, dict[str, torch.Tensor]]:
    """The authors' ``resnet18_OMA_ms_l123`` and classifier in :data:`DTYPE` with the seeded weights."""
    backbone = resnet.resnet18_OMA_ms_l123(pretrained=False)
    classifier = nn.Linear(2 * backbone.out_features, CLASSES)
    shapes = {k: v.shape for k, v in backbone.state_dict().items()}
    shapes.update({"classifier." + k: v.shape for k, v in classifier.state_dict().items()})
    state = seeded_weights(shapes)
    backbone.load_state_dict({k: v for k, v in state.items() if not k.startswith("classifier.")})
    classifier.load_state_dict({k[len("classifier."):]: v for k, v in state.items() if k.startswith("classifier.")})
    return backbone, classifier, state


def _drawn_line(frame) -> str:
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def run_scenario(fires: list[float]) -> dict[str, torch.Tensor]:
    resnet = sys.modules["dassl.modeling.backbone.resnet"]
    style_module = sys.modules["dassl.modeling.ops.style_insert"]
    torch.manual_seed(0)
    np.random.seed(0)
    backbone, classifier, state = seeded_backbone(resnet)
    backbone.train()
    x, y = inputs()
    x = x.to(DTYPE)
    keys = ("centres", "kmeans_input", "noise", "lam", "perm", "level_order", "member", "shifted")
    draws: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
    extra: list[int] = []

    script = FixedDraws(random=fires)
    np_choice = np.random.choice

    def choice(a, size=None, replace=True, *args, **kwargs):
        out = np_choice(a, size, replace, *args, **kwargs)
        frame = sys._getframe(1)
        if frame.f_code.co_filename.endswith("oma.py"):
            line, pool = _drawn_line(frame), list(np.asarray(a))
            positions = torch.tensor([pool.index(v) for v in np.asarray(out).tolist()], dtype=torch.long)
            if "candi" in line:  # a level's classes, in the drawn order (positions among the level's classes)
                draws["level_order"].append(positions)
            elif "ind_per_label" in line and "add_index" in line:  # an extra: its position among its class
                draws["member"].append(positions)
                extra.extend(np.asarray(out).tolist())
            else:
                raise AssertionError(f"an unexpected draw at oma.py:{frame.f_lineno}: {line.strip()}")
        return out

    kmeans_plus = style_module.kmeans_plus

    def seeded_kmeans(points, device, share_number):
        draws["kmeans_input"].append(points.detach().clone())
        np.random.seed(KMEANS_SEED)
        centres = kmeans_plus(points, device, share_number)
        draws["centres"].append(centres.detach().clone())
        return centres

    # the shifted map's mean and standard deviation over H x W per sample and channel (a channel whose sigma'
    # was clamped to 0 is flat: its deviation is 0); None when the shift did not fire (style_insert returns x)
    backbone.style = recorder(backbone.style, lambda out, x, *args: None if out is x else
                              torch.stack([out.mean((2, 3)), out.std((2, 3))]).detach(), into=draws["shifted"])
    backbone.OMA.beta.sample = recorder(backbone.OMA.beta.sample, lambda out, *args, **kwargs: out.reshape(-1).clone(),
                                        into=draws["lam"])
    with patched(random, random=script.random), patched(np.random, choice=choice), \
            patched(style_module, kmeans_plus=seeded_kmeans), \
            recording(torch, "randn_like", detached, into=draws["noise"]), \
            recording(torch, "randperm", detached, into=draws["perm"]):
        v, labels = backbone(x, torch.zeros(BATCH, dtype=torch.long), y.clone(), supplemental_samples=None,
                             style=[t.to(DTYPE) for t in received_style()], StableFDG_param=(EXPLORATION, OVERSAMPLING))
        logits = classifier(v)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
    if script.left("random"):
        raise AssertionError(f"the scripted random.random() values were not all used: {script.left('random')} left")
    draws["shifted"] = [stats for stats in draws["shifted"] if stats is not None]
    grads = {n: p.grad for n, p in backbone.named_parameters() if p.grad is not None}
    grads.update({"classifier." + n: p.grad for n, p in classifier.named_parameters()})
    qkv_w, qkv_b = grads.pop("cad3.qkv_conv.weight"), grads.pop("cad3.qkv_conv.bias")
    if qkv_w[60:].abs().max() != 0:
        raise AssertionError("the attention's value rows got a gradient: the AFH module changed")
    grads.update({"cad3.q.weight": qkv_w[:30], "cad3.k.weight": qkv_w[30:60],
                  "cad3.q.bias": qkv_b[:30], "cad3.k.bias": qkv_b[30:60]})
    out = {"logits": logits.detach(), "labels": labels, "loss": loss.detach().reshape(1)}
    out.update(gradient_record(grads, full_limit=8192))  # float32: the gradients to 6e-8, below the 1e-5 bar
    out["draw/extra"] = torch.tensor(extra, dtype=torch.long)
    for key, values in draws.items():
        for i, value in enumerate(values):
            out[f"draw/{key}/{i}"] = value
    out.update(weight_sums(state))
    return out


def _method(tree: ast.Module, owner: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise SystemExit(f"error: trainer.py has no {owner}.{name}: not the pinned commit?")


def trainer_code(checkout: Path) -> tuple[dict, ast.While]:
    """From dassl/engine/trainer.py: ``SimpleNet.forward_cb``, ``TrainerX_fed.parse_batch_train`` and
    ``style_collect`` compiled as plain functions (the file's imports need packages not installed here), and
    the pairing loop of ``TrainerX_fed.run_epoch`` (its ``while True`` statement that calls ``random.sample``)."""
    path = checkout / "Dassl.pytorch" / "dassl" / "engine" / "trainer.py"
    tree = ast.parse(path.read_text(), str(path))
    nodes = [_method(tree, "SimpleNet", "forward_cb"), _method(tree, "TrainerX_fed", "parse_batch_train"),
             _method(tree, "TrainerX_fed", "style_collect")]
    namespace = {"torch": torch, "copy": __import__("copy")}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    loops = [node for node in ast.walk(_method(tree, "TrainerX_fed", "run_epoch")) if isinstance(node, ast.While)
             and "random.sample" in ast.unparse(node)]
    if len(loops) != 1:
        raise SystemExit("error: trainer.py's run_epoch has no single pairing loop: not the pinned commit?")
    return namespace, loops[0]


def run_phi(checkout: Path, code: dict) -> dict[str, torch.Tensor]:
    """``style_collect`` of one training batch (the model in training mode, as the round leaves it)."""
    resnet = sys.modules["dassl.modeling.backbone.resnet"]
    backbone, _, _ = seeded_backbone(resnet)
    backbone.train()
    net = types.SimpleNamespace(backbone=backbone)
    net.forward_cb = types.MethodType(code["forward_cb"], net)
    trainer = types.SimpleNamespace(device=torch.device("cpu"))
    trainer.parse_batch_train = types.MethodType(code["parse_batch_train"], trainer)
    batch = {"img": phi_inputs().to(DTYPE), "label": torch.zeros(PHI_BATCH, dtype=torch.long),
             "domain": torch.zeros(PHI_BATCH, dtype=torch.long)}
    mean, spread = code["style_collect"](trainer, [batch], local_model=net)
    return {"phi/mean": mean, "phi/spread": spread}


class Python310Random:
    """``random`` for the pairing loop: ``sample`` of a set as Python 3.10 ran it (on the set's tuple; 3.11
    raises), drawn by ``random.Random(seed)``; every successful draw kept (the value, the population size)."""

    def __init__(self, seed: int):
        self.rng, self.kept = random.Random(seed), []

    def sample(self, population, k):
        population = tuple(population)
        out = self.rng.sample(population, k)  # ValueError on an empty population, as the code expects
        self.kept.append((out[0], sorted(population)))
        return out


def run_pairing(loop: ast.While, seed: int) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """The code's pairing loop on :data:`PARTICIPANTS`: (new_index, the draws)."""
    draws = Python310Random(seed)
    namespace = {"random": draws, "idxs_users": np.array(PARTICIPANTS), "new_index": [], "set": set,
                 "range": range, "len": len}
    exec(compile(ast.Module(body=[loop], type_ignores=[]), "trainer.py", "exec"), namespace)
    return [int(v) for v in namespace["new_index"]], draws.kept


def pairing_record(loop: ast.While) -> dict[str, torch.Tensor]:
    """Per round: ``pairing/<r>/perm`` (the participant position whose style each position receives) and
    ``pairing/<r>/draw`` (each successful draw as fedstyle's ``greedy_pairing`` makes it: the index of the chosen
    position among the free positions in ascending order) and ``.../free`` (how many were free)."""
    out = {}
    for r, seed in enumerate(PAIRING_SEEDS):
        new_index, kept = run_pairing(loop, seed)
        position = {c: i for i, c in enumerate(PARTICIPANTS)}
        out[f"pairing/{r}/perm"] = torch.tensor([position[c] for c in new_index])
        free = [sorted(position[c] for c in population) for _, population in kept]
        out[f"pairing/{r}/draw"] = torch.tensor([f.index(position[v]) for (v, _), f in zip(kept, free)])
        out[f"pairing/{r}/free"] = torch.tensor([len(f) for f in free])
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(NAME, __doc__.splitlines()[0], REPOSITORY, COMMIT, argv)
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    torch.set_num_threads(1)
    tensors: dict[str, torch.Tensor] = {}
    code, loop = trainer_code(args.checkout)
    with importable(args.checkout / "Dassl.pytorch"), default_dtype(DTYPE):
        import dassl.modeling.backbone.resnet  # noqa: F401  (registers the modules run_scenario reads)

        for name, fires in SCENARIOS.items():
            for key, value in run_scenario(fires).items():
                if key.startswith("weight_sum/"):
                    tensors[key] = value
                else:
                    tensors[f"{name}/{key}"] = value
        tensors.update(run_phi(args.checkout, code))
    tensors.update(pairing_record(loop))
    x, y = inputs()
    tensors["labels"] = y
    style = received_style()
    tensors["style/mean"], tensors["style/spread"] = style
    write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name(NAME),
                  description="in float64: one ResNet-18 training step of StableFDG (shift with negative sigma' "
                              "draws, k-means, oversampling, exploration, MixStyle, attention) on 32 seeded 64 px "
                              "images in two firing scenarios; Phi of one batch; two rounds of the server's pairing",
                  settings={"size": SIZE, "batch": BATCH, "classes": CLASSES, "labels": LABELS,
                            "scenarios": SCENARIOS, "exploration_level": EXPLORATION,
                            "oversampling_size": OVERSAMPLING, "input": "seeded('x')", "dtype": "float64",
                            "kmeans_seed": KMEANS_SEED, "low_sigma_channels": list(LOW_SIGMA_CHANNELS),
                            "participants": PARTICIPANTS, "pairing_seeds": list(PAIRING_SEEDS),
                            "phi_batch": PHI_BATCH})


if __name__ == "__main__":
    main()
