"""Feature-level class-balanced oversampling (StableFDG Section 3.1 step 3, Appendix G).

Given a batch's labels and an oversampling size M, choose M extra samples (indices into the
batch, with repetition) so that the concatenated batch [s, s~] is as class-balanced as possible,
minority classes first. Appendix G's example: class counts a, b, c = 3, 2, 1 and M = 3 add one b
and two c's; M = 1 adds one c; M = 6 adds 1, 2, 3. Only classes present in the batch can be
oversampled (there is no feature of an absent class to copy).

Water filling, batched over classes on the labels' device (no host synchronisation): with the
present classes' counts sorted ascending s_1 <= ... <= s_K, t = the largest number of classes
that M can raise to the level s_t (t s_t - sum_{i<=t} s_i <= M); they are filled to
L = floor((M + sum_{i<=t} s_i) / t), and the remainder goes one each to randomly chosen classes
among those t. The members copied for a class are drawn uniformly with replacement from its
samples in the batch. The extras are ordered minority class first.

:func:`oversample_features` appends the chosen extras to a batch of features (and their labels).
:func:`level_order_indices` is the public StableFDG code's order of the same counts (oma.py:133-155).
"""

from __future__ import annotations

import torch

from fedstyle.errors import ConfigError


def balanced_extra_counts(labels: torch.Tensor, count: int, num_classes: int) -> torch.Tensor:
    """Extra samples per class (num_classes,), summing to ``count`` (see the module docstring)."""
    if count < 0:
        raise ConfigError(f"the oversampling size must be >= 0, got {count}")
    device = labels.device
    have = torch.zeros(num_classes, dtype=torch.long, device=device).index_add_(
        0, labels, torch.ones_like(labels))
    if count == 0 or labels.numel() == 0:
        return torch.zeros_like(have)
    absent = labels.numel() + count + 1  # above any level the fill can reach: never raised
    level_of = torch.where(have > 0, have, torch.full_like(have, absent))
    sorted_counts, order = torch.sort(level_of, stable=True)
    filled = torch.cumsum(sorted_counts, 0)
    ranks = torch.arange(1, num_classes + 1, device=device)
    t = ((ranks * sorted_counts - filled) <= count).sum()  # >= 1: raising one class costs nothing
    total = count + filled.index_select(0, (t - 1).view(1)).squeeze(0)
    level = total // t
    remainder = total - t * level
    inside = ranks <= t
    extra_sorted = torch.where(inside, level - sorted_counts, torch.zeros_like(sorted_counts))
    key = torch.where(inside, torch.rand(num_classes, device=device), torch.full((num_classes,), 2.0, device=device))
    lucky = torch.argsort(torch.argsort(key)) < remainder
    extra_sorted = extra_sorted + lucky.long()
    return torch.zeros_like(have).scatter(0, order, extra_sorted)


def oversample_indices(labels: torch.Tensor, count: int, num_classes: int, balanced: bool = True) -> torch.Tensor:
    """Indices (count,) into the batch of the extra samples: class-balanced, minority class first
    (``balanced=False``: uniform draws with replacement, the random oversampling of Table 12)."""
    n = labels.numel()
    if count == 0:
        return torch.zeros(0, dtype=torch.long, device=labels.device)
    if n == 0:
        raise ConfigError("cannot oversample an empty batch")
    if not balanced:
        return torch.randint(n, (count,), device=labels.device)
    extra = balanced_extra_counts(labels, count, num_classes)
    have = torch.zeros_like(extra).index_add_(0, labels, torch.ones_like(labels))
    # classes in minority-first order (ascending count in the batch, absent classes last)
    order = torch.argsort(torch.where(have > 0, have, torch.full_like(have, n + 1)), stable=True)
    slot_class = torch.repeat_interleave(order, extra.index_select(0, order), output_size=count)
    by_class = torch.argsort(labels, stable=True)  # the batch's indices grouped by class
    start = torch.cumsum(have, 0) - have
    size = have.index_select(0, slot_class)
    pick = (torch.rand(count, device=labels.device) * size).long().clamp_max(size - 1)
    return by_class.index_select(0, start.index_select(0, slot_class) + pick)


def level_order_indices(labels: torch.Tensor, count: int) -> torch.Tensor:
    """The public StableFDG code's class-balanced extras (oma.py:133-155), indices (count,) into the batch.

    Level by level: the classes at the lowest count in the batch all get one extra (in a random order)
    and their count rises by one, until fewer classes sit at the lowest level than extras remain;
    those get one each, chosen at random. Each extra is a uniformly drawn member of its class. The
    counts equal :func:`balanced_extra_counts`' (both fill the lowest classes first); the extras are
    ordered by level, not minority class first. A host loop (the public code's, on the CPU): for
    ``reference_code`` runs only.
    """
    if count < 0:
        raise ConfigError(f"the oversampling size must be >= 0, got {count}")
    if count == 0:
        return torch.zeros(0, dtype=torch.long, device=labels.device)
    if labels.numel() == 0:
        raise ConfigError("cannot oversample an empty batch")
    classes, counts = torch.unique(labels.cpu(), return_counts=True)
    chosen: list[int] = []
    left = count
    while left > 0:
        lowest = (counts == counts.min()).nonzero().flatten()
        order = lowest[torch.randperm(len(lowest))]
        if len(order) >= left:
            chosen += order[:left].tolist()
            break
        chosen += order.tolist()
        counts[lowest] += 1
        left -= len(lowest)
    members = [(labels.cpu() == classes[c]).nonzero().flatten() for c in range(len(classes))]
    picks = [int(members[c][torch.randint(len(members[c]), (1,))]) for c in chosen]
    return torch.tensor(picks, dtype=torch.long, device=labels.device)


def oversample_features(x: torch.Tensor, labels: torch.Tensor, count: int, num_classes: int, balanced: bool = True,
                        indices: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[s, s~] and its labels (StableFDG step 3): ``count`` extra samples of the features ``x``
    (:func:`oversample_indices`, or the given ``indices``) appended right after the batch, their labels
    after ``labels``."""
    idx = oversample_indices(labels, count, num_classes, balanced) if indices is None else indices.to(labels.device)
    extra = x.index_select(0, idx)  # not x[idx]: its backward adds duplicates atomically (not reproducible)
    if x.is_contiguous(memory_format=torch.channels_last):
        extra = extra.contiguous(memory_format=torch.channels_last)  # keep the layout convolutions run fastest in
    return torch.cat([x, extra]), torch.cat([labels, labels.index_select(0, idx)])
