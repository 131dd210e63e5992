"""Parity fixture for FedDG's episodic step (``feddg_fft`` with ``episodic=true, reference_code=true``): the
authors' meta-train / meta-test update of ``train_ELCFS.py`` (liuquande/FedDG-ELCFS), two batches.

The authors wrote the step inline, in the script's ``__main__`` block: the loop ``for i_batch, sampled_batch in
enumerate(dataloader_current):`` (``train_ELCFS.py:199-286``). The generator compiles that loop alone from the
checkout (:func:`parity.common.load_loop`, which cuts it from the text by indentation: the file does not parse at
this commit, line 58 lacking a closing bracket; the rest of the script, which parses arguments and globs a dataset,
is not run) and runs it unchanged over a loader of one batch, twice, in a namespace holding the names it reads.
What it does, line by line:

- ``loss_inner = dice_loss(net(x))``; ``grads = torch.autograd.grad(loss_inner, net.parameters(),
  retain_graph=True)``: no ``create_graph``, so the outer loss reaches the weights only through ``w'``'s first
  term (first order; fedstyle's ``meta_order=first``) (:217-219);
- ``fast_weights = w - meta_step_size * clamp(grad, -clip_value, clip_value)`` for every named parameter (:221-223);
- ``loss_outer = dice_loss(net(x', fast_weights)) + 0.1 * cont_loss``; ``total_loss = loss_inner + loss_outer``;
  ``zero_grad``, ``backward``, the client's Adam step (:226-252; Adam(lr, betas (0.9, 0.999)), :176).

What stands in for the segmentation task, the same on both sides:

- the network is fedstyle's Digits-DG ConvNet classifier (8 channels, 32 x 32, BatchNorm) behind the U-Net's
  calling convention (``networks/unet2d.py:153-182``): ``net(x, weights=None)`` returns (prediction, mask,
  embedding), and with ``weights`` runs on them (``torch.func.functional_call``). The U-Net's norms are
  InstanceNorm without affine weights, so its weighted forward, like this one, replaces every parameter;
- ``dice_loss`` is cross-entropy on the classifier's logits (fedstyle classifies; the step does not depend on
  which loss it differentiates);
- the boundary-oriented contrastive term (``cont_loss_func``, an ``NTXentLoss`` of pytorch_metric_learning over
  the disc and cup contour embeddings, :185, 229-245) is zero: it needs segmentation masks, and fedstyle does not
  implement it (docs/methods/feddg_fft.md). The contour masks are ones, the embedding a zero map, and
  ``extract_contour_embedding`` (:95-106) a stand-in that feeds only that zero term (the file's own function cannot be
  compiled from a file that does not parse).

Two settings: the code's defaults (``meta_step_size`` 1e-3, ``clip_value`` 100: the clamp never binds) and one
where the inner step is large and the clamp binds for about half the gradient (0.5 and 0.08), so that a second-order
step or a missing clamp would show. Weights: :func:`parity.common.seeded_weights` (seed 0), fedstyle's names.
Inputs: ``seeded`` images x and copies x' (8 x 3 x 32 x 32 per batch), labels ``arange(8) % 4``; no random
draw enters the step. Stored per setting and batch: the inner, outer and total loss, every gradient; after the
second batch, the weights and the BatchNorm statistics (two forward passes a batch update them).

Run: ``.venv/bin/python -m parity.feddg_episodic --checkout /tmp/parity/FedDG-ELCFS``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from parity.common import generate, gradient_record, load_loop, no_cuda, seeded, seeded_weights, weight_sums

REPOSITORY = "liuquande/FedDG-ELCFS"
COMMIT = "0a281e408a43d5ab4486f213dd286dacc733dd41"
NAME = "feddg_episodic"

#: (meta_step_size, clip_value) per run: the code's defaults, then a large step whose clamp binds
RUNS = {"code": (1e-3, 100.0), "clamped": (0.5, 0.08)}
SETTINGS = {"input_size": 32, "channels": 8, "classes": 4, "batch": 8, "batches": 2, "lr": 1e-3,
            "runs": {k: list(v) for k, v in RUNS.items()}, "seed": 0}


def build_model() -> nn.Module:
    """fedstyle's ConvNet classifier with the seeded weights (both sides)."""
    from fedstyle.models.base import Classifier
    from fedstyle.models.convnet import ConvNet

    s = SETTINGS
    model = Classifier(ConvNet(s["input_size"], s["channels"]), s["classes"])
    model.load_state_dict(seeded_weights({k: v.shape for k, v in model.state_dict().items()}, seed=s["seed"]))
    return model


