"""The scale: what a plain FedAvg weight update already leaks (gradient inversion on one local step).

The server of every star method receives each client's weights after local training. After *one*
local SGD step from the global weights w (momentum buffer empty, so the step is lr * (g + wd * w)),
the server knows the batch's gradient exactly: g = (w - w') / lr - wd * w. It then runs Geiping et
al.'s inversion (NeurIPS'20) on that gradient with the labels read off the head's bias gradient
(iDLG). This is the receiver's best case among weight updates — more local steps blur it — so the
report's sentence "styles leak more / less than the weights you already send" compares a style
payload with the most an update can give away.

On the audited BatchNorm ConvNets the inversion tends to stall (issue 36: 1 - cos 0.16-0.28 after 200-2,000
steps, 0 at the true images), so every row carries the loss reached (``recon_loss``, the best of
``settings.restarts`` random starts) beside the loss at the true images and labels (``truth_loss``): a
large gap is an optimiser failure, not evidence that the update hides its images. The guess is the best
uninformed one (:mod:`fedstyle.audit.guess`), matched to its best image of the batch as the
reconstruction is.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.audit.gradient_inversion import (
    gradient_from_update,
    gradient_matching_loss,
    infer_labels,
    invert_gradients,
)
from fedstyle.audit.guess import best_uninformed_guess
from fedstyle.audit.metrics import best_match, psnr, ssim
from fedstyle.audit.playbook import AuditSettings, Public, SurfaceResult, Victim, draw_rows, summarise_reconstructions
from fedstyle.audit.reconstruction import PSNR_CAP


class NormalizedModel(nn.Module):
    """``model(normalize(x))`` for images in [0, 1]: the attacker optimises pixels, the model wants its input."""

    def __init__(self, model: nn.Module, normalize: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.model, self.normalize = model, normalize

    def forward(self, x01: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalize(x01))


def observed_gradient(net: NormalizedModel, x01: torch.Tensor, y: torch.Tensor, lr: float,
                      weight_decay: float) -> dict[str, torch.Tensor]:
    """One local SGD step as the client takes it, and the gradient the server reads off the update."""
    before = {k: p.detach().clone() for k, p in net.named_parameters()}
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(net(x01), y).backward()
    optimizer.step()
    after = {k: p.detach().clone() for k, p in net.named_parameters()}
    grads = gradient_from_update(before, after, lr)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(before[k])
            p.grad = None
    return {k: g - weight_decay * before[k] for k, g in grads.items()}


def gradient_baseline(model: nn.Module, normalize: Callable[[torch.Tensor], torch.Tensor], victims: list[Victim],
                      public: Public, classify: Callable, settings: AuditSettings, *, batch: int, lr: float,
                      weight_decay: float) -> SurfaceResult:
    """Invert one local step of ``batch`` images for each of the first ``settings.victims`` victims."""
    net = NormalizedModel(model, normalize)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}  # BatchNorm's buffers move in train mode
    head_bias = next(k for k, _ in reversed(list(net.named_parameters())) if k.endswith("bias"))
    g = torch.Generator().manual_seed(settings.seed)
    result = SurfaceResult("fedavg", f"weight update (1 step, batch {batch})",
                           "each client, every round, to the server", float(batch))
    rows: list[dict] = []
    device = next(model.parameters()).device
    try:
        model.train()
        for victim in victims[: settings.victims]:
            pick = draw_rows(len(victim.images), batch, g)
            x01 = victim.images[pick].to(device).float().div(255)
            y = victim.labels[pick].to(device)
            grads = observed_gradient(net, x01, y, lr, weight_decay)
            labels = infer_labels(grads[head_bias], len(pick)).to(device)
            runs = [invert_gradients(net, grads, tuple(x01.shape), labels, steps=settings.steps,
                                     seed=int(torch.randint(1 << 30, (), generator=g)), device=device)
                    for _ in range(max(1, settings.restarts))]
            inverted = min(runs, key=lambda run: run.loss)
            truth_loss = gradient_matching_loss(net, grads, x01, labels)
            model.load_state_dict(saved)
            recon = inverted.images.detach().cpu()
            guess_of = best_uninformed_guess(public.images[victim.domain], g)
            truth = x01.cpu()
            row: dict[str, torch.Tensor] = {}
            for name, images, ssim_images in (("recon", recon, recon), ("guess", guess_of.batch("psnr", len(pick)),
                                                                         guess_of.batch("ssim", len(pick)))):
                p, idx = best_match(images, truth, psnr)
                s, _ = best_match(ssim_images, truth, ssim)
                model.eval()
                row[f"{name}_psnr"], row[f"{name}_ssim"] = p.double().clamp(max=PSNR_CAP), s.double()
                row[f"{name}_accuracy"] = (classify(images) == y.cpu()[idx]).double()
                model.train()
                if name == "recon":
                    result.examples += list(zip(truth[idx].unbind(0), recon.unbind(0)))
            result.guess = f"{guess_of.names['psnr']} of the domain, matched to its best image of the batch"
            accuracy = float((labels.cpu().sort().values == y.cpu().sort().values).float().mean())
            rows.append({"rows": row, "attack": "inversion", "guess": result.guess,
                         "scores": {"label_accuracy": accuracy, "recon_loss": inverted.loss, "truth_loss": truth_loss,
                                    "initial_loss": inverted.initial_loss}})
    finally:
        model.load_state_dict(saved)
        model.eval()
    result.scores = summarise_reconstructions(rows, settings.seed)
    del result.scores["retrieval_share"]
    result.examples = result.examples[: settings.candidates]
    return result
