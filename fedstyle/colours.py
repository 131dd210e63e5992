"""One colour per method, the same in every figure fedstyle draws (reports, leaderboard, audit).

A figure that colours its lines by row order gives a method a different colour in each figure; readers then
match lines by legend every time. :func:`colour_for` maps a method's registry name, or a row label that names
one ("FedAvg", "CCST"), to a fixed colour; any other label ("CCST + MixStyle", "FedAvg (FixBN)") gets a colour
from a stable hash of its normalised text, so it too keeps its colour across figures and runs.
"""

from __future__ import annotations

import hashlib
import re

#: matplotlib's tab20 and tab20b hex colours: 40 distinct entries, readable on white
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
    "#393b79", "#5254a3", "#6b6ecf", "#9c9ede", "#637939", "#8ca252", "#b5cf6b", "#cedb9c", "#8c6d31", "#bd9e39",
    "#e7ba52", "#e7cb94", "#843c39", "#ad494a", "#d6616b", "#e7969c", "#7b4173", "#a55194", "#ce6dbd", "#de9ed6",
)

#: the registered methods, each pinned to one palette entry (FedAvg, the reference row, is always blue)
METHOD_COLOURS = {
    "fedavg": PALETTE[0], "ccst": PALETTE[1], "stablefdg": PALETTE[2], "pardon": PALETTE[3],
    "fedgca": PALETTE[4], "styleddg": PALETTE[5], "mixstyle": PALETTE[6], "dsu": PALETTE[7],
    "fedprox": PALETTE[8], "fedbn": PALETTE[9], "feddyn": PALETTE[10], "feddg_fft": PALETTE[11],
    "fedgma": PALETTE[12], "feddg_ga": PALETTE[13], "fedsr": PALETTE[14], "fedsam": PALETTE[15],
    "moon": PALETTE[16], "dsgd": PALETTE[20], "fediir": PALETTE[21], "fedomg": PALETTE[22],
    "gperxan": PALETTE[24], "fedccrl": PALETTE[25], "fedadg": PALETTE[28], "fpl": PALETTE[29],
    "jigen": PALETTE[32], "rsc": PALETTE[33],
}


def normalised(name: str) -> str:
    """Lower case, only letters and digits: "FedDG-FFT", "feddg_fft" and "FedDG FFT" are one key."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY = {normalised(method): colour for method, colour in METHOD_COLOURS.items()}


def colour_for(name: str) -> str:
    """The fixed hex colour of a method name or row label (see the module docstring)."""
    key = normalised(name)
    if key in _BY_KEY:
        return _BY_KEY[key]
    # md5 only for a stable, process-independent index (Python's hash() is salted per process)
    digest = int(hashlib.md5(key.encode()).hexdigest(), 16)
    return PALETTE[digest % len(PALETTE)]
