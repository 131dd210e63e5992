"""FedSAM (Qu, Li, Duan, Liu, Tang, Lu, ICML'22): FedAvg whose local steps are sharpness-aware (SAM).

One local step at weights w on the mini-batch xi (the paper's local SAM step):

    g     = grad L(w; xi)                                   first forward-backward pass
    eps   = rho · g / (||g||_2 + delta)                     one L2 norm over all parameters jointly
    g_sam = grad L(w + eps; xi)                             second pass, the same mini-batch
    w    <- optimiser step from w (restored) with g_sam      weight decay and momentum act on w

The server is FedAvg (eta_g = 1). MoFedSAM's momentum mixing is not implemented.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fedsam.md.
"""

from __future__ import annotations

import torch
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method

#: delta of eps = rho·g/(||g|| + delta) (the SAM reference implementation's value)
SAM_DELTA = 1e-12


def sam_perturbation(grads: list[torch.Tensor], rho: float, delta: float = SAM_DELTA) -> list[torch.Tensor]:
    """eps = rho · g / (||g||_2 + delta) with ||g|| one norm over every tensor of ``grads`` jointly
    (a device tensor: no host synchronisation)."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return torch._foreach_mul(grads, rho / (norm + delta))


def _running_stats(model: nn.Module) -> list[torch.Tensor]:
    """The BatchNorm buffers a train-mode forward pass updates."""
    out = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats:
            out += [b for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
    return out


@register_method
class FedSAM(Algorithm):
    name = "fedsam"
    family = "FL heterogeneity"
    shares = "weights"
    label = "FedSAM"
    summary = "FedAvg with sharpness-aware local steps (two forward-backward passes per step)"
    paper = "Qu et al., Generalized federated learning via sharpness aware minimization, ICML 2022"
    HPARAMS = (
        HParam("rho", 0.05, "SAM radius: the weight perturbation eps = rho*g/||g|| has L2 norm rho", low=0.0),
        HParam("sam_bn", "first", "BatchNorm running statistics updated by the first pass only (first) "
                                  "or by both passes (both)", choices=("first", "both")),
        HParam("replay_noise", True, "the second pass replays the first pass's random draws (style ops)"),
    )

    def training_step(self, ctx, model, optimizer, x, y, payload):
        replay = _rng_state(ctx.device) if self.hp["replay_noise"] else None
        loss = self.training_loss(ctx, model, x, y, payload)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        with ctx.timed("sam_second_pass"):
            with torch.no_grad():
                saved = [p.detach().clone() for p in params]
                torch._foreach_add_(params, sam_perturbation([p.grad for p in params], self.hp["rho"]))
                stats = _running_stats(model) if self.hp["sam_bn"] == "first" else []
                saved_stats = [b.clone() for b in stats]
            if replay is not None:
                _set_rng_state(ctx.device, replay)
            perturbed = self.training_loss(ctx, model, x, y, payload)
            optimizer.zero_grad(set_to_none=True)
            perturbed.backward()
            with torch.no_grad():
                torch._foreach_copy_(params, saved)  # back to w: the step starts from w
                if stats:
                    torch._foreach_copy_(stats, saved_stats)
        optimizer.step()
        ctx.log("sam_perturbed_loss", perturbed)
        return loss.detach()


def _rng_state(device: torch.device) -> tuple:
    """torch's CPU generator state and, on CUDA, the device's (host-side seed and offset: no sync)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
