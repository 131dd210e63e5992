"""Reconstruct images from shared channel statistics by optimisation ("style inversion").

The receiver of a style knows the statistic that produced it (the model is shared in FedDG) and
searches for images whose statistic matches: the feature-statistics matching of DeepInversion
(Yin et al., CVPR'20, "Dreaming to Distill", which matches BatchNorm means/variances) applied to the
shared per-image (mu, sigma) or set summaries [mean mu, mean sigma, var mu, var sigma] of style-based
FedDG methods, with the total-variation image prior of Mahendran & Vedaldi (CVPR'15) and the
optimisation set-up of Geiping et al. (NeurIPS'20, "Inverting Gradients"): Adam on a box-constrained
image, keep the best iterate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fedstyle.errors import ConfigError

INITS = ("uniform", "gray")


@dataclass
class Inversion:
    """The result of an inversion attack: images (R, C, H, W) in [0, 1] and the best loss seen.

    ``initial_loss`` is the loss of the initial guess, ``history`` the loss at every step (``history[-1]``
    the final one; ``loss`` is the lowest, the one of ``images``).
    """

    images: torch.Tensor
    loss: float
    initial_loss: float = float("nan")
    history: list[float] = field(default_factory=list, repr=False)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation: mean |horizontal difference| + mean |vertical difference|."""
    return (x[..., :, 1:] - x[..., :, :-1]).abs().mean() + (x[..., 1:, :] - x[..., :-1, :]).abs().mean()


def check_shape(shape) -> tuple[int, int, int, int]:
    """The image batch shape (R, C, H, W) as ints, or ConfigError."""
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ConfigError(f"shape must be (R, C, H, W), got {shape!r}") from None
    if len(shape) != 4 or min(shape) < 1:
        raise ConfigError(f"shape must be four positive sizes (R, C, H, W), got {shape}")
    return shape


def initial_latent(shape, init, seed: int, device: torch.device) -> torch.Tensor:
    """Pre-sigmoid parameters of the initial images, drawn on the CPU (the same on every device).

    ``init``: "uniform" (pixels uniform in [0.01, 0.99]), "gray" (0.5 plus noise of 0.01, so that
    the images are not all alike), or a tensor of images (R, C, H, W) in [0, 1] to start from.
    """
    generator = torch.Generator().manual_seed(int(seed))
    if isinstance(init, torch.Tensor):
        if tuple(init.shape) != tuple(shape):
            raise ConfigError(f"init images have shape {tuple(init.shape)} but shape is {tuple(shape)}; "
                              "pass images of the requested shape")
        pixels = init.detach().to("cpu", torch.float32)
    elif init == "uniform":
        pixels = torch.rand(shape, generator=generator)
    elif init == "gray":
        pixels = 0.5 + 0.01 * torch.randn(shape, generator=generator)
    else:
        raise ConfigError(f"unknown init {init!r}; use one of {list(INITS)} or a tensor of images")
    if not torch.isfinite(pixels).all():
        raise ConfigError("init images contain NaN or inf; pass images in [0, 1]")
    return torch.logit(pixels.clamp(0.01, 0.99)).to(device)


def optimise_images(objective: Callable[[torch.Tensor], torch.Tensor], latent: torch.Tensor, *, steps: int,
                    lr: float, signed: bool = False, decay: bool = False) -> Inversion:
    """Adam on ``latent`` (images = sigmoid(latent)) minimising ``objective(images)``; best iterate.

    Gradients are taken with :func:`torch.autograd.grad` w.r.t. the latent only, so no ``.grad`` of
    any model parameter is touched. ``signed``: step on sign(gradient) (Geiping et al.'s choice).
    ``decay``: learning rate x 0.1 at 3/8, 5/8 and 7/8 of the steps (also Geiping et al.'s
    schedule). The loop stops early, keeping the best images so far, if the loss becomes NaN.
    """
    if int(steps) < 0 or not lr > 0:
        raise ConfigError(f"need steps >= 0 and lr > 0, got steps={steps}, lr={lr}")
    latent = latent.detach().clone().requires_grad_(True)
    optimiser = torch.optim.Adam([latent], lr=lr)
    milestones = [int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)] if decay else []
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimiser, milestones=milestones, gamma=0.1)
    best_loss, best_images, history = float("inf"), torch.sigmoid(latent).detach().clone(), []
    for step in range(int(steps) + 1):
        images = torch.sigmoid(latent)
        loss = objective(images)
        value = float(loss.detach())
        if math.isnan(value):  # keep the best images so far
            break
        history.append(value)
        if value < best_loss:
            best_loss, best_images = value, images.detach().clone()
        if step == steps:
            break
        (grad,) = torch.autograd.grad(loss, latent)
        latent.grad = grad.sign() if signed else grad
        optimiser.step()
        scheduler.step()
    first = history[0] if history else float("nan")
    return Inversion(images=best_images, loss=best_loss, initial_loss=first, history=history)


def invert_statistics(statistic: Callable[[torch.Tensor], torch.Tensor], target: torch.Tensor, shape, *,
                      steps: int = 300, lr: float = 0.05, tv_weight: float = 1e-3, seed: int = 0,
                      init="uniform", device=None) -> Inversion:
    """Images whose ``statistic`` matches ``target``: R images (R, C, H, W) in [0, 1].

    Minimises ||statistic(images) - target||^2 / ||target||^2 + tv_weight * TV(images) with Adam on
    sigmoid-parametrised pixels, starting from ``init`` drawn with ``seed``, and returns the images
    of the lowest loss seen (an :class:`Inversion`; ``loss`` is that lowest loss). ``statistic`` is
    any differentiable callable from images to a tensor of ``target``'s shape, e.g. per-image channel
    mean/std of a frozen encoder's features (R, 2C), or a set summary [mean mu, mean sigma, var mu,
    var sigma] over the R images (4, C), or a concatenation of several stages. Runs on ``device``
    (default: the target's); deterministic for a seed on the CPU.
    """
    shape = check_shape(shape)
    if not isinstance(target, torch.Tensor) or target.numel() == 0:
        raise ConfigError("target must be a non-empty tensor (the shared statistic to invert)")
    if not torch.isfinite(target).all():
        raise ConfigError("target contains NaN or inf; invert a finite shared statistic")
    if tv_weight < 0:
        raise ConfigError(f"tv_weight must be >= 0, got {tv_weight}")
    device = torch.device(device) if device is not None else target.device
    target = target.detach().to(device, torch.float32)
    norm = target.pow(2).sum()
    if float(norm) == 0.0:
        raise ConfigError("target is all zeros, so the relative error is undefined; pass the shared statistic")

    def objective(images: torch.Tensor) -> torch.Tensor:
        s = statistic(images)
        if not isinstance(s, torch.Tensor) or s.shape != target.shape:
            got = tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
            raise ConfigError(f"statistic(images of shape {shape}) has shape {got} but target has shape "
                              f"{tuple(target.shape)}; make the statistic and the target agree")
        loss = (s.float() - target).pow(2).sum() / norm
        return loss + tv_weight * total_variation(images) if tv_weight else loss

    return optimise_images(objective, initial_latent(shape, init, seed, device), steps=steps, lr=lr)
