"""The learning check's data and budget (not collected: no test_ prefix).

``digits3x``: scikit-learn's 1,797 hand-written 8x8 digits (shipped in the package, so offline),
upsampled to 32x32 with a random shift of up to 3 pixels and drawn in four visual domains, a
disjoint quarter of the digits each: ``ink`` (white on black), ``paper`` (dark on light),
``colour`` (a random ink colour on a random, contrasting background) and ``noise`` (ink over
uniform noise, the held-out target). Ten classes, about 45 images per class and domain: small
enough to train on in seconds, hard enough that a method which does not fit its sources shows it
(a constant guess is 10 %, the ConvNet reaches ~90 % source-validation accuracy in the budget).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

DOMAINS = ("ink", "paper", "colour", "noise")
TARGET = "noise"
SIZE = 32

#: the budget every method gets: 3 source clients (one per domain), all sampled each round
BUDGET = dict(rounds=6, local_steps=15, augment="crop", batch_size=32, lr=0.02, val_fraction=0.2, eval_every=1)


def _masks(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """8x8 digits (0..16) -> 32x32 ink masks in [0, 1], each shifted by up to 3 pixels."""
    x = torch.from_numpy(images / 16.0).float().unsqueeze(1)
    x = F.interpolate(x, size=(24, 24), mode="bilinear", align_corners=False).squeeze(1).numpy()
    out = np.zeros((len(x), SIZE, SIZE), dtype=np.float32)
    offsets = rng.integers(1, 8, size=(len(x), 2))
    for i, (dy, dx) in enumerate(offsets):
        out[i, dy : dy + 24, dx : dx + 24] = x[i]
    return out.clip(0, 1)


def _render(domain: str, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    m = mask[..., None]
    if domain == "ink":
        img = 255 * m * np.ones(3)
    elif domain == "paper":
        img = 235 - 200 * m * np.ones(3)
    elif domain == "colour":
        fg = rng.uniform(0, 255, 3)
        bg = 255 - fg + rng.uniform(-40, 40, 3)  # contrasting background
        img = m * fg + (1 - m) * bg
    else:
        bg = rng.uniform(0, 200, (SIZE, SIZE, 3))
        img = m * 255 + (1 - m) * bg
    return np.clip(img, 0, 255).astype(np.uint8)


def write_digits3x(root: Path, seed: int = 0) -> Path:
    """root/<domain>/<class>/<i>.png (the folder dataset layout)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    masks = _masks(digits.images, rng)
    for d, domain in enumerate(DOMAINS):
        for i in range(d, len(masks), len(DOMAINS)):
            folder = root / domain / str(int(digits.target[i]))
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(_render(domain, masks[i], rng)).save(folder / f"{i}.png")
    return root
