"""BatchNorm helpers: normalise with a batch's own statistics without touching the running ones."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

BATCHNORM_TYPES = (nn.modules.batchnorm._BatchNorm,)


@contextmanager
def batch_statistics(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every BatchNorm layer of ``model`` normalises with the current batch's mean and
    variance — the features a training forward computes — while its running statistics and its
    ``num_batches_tracked`` counter stay exactly as they were (no side effect on the model's state).
    Every other module keeps its mode (style ops inserted for training, dropout stay off in eval).

    Implemented by switching each BatchNorm layer to training with ``track_running_stats=False`` (then
    PyTorch passes no running buffers to ``batch_norm`` and skips the counter) and restoring both after.
    """
    saved = [(m, m.training, m.track_running_stats) for m in model.modules() if isinstance(m, BATCHNORM_TYPES)]
    try:
        for m, _, _ in saved:
            m.training = True
            m.track_running_stats = False
        yield model
    finally:
        for m, training, track in saved:
            m.training = training
            m.track_running_stats = track
