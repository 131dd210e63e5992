"""FedDG-FFT: FedDG's amplitude exchange as a data-augmentation baseline (Liu et al., CVPR'21, Section 3.2).

Setup exchange, before round 0, through the ``fft`` style backend:

1. each client uploads the amplitude spectra of ``bank_size`` of its images, drawn with the seed
   (FedDG's distributed amplitude bank; default one eighth of the client's images, as FedDG's code);
2. the server concatenates them and broadcasts the bank to every client;
3. every client keeps each image and adds ``copies`` copies of it whose centred low-frequency
   amplitude band (half-width ``band`` of the side, FedDG's L) is interpolated towards an amplitude
   of another client — client uniformly among the others, spectrum uniformly in its bank —, with
   the phase kept and the ratio lam ~ U(0, 1) drawn per copy (FedDG's continuous frequency-space
   interpolation). The copies are generated once into the tensor cache
   (``cache_dir()/feddg_fft/<key>``), not on the fly per batch; the data grows to d x (1 + copies).

Training is then FedAvg on the augmented data (local options compose as for every method).

NOT implemented: FedDG's episodic learning in continuous frequency space (the meta-learning inner
and outer updates and the boundary-oriented contrastive loss of its segmentation setting). This is
the "amplitude exchange alone", which CCST's appendix E compares in its own framework and which
the CCST and StableFDG tables list as "FedDG".

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/feddg_fft.md.
"""

from __future__ import annotations

import math

import torch

from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.style_exchange import StyleExchange
from fedstyle.errors import ConfigError
from fedstyle.seeding import derive_seed
from fedstyle.style.transfer.augment import AugmentPlan, StyleBank
from fedstyle.style.transfer.fft import DEFAULT_BAND

#: FedDG's code keeps a random eighth of each client's amplitude spectra in the shared bank
BANK_FRACTION = 8


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
    """FedDG's amplitude exchange across clients without its episodic meta-learning (docs/methods/feddg_fft.md)."""

    name = "feddg_fft"
    label = "FedDG-FFT"
    summary = ("FedDG's amplitude exchange only (NO episodic meta-learning): clients share amplitude spectra, "
               "each image gets copies with low-frequency amplitude interpolated to another client's, then FedAvg")
    paper = "Liu et al., FedDG: Federated domain generalization on medical image segmentation via episodic " \
            "learning in continuous frequency space, CVPR 2021"
    HPARAMS = (
        HParam("bank_size", 0, "amplitude spectra each client uploads (0: ceil(d/8), as FedDG's code)", low=0),
        HParam("copies", 1, "amplitude-exchanged copies added per image", low=1),
        HParam("band", DEFAULT_BAND, "half-width of the exchanged low-frequency square, fraction of the side "
               "(FedDG's L)", low=0.0, high=1.0),
    )

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

        return self.augment(ctx, broadcast, plan_for, 1.0, {"copies": copies})
