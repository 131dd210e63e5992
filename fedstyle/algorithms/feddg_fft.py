"""FedDG-FFT: FedDG's amplitude exchange (Liu et al., CVPR'21, Section 3.2), and its episodic learning (3.3).

Setup exchange, before round 0, through the ``fft`` style backend: each client uploads the amplitude
spectra of ``bank_size`` of its images (FedDG's distributed bank; default one eighth, as its code); the
server broadcasts the bank; every client makes ``copies`` copies of each image whose centred low-frequency
amplitude band (half-width ``band``, FedDG's L) is interpolated towards an amplitude of another client,
phase kept, lam ~ U(0, 1) per copy. The copies are made once into the tensor cache.

Default: FedAvg on the images and their copies, the "amplitude exchange alone" of CCST's appendix E.
``episodic=true``: each image's copy x' is its aligned view, and every batch's loss is

    L_inner(w) + L_outer(w'),  w' = w - beta * clamp(grad_w L_inner(w), -c, c)

(cross-entropy on x, meta-train; of the adapted model on x', meta-test). ``meta_order=second``
differentiates through the inner step, as the objective is written; ``first`` treats the inner gradient
as a constant, as the code (``reference_code=true``). NOT implemented: the boundary-oriented contrastive
term of L_outer, which needs segmentation masks.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/feddg_fft.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedstyle.algorithms.base import apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.style_exchange import StyleExchange
from fedstyle.errors import ConfigError
from fedstyle.seeding import derive_seed
from fedstyle.style.transfer.augment import AugmentPlan, StyleBank
from fedstyle.style.transfer.fft import DEFAULT_BAND

#: FedDG's code keeps a random eighth of each client's amplitude spectra in the shared bank
BANK_FRACTION = 8
#: the aligned view holding each image's amplitude-exchanged copy (episodic=true)
VIEW = "feddg_copy"
_COPIES = "feddg/copies"  # ctx.scratch: the current batch's x', from training_batches to training_loss
#: how the outer loss reaches theta through theta' = theta - beta * g (episodic=true)
META_ORDERS = ("second", "first")
#: reference_code=true: the authors' code's choices for the hyperparameters not given explicitly
REFERENCE = {"meta_order": "first"}


def plan_amplitude_exchange(num_images: int, bank: StyleBank, own: int, copies: int, seed: int) -> AugmentPlan:
    """Each image, then ``copies`` copies restyled to a random amplitude of a random other client, lam ~ U(0, 1)."""
    ids, first, counts = bank.blocks()
    others = (ids != own).nonzero().flatten()
    if len(others) == 0:
        raise ConfigError(
            f"amplitude exchange needs another client's spectra, but the bank only holds client {own}'s; "
            "use at least two source clients"
        )
    g = torch.Generator().manual_seed(seed)
    pick = others[torch.randint(len(others), (num_images, copies), generator=g)]
    u = torch.rand(num_images, copies, generator=g)
    rows = first[pick] + (u * counts[pick]).long().clamp_max(counts[pick] - 1)
    ratio = torch.rand(num_images, copies, generator=g)
    keep = torch.full((num_images, 1), -1, dtype=torch.long)
    style_row = torch.cat([keep, rows], dim=1).reshape(-1)
    ratio = torch.cat([torch.zeros(num_images, 1), ratio], dim=1).reshape(-1)
    return AugmentPlan(torch.arange(num_images).repeat_interleave(1 + copies), style_row, ratio)


@register_method
class FedDGFFT(StyleExchange):
    """FedDG's amplitude exchange across clients; its episodic meta-learning with ``episodic=true``
    (docs/methods/feddg_fft.md)."""

    name = "feddg_fft"
    family = "style-sharing"
    shares = "weights; once, images' amplitude spectra"
    label = "FedDG-FFT"
    summary = ("FedDG's amplitude exchange: clients share amplitude spectra, each image gets copies with "
               "low-frequency amplitude interpolated to another client's, then FedAvg (episodic=true: FedDG's "
               "meta-train / meta-test episodes on each image and its copy)")
    GATED_STEP_HOOKS = {"training_loss": "episodic"}  # plain mode: FedAvg's step, batchable
    paper = "Liu et al., FedDG: Federated domain generalization on medical image segmentation via episodic " \
            "learning in continuous frequency space, CVPR 2021"
    HPARAMS = (
        HParam("bank_size", 0, "amplitude spectra each client uploads (0: ceil(d/8), as FedDG's code)", low=0),
        HParam("copies", 1, "amplitude-exchanged copies added per image", low=1),
        HParam("band", DEFAULT_BAND, "half-width of the exchanged low-frequency square, fraction of the side "
               "(FedDG's L)", low=0.0, high=1.0),
        HParam("episodic", False, "FedDG's episodic learning (Sec. 3.3): each image's copy is its meta-test view, "
               "loss L(x; w) + L(x'; w - meta_step * clip(grad L(x; w))); false: the copies are extra data"),
        HParam("meta_step", 1e-3, "episodic: the inner step size beta (the code's meta_step_size)", low=0.0),
        HParam("meta_clip", 100.0, "episodic: the inner gradient clamped to [-c, c] (the code's clip_value; 0: none)",
               low=0.0),
        HParam("meta_order", "second", "episodic: second = differentiate through the inner step (the objective as "
               "written); first = the inner gradient as a constant (the code)", choices=META_ORDERS),
        HParam("reference_code", False, "the authors' code's choices: meta_order=first"),
    )

    @classmethod
    def resolve(cls, given):
        hp = apply_reference_code(super().resolve(given), given, REFERENCE)
        if hp["episodic"] and hp["copies"] != 1:
            raise ConfigError(f"feddg_fft episodic=true pairs each image with one copy, got copies={hp['copies']}; "
                              "drop copies")
        if hp["episodic"] and hp["augment"] != "none":
            raise ConfigError(f"feddg_fft episodic=true trains on each image and its copy as they are; "
                              f"augment={hp['augment']!r} would transform one and not the other: drop augment")
        return hp

    def backend_name(self) -> str:
        return "fft"

    def backend_options(self) -> dict:
        return {"band": self.hp["band"]}

    def setup_upload(self, ctx, model):
        count = self.hp["bank_size"] or math.ceil(len(ctx.data) / BANK_FRACTION)
        return self.upload_style(ctx, "single", count, "feddg-bank")

    def setup_download(self, ctx, model, broadcast):
        seed, n, copies = derive_seed(ctx.seed, "feddg-plan"), len(ctx.data), self.hp["copies"]

        def plan_for(bank):
            return plan_amplitude_exchange(n, bank, own=ctx.client_id, copies=copies, seed=seed)

        if not self.hp["episodic"]:
            return self.augment(ctx, broadcast, plan_for, 1.0, {"copies": copies})

        def copies_only(bank):  # the same draws: each copy is the one the plain mode adds after its image
            plan = plan_for(bank)
            made = plan.style_row >= 0
            return AugmentPlan(plan.source[made], plan.style_row[made], plan.ratio[made])

        return self.attach_planned_view(ctx, VIEW, broadcast, copies_only, 1.0, {"copies": copies, "view": True})

    # -- episodic learning (episodic=true) ----------------------------------------------
    def training_batches(self, ctx):
        """Plain mode: the base batches. Episodic: each batch x, its copies x' (same crop and flip) set aside
        for :meth:`training_loss`."""
        if not self.hp["episodic"]:
            yield from super().training_batches(ctx)
            return
        for x, y, _, views in ctx.batches(views=True):
            ctx.scratch[_COPIES] = views[VIEW]
            yield x, y
        ctx.scratch.pop(_COPIES, None)

    def training_loss(self, ctx, model, x, y, payload):
        if not self.hp["episodic"]:
            return super().training_loss(ctx, model, x, y, payload)
        return self.episodic_loss(ctx, model, x, ctx.scratch[_COPIES], y)

    def episodic_loss(self, ctx, model, x: torch.Tensor, x_copy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """FedDG's meta-train / meta-test objective on one batch (Sec. 3.3; see the module docstring):
        L_inner(w) + L_outer(w'), w' = w - beta * clamp(grad L_inner(w), -c, c), each term logged."""
        hp = self.hp
        inner = F.cross_entropy(model(x), y)
        names, weights = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
        # retain_graph: the returned loss backpropagates through L_inner again
        grads = torch.autograd.grad(inner, weights, create_graph=hp["meta_order"] == "second", retain_graph=True,
                                    allow_unused=True)
        adapted = {}
        for name, w, g in zip(names, weights, grads):
            if g is None:  # a weight the loss does not reach (an unused head): it stays as it is
                adapted[name] = w
                continue
            if hp["meta_clip"] > 0:
                g = g.clamp(-hp["meta_clip"], hp["meta_clip"])
            adapted[name] = w - hp["meta_step"] * g
        outer = F.cross_entropy(functional_call(model, adapted, (x_copy,), strict=False), y)
        ctx.log("inner", inner)
        ctx.log("outer", outer)
        return inner + outer
