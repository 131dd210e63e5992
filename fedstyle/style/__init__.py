"""Feature-level style operations, inserted after backbone stages with ``Backbone.insert_op``.

``STYLE_OPS`` maps a name to a constructor taking the firing probability ``p`` (and the op's
other hyperparameters as keywords), e.g. ``STYLE_OPS.get("mixstyle")(p=0.5)``.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from fedstyle.registry import Registry
from fedstyle.style.dsu import DSU
from fedstyle.style.mixstyle import MixStyle
from fedstyle.style.oversample import balanced_extra_counts, oversample_indices
from fedstyle.style.selection import kmeans_pp_seeds, lloyd_step, select_by_kmeans
from fedstyle.style.shift import (
    StyleAccumulator,
    StyleSummary,
    batch_style,
    explore,
    explore_styles,
    sample_styles,
    shift_to_style,
    summarize_styles,
)
from fedstyle.style.stats import adain, channel_stats, restyle

STYLE_OPS: Registry[Callable[..., nn.Module]] = Registry("style op")
STYLE_OPS.add("mixstyle", MixStyle)
STYLE_OPS.add("dsu", DSU)

__all__ = ["DSU", "MixStyle", "STYLE_OPS", "StyleAccumulator", "StyleSummary", "adain", "balanced_extra_counts",
           "batch_style", "channel_stats", "explore", "explore_styles", "kmeans_pp_seeds", "lloyd_step",
           "oversample_indices", "restyle", "sample_styles", "select_by_kmeans", "shift_to_style", "summarize_styles"]
