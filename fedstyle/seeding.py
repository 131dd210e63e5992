"""Deterministic seeds derived from the run seed and a position (round, client, purpose).

Every random draw of a run comes from a generator seeded by ``derive_seed(seed, ...)`` rather than
from a generator carried across rounds, so a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 63-bit seed that depends on ``seed`` and ``parts`` (strings hashed stably)."""
    words = [int(seed) & 0xFFFFFFFF]
    for part in parts:
        if isinstance(part, str):
            words.extend(part.encode())
            words.append(0x5EED)
        else:
            words.append(int(part) & 0xFFFFFFFF)
    hi, lo = (int(w) for w in np.random.SeedSequence(words).generate_state(2, dtype=np.uint32))
    return ((hi << 32) | lo) & ((1 << 63) - 1)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch's global generators (used for model init and style ops)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def numpy_rng(seed: int, *parts: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *parts))
