"""The scale: what a plain FedAvg weight update already leaks (gradient inversion on one local step).

The server of every star method receives each client's weights after local training. After *one*
local SGD step from the global weights w (momentum buffer empty, so the step is lr * (g + wd * w)),
the server knows the batch's gradient exactly: g = (w - w') / lr - wd * w. It then runs Geiping et
al.'s inversion (NeurIPS'20) on that gradient with the labels read off the head's bias gradient
(iDLG). This is the receiver's best case among weight updates — more local steps blur it — so the
report's sentence "styles leak more / less than the weights you already send" compares a style
payload with the most an update can give away.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.audit.gradient_inversion import gradient_from_update, infer_labels, invert_gradients
from fedstyle.audit.metrics import best_match, psnr, ssim
from fedstyle.audit.playbook import AuditSettings, Public, SurfaceResult, Victim, draw_rows


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
    rows: list[dict[str, float]] = []
    device = next(model.parameters()).device
    try:
        model.train()
        for victim in victims[: settings.victims]:
            pick = draw_rows(len(victim.images), batch, g)
            x01 = victim.images[pick].to(device).float().div(255)
            y = victim.labels[pick].to(device)
            grads = observed_gradient(net, x01, y, lr, weight_decay)
            labels = infer_labels(grads[head_bias], len(pick))
            inverted = invert_gradients(net, grads, tuple(x01.shape), labels.to(device), steps=settings.steps,
                                        seed=int(torch.randint(1 << 30, (), generator=g)), device=device)
            model.load_state_dict(saved)
            recon = inverted.images.detach().cpu()
            guess_pool = public.images[victim.domain]
            guess = guess_pool[draw_rows(len(guess_pool), len(pick), g)].float().div(255)
            truth = x01.cpu()
            row: dict[str, float] = {"label_accuracy": float((labels.cpu().sort().values == y.cpu().sort().values)
                                                             .float().mean())}
            for name, images in (("recon", recon), ("guess", guess)):
                p, idx = best_match(images, truth, psnr)
                s, _ = best_match(images, truth, ssim)
                model.eval()
                row[f"{name}_psnr"], row[f"{name}_ssim"] = float(p.mean()), float(s.mean())
                row[f"{name}_accuracy"] = float((classify(images) == y.cpu()[idx]).float().mean())
                model.train()
                if name == "recon":
                    result.examples += list(zip(truth[idx].unbind(0), recon.unbind(0)))
            rows.append(row)
    finally:
        model.load_state_dict(saved)
        model.eval()
    result.scores = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    result.examples = result.examples[: settings.candidates]
    return result
