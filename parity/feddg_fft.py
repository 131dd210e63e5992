"""Parity fixture for ``feddg_fft``: FedDG's amplitude spectrum and low-frequency amplitude exchange in
liuquande/FedDG-ELCFS (the ``fft`` style backend, ``fedstyle/style/transfer/fft.py``).

Runs, from a checkout of the authors' repository at ``COMMIT``:

* ``extract_amp_spectrum`` (``freq_space_interpolation_demo.py:15``): the amplitude spectrum of each style
  image (C x H x W, float32 0..255);
* ``freq_space_interpolation`` with ``amp_spectrum_swap`` (``freq_space_interpolation_demo.py:22-59``, the
  continuous interpolation of the paper: the demo calls it with ``ratio = 1 - lam``, ``:115``) for each
  content image and a set of band ratios ``L`` and interpolation weights ``lam``;
* ``source_to_target_freq`` with ``low_freq_mutate_np`` (``dataloaders/fundus_dataloader.py:253-297``,
  what training runs: the whole low-frequency square replaced, lam = 1) on H x W x C content, including
  training's ``L=0`` (``fundus_dataloader.py:56``), which still exchanges the zero-frequency term.

The images are fixed uint8 draws (a content and a style image at each of three sizes: 16 x 16, 12 x 20 and
15 x 17, so even, non-square and odd sides are covered; stored in the fixture). No random draw enters an
output: ``low_freq_mutate_np`` draws an unused ratio from Python's ``random`` (``:267``), seeded here anyway.

The three scripts run code at import (the demo opens its sample images and plots; the dataloader module
imports h5py and scipy internals), so the generator compiles only these functions' definitions from the
authors' files (:func:`parity.common.load_functions`; their code is read from the checkout, never copied) with
numpy and ``random`` as their globals. Nothing needs installing besides the project's environment.

Run: ``.venv/bin/python -m parity.feddg_fft --checkout /tmp/parity/FedDG-ELCFS``.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from parity.common import generate, load_functions

REPOSITORY = "liuquande/FedDG-ELCFS"
COMMIT = "0a281e408a43d5ab4486f213dd286dacc733dd41"
NAME = "feddg_fft"

SIZES = ((16, 16), (12, 20), (15, 17))
#: (L, lam) of the demo's continuous interpolation, per size
INTERPOLATIONS = ((0.1, 1.0), (0.1, 0.35), (0.003, 0.6), (0.25, 0.8))
#: L of training's full exchange (source_to_target_freq), per size
FULL_EXCHANGES = (0.0, 0.1)
SETTINGS = {"sizes": SIZES, "interpolations": INTERPOLATIONS, "full_exchanges": FULL_EXCHANGES, "seed": 0}


def images() -> dict[str, torch.Tensor]:
    """content/<i> and style/<i>: uint8 (3, H, W) per size, smooth-ish so the low band carries the colour."""
    g = torch.Generator().manual_seed(SETTINGS["seed"])
    out = {}
    for i, (h, w) in enumerate(SIZES):
        for kind in ("content", "style"):
            base = torch.rand(3, 1, 1, generator=g) * 160 + 40
            ramp = torch.linspace(-40, 40, w).view(1, 1, w) * torch.rand(3, 1, 1, generator=g)
            noise = torch.randint(-50, 51, (3, h, w), generator=g)
            out[f"{kind}/{i}"] = (base + ramp + noise).clamp(0, 255).round().to(torch.uint8)
    return out


def run(checkout: Path) -> dict[str, torch.Tensor]:
    demo = load_functions(checkout / "freq_space_interpolation_demo.py",
                          ("extract_amp_spectrum", "amp_spectrum_swap", "freq_space_interpolation"), {"np": np})
    train = load_functions(checkout / "dataloaders" / "fundus_dataloader.py",
                           ("low_freq_mutate_np", "source_to_target_freq"), {"np": np, "random": random})
    random.seed(0)
    out = dict(images())
    for i in range(len(SIZES)):
        content = out[f"content/{i}"].numpy().astype(np.float32)  # C x H x W, 0..255 (the demo's layout)
        style = out[f"style/{i}"].numpy().astype(np.float32)
        amp = demo["extract_amp_spectrum"](style)
        out[f"amplitude/{i}"] = torch.from_numpy(amp.astype(np.float32))
        for band, lam in INTERPOLATIONS:
            result = demo["freq_space_interpolation"](content.copy(), amp.copy(), L=band, ratio=1 - lam)
            out[f"interpolated/{i}/{band}/{lam}"] = torch.from_numpy(result.astype(np.float32))
        for band in FULL_EXCHANGES:
            result = train["source_to_target_freq"](content.transpose(1, 2, 0).copy(), amp.copy(), L=band)
            out[f"exchanged/{i}/{band}"] = torch.from_numpy(result.transpose(2, 0, 1).astype(np.float32).copy())
    return out


def main(argv: list[str] | None = None) -> Path:
    return generate(NAME, __doc__, REPOSITORY, COMMIT, run, argv=argv,
                    description="FedDG-ELCFS: amplitude spectra; the demo's continuous low-frequency amplitude "
                                "interpolation and training's full exchange, for fixed images, bands and weights",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
