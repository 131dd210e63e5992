"""A labelled PNG grid of a dataset: one row per domain, one column per class."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import ConfigError
from fedstyle.figures import save_figure


def cell_image(images: np.ndarray, per_cell: int) -> np.ndarray:
    """Tile up to ``per_cell`` uint8 (3, H, W) images side by side (H, per_cell * W + gaps, 3)."""
    height, width = images.shape[-2:]
    gap = 1
    tile = np.full((height, per_cell * width + (per_cell - 1) * gap, 3), 255, dtype=np.uint8)
    for slot, image in enumerate(images):
        left = slot * (width + gap)
        tile[:, left : left + width] = image.transpose(1, 2, 0)
    return tile


def save_grid(
    dataset: DomainDataset,
    path: str | os.PathLike,
    per_cell: int = 1,
    seed: int = 0,
    max_classes: int | None = 30,
) -> Path:
    """Write a PNG with a row per domain and a column per class, ``per_cell`` random samples each.

    Only the first ``max_classes`` classes are drawn (the title says so) to keep 345-class
    datasets legible. The file is written under a temporary name and renamed, so it is never
    half-written. Returns the path.
    """
    # A bare Figure renders with Agg and leaves pyplot's global backend alone.
    from matplotlib.figure import Figure

    if per_cell < 1:
        raise ConfigError(f"per_cell must be at least 1, got {per_cell}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    classes = dataset.classes if max_classes is None else dataset.classes[:max_classes]
    rows, cols = len(dataset.domains), len(classes)
    figure = Figure(figsize=(1.0 + 0.9 * cols * per_cell ** 0.5, 0.6 + 1.0 * rows), dpi=100)
    axes = figure.subplots(rows, cols, squeeze=False)
    blank = np.full((dataset.resolution, dataset.resolution * per_cell, 3), 255, dtype=np.uint8)
    for row, domain in enumerate(dataset.domains):
        labels = dataset.labels[domain].numpy()
        for col, class_name in enumerate(classes):
            members = np.flatnonzero(labels == col)
            chosen = np.sort(rng.choice(members, size=min(per_cell, len(members)), replace=False))
            tile = cell_image(dataset.images[domain][chosen].numpy(), per_cell) if len(chosen) else blank
            ax = axes[row, col]
            ax.imshow(tile, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(class_name, fontsize=8)
            if col == 0:
                ax.set_ylabel(domain, fontsize=9)
    title = dataset.name
    if len(classes) < dataset.num_classes:
        title += f" (first {len(classes)} of {dataset.num_classes} classes)"
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return save_figure(figure, path, dpi=100)  # and the PDF beside it