def batch(k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch ``k``: images x, their copies x' (another draw, shifted: another domain's look) and labels."""
    s = SETTINGS
    shape = (s["batch"], 3, s["input_size"], s["input_size"])
    return (seeded(f"x/{k}", shape), seeded(f"copy/{k}", shape, scale=1.5, offset=0.3),
            torch.arange(s["batch"]) % s["classes"])


class UNetConvention(nn.Module):
    """A classifier called as the authors' ``Unet2D`` is: ``forward(x, weights=None)`` -> (prediction, mask,
    embedding), with ``weights`` (its own parameter names) the parameters it runs on. The embedding is a zero map:
    the contrastive term it feeds is zero here (see the module docstring)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, weights=None):
        if weights is None:
            logits = self.model(x)
        else:
            prefix = "model."
            logits = functional_call(self.model, {k[len(prefix):]: v for k, v in weights.items()}, (x,), strict=False)
        return logits, logits, x.new_zeros(len(x), 1, 1, 1)


def namespace(net: nn.Module, optimizer, meta_step: float, clip: float) -> dict:
    """The names the authors' loop reads, besides the loader and ``iter_num`` set per batch."""
    return {"torch": torch, "np": np, "time": time, "OrderedDict": OrderedDict, "logging": logging,
            "net_current": net, "optimizer_current": optimizer, "meta_step_size": meta_step, "clip_value": clip,
            "dice_loss": lambda prediction, labels: F.cross_entropy(prediction, labels),
            "extract_contour_embedding": lambda contours, embedding: [(c * embedding).sum((-1, -2)) for c in contours],
            "cont_loss_func": lambda embeddings, labels: torch.zeros(()),
            # display_freq and the every-20 image dump never fire: iter_num is 1 after each one-batch pass
            "display_freq": 5, "writer": None, "lr_": SETTINGS["lr"], "epoch_num": 0, "client_idx": 0}


def run(checkout: Path) -> dict[str, torch.Tensor]:
    s = SETTINGS
    loop = load_loop(checkout / "train_ELCFS.py", "i_batch, sampled_batch")
    tensors = weight_sums(build_model().state_dict())
    batches = [batch(k) for k in range(s["batches"])]
    tensors.update({f"y/{k}": y for k, (_, _, y) in enumerate(batches)})
    for run_name, (meta_step, clip) in RUNS.items():
        net = UNetConvention(build_model()).train()
        optimizer = torch.optim.Adam(net.parameters(), lr=s["lr"], betas=(0.9, 0.999))  # train_ELCFS.py:176
        names = namespace(net, optimizer, meta_step, clip)
        for k, (x, x_copy, y) in enumerate(batches):
            ones = torch.ones(len(x), 1, s["input_size"], s["input_size"])
            sampled = {"image": torch.cat([x, x_copy], 1), "label": y, "disc_contour": ones, "disc_bg": ones,
                       "cup_contour": ones, "cup_bg": ones}
            names.update(dataloader_current=[sampled], iter_num=0)
            with no_cuda():
                exec(loop, names)
            prefix = f"{run_name}/{k}/"
            for term in ("loss_inner", "loss_outer", "total_loss"):
                tensors[prefix + term] = names[term].detach().reshape(1)
            # the inner gradients the clamp cut (the loop's own ``grads``), to show which run it binds in
            tensors[prefix + "clamped"] = torch.tensor([sum(int((g.abs() > clip).sum()) for g in names["grads"])])
            grads = {n[len("model."):]: p.grad for n, p in net.named_parameters()}
            tensors.update(gradient_record(grads, prefix=prefix + "grad/"))
        tensors.update({f"{run_name}/state/{n}": v.detach().clone() for n, v in net.model.state_dict().items()})
    return tensors


def main(argv: list[str] | None = None) -> Path:
    return generate(NAME, __doc__ or "", REPOSITORY, COMMIT, run, threads=1,
                    description="train_ELCFS.py's inline episodic step (:199-252) for two batches with Adam, on a "
                                "ConvNet classifier in the U-Net's calling convention, cross-entropy for the Dice "
                                "loss, the contrastive term zero; the code's meta step and clip, and a binding clip",
                    settings=SETTINGS, argv=argv)


if __name__ == "__main__":
    main()
