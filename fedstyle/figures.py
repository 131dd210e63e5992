"""Saving a matplotlib figure the way every fedstyle figure is saved: a PNG to look at and a PDF to put in a paper.

A PNG at screen resolution blurs when a paper scales it to a column; the PDF beside it keeps the lines and text
as vectors. Both are written atomically (a temporary file renamed into place), so a crash leaves either the old
pair or nothing half-written. Colours come from :mod:`fedstyle.colours`, the same method the same colour in
every figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedstyle.errors import ConfigError
from fedstyle.io import atomic_write

#: dots per inch of the PNG: sharp at a paper's column width (3.3 in) and on a high-density screen
PNG_DPI = 200
#: the smallest y-span of an accuracy axis, in percentage points (see :func:`accuracy_axis`)
MIN_ACCURACY_SPAN = 10.0


def pdf_beside(path: str | Path) -> Path:
    """The PDF written beside a figure's PNG: ``accuracy.png`` -> ``accuracy.pdf``."""
    return Path(path).with_suffix(".pdf")


def save_figure(figure: Any, path: str | Path, *, dpi: int = PNG_DPI, **savefig: Any) -> Path:
    """Write ``figure`` as a PNG to ``path`` and as a PDF beside it; returns ``path``.

    ``savefig`` passes on to matplotlib (``bbox_inches="tight"``, say).
    """
    path = Path(path)
    if path.suffix.lower() == ".pdf":
        raise ConfigError(f"a figure is written as FILE.png with FILE.pdf beside it; name the .png, got {path}")
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=dpi, **savefig))
    atomic_write(pdf_beside(path), lambda tmp: figure.savefig(tmp, format="pdf", **savefig))
    return path


def accuracy_axis(axes, chance: float | None) -> None:
    """Draw the chance line (``chance`` in percent; None: unknown) and set a y-range that holds it and
    spans at least :data:`MIN_ACCURACY_SPAN` points.

    Autoscaled to a curve near chance (8.8-9.8 %), noise reads as a trend; with chance on the axis and
    10 points of span, the same curve reads as flat at chance.
    """
    if chance is not None:
        axes.axhline(chance, color="grey", linestyle=":", linewidth=1, label="chance")
    low, high = axes.dataLim.intervaly
    if not (math.isfinite(low) and math.isfinite(high)):
        low = high = chance if chance is not None else 50.0
    if chance is not None:
        low, high = min(low, chance), max(high, chance)
    pad = max(MIN_ACCURACY_SPAN - (high - low), 0.0) / 2
    low, high = low - pad, high + pad
    if low < 0:
        low, high = 0.0, high - low
    if high > 100:
        low, high = max(low - (high - 100), 0.0), 100.0
    margin = 0.04 * (high - low)
    axes.set_ylim(low - margin, high + margin)
