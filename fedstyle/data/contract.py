"""The one dataset contract of fedstyle: multi-domain image classification.

Every dataset (built-in, named benchmark or user folder) is a :class:`DomainDataset`: named
domains sharing one class list, and per domain a uint8 image tensor (N x 3 x H x W, decoded once
and cached on disk, memory-mapped) with int64 labels. Partitions and protocols address samples
as ``(domain, index)`` pairs, so no image is ever copied per client.

A dataset may carry its *official splits* (the lists its authors publish: PACS's k-fold files,
DomainNet's train/test lists, Camelyon17-WILDS's metadata): per domain, index tensors named
``train``, ``val`` and ``test``. They are not part of the decoded cache (they change no pixel);
loaders attach them on every load with :meth:`DomainDataset.with_splits`, and
:func:`fedstyle.partition.make_split` uses them instead of its seeded split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dataclasses

import torch

from fedstyle.errors import ConfigError, DataError


MIN_RESOLUTION = 8
#: names of the official split lists a domain may carry (``test``: the samples a held-out domain is tested on)
SPLIT_NAMES = ("train", "val", "test")


def check_build_options(name: str, resolution: int | None, default: int, per_class: int | None = None) -> int:
    """The resolution to build ``name`` at (``default`` when None), after checking the size options."""
    resolution = default if resolution is None else int(resolution)
    if resolution < MIN_RESOLUTION:
        raise ConfigError(f"{name}: --resolution must be at least {MIN_RESOLUTION} pixels, got {resolution}")
    if per_class is not None and per_class < 1:
        raise ConfigError(f"{name}: per_class must be positive, got {per_class}")
    return resolution


@dataclass
class DomainDataset:
    """Images of several visual domains that share one class list.

    Attributes:
        name: dataset name (for example ``digits4``).
        domains: domain names, in a fixed order.
        classes: class names shared by every domain; label ``k`` means ``classes[k]``.
        images: domain -> uint8 tensor of shape (N, 3, H, W), all domains the same H x W.
        labels: domain -> int64 tensor of shape (N,).
        mean, std: per-channel statistics used to normalise inputs (in [0, 1] units).
        augment: default training augmentation (a name in ``fedstyle.data.transforms.AUGMENTATIONS``).
        info: free-form provenance (recipe, source files, skipped images ...).
        splits: official splits, domain -> {``train``/``val``/``test`` -> sorted int64 indices}; a
            domain without an entry (or without a name) has none, and is split by the protocol's seeded rule.
    """

    name: str
    domains: list[str]
    classes: list[str]
    images: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    augment: str = "crop"
    info: dict = field(default_factory=dict)
    splits: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def resolution(self) -> int:
        return int(self.images[self.domains[0]].shape[-1])

    def size(self, domain: str) -> int:
        return int(self.labels[domain].shape[0])

    def class_counts(self, domain: str) -> torch.Tensor:
        return torch.bincount(self.labels[domain], minlength=self.num_classes)

    def validate(self) -> None:
        """Check the contract; raise :class:`DataError` naming what is wrong."""
        if len(set(self.domains)) != len(self.domains) or not self.domains:
            raise DataError(f"{self.name}: domain names must be unique and non-empty, got {self.domains}")
        shape = None
        for d in self.domains:
            if d not in self.images or d not in self.labels:
                raise DataError(f"{self.name}: domain {d!r} has no images or labels")
            x, y = self.images[d], self.labels[d]
            if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
                raise DataError(f"{self.name}/{d}: images must be uint8 N x 3 x H x W, got {x.dtype} {tuple(x.shape)}")
            if y.dtype != torch.int64 or y.shape != (x.shape[0],):
                raise DataError(f"{self.name}/{d}: labels must be int64 of shape ({x.shape[0]},)")
            if shape is None:
                shape = x.shape[2:]
            elif x.shape[2:] != shape:
                raise DataError(f"{self.name}/{d}: resolution {tuple(x.shape[2:])} differs from {tuple(shape)}")
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(self.classes)):
                raise DataError(f"{self.name}/{d}: labels outside [0, {len(self.classes)})")
        self._validate_splits()

    def _validate_splits(self) -> None:
        for d, lists in self.splits.items():
            if d not in self.domains:
                raise DataError(f"{self.name}: official splits name {d!r}, not a domain ({', '.join(self.domains)})")
            for split_name, index in lists.items():
                if split_name not in SPLIT_NAMES:
                    raise DataError(f"{self.name}/{d}: official split {split_name!r} is not one of "
                                    f"{', '.join(SPLIT_NAMES)}")
                if index.dtype != torch.int64 or index.dim() != 1:
                    raise DataError(f"{self.name}/{d}: official split {split_name!r} must be a 1-d int64 tensor")
                if len(index) and (int(index.min()) < 0 or int(index.max()) >= self.size(d)
                                   or bool((index[1:] <= index[:-1]).any())):
                    raise DataError(f"{self.name}/{d}: official split {split_name!r} must be sorted unique indices "
                                    f"in [0, {self.size(d)})")
            if "train" in lists and "val" in lists and bool(torch.isin(lists["train"], lists["val"]).any()):
                raise DataError(f"{self.name}/{d}: official train and val splits overlap; an image may be in one only")

    def with_splits(self, splits: dict[str, dict[str, torch.Tensor]]) -> "DomainDataset":
        """The same images with ``splits`` as its official splits (checked; images are not copied)."""
        return dataclasses.replace(self, splits={d: dict(lists) for d, lists in splits.items()})

    def subset_per_class(self, per_class: int, seed: int = 0) -> "DomainDataset":
        """At most ``per_class`` images of every class in every domain, a seeded random pick.

        The pick depends on ``seed`` and the dataset only (not on a run's seed), so every run of a
        comparison trains and tests on the same images; it keeps the domains' order of images.
        Used to give a benchmark the size of the papers' (PACS: ~2,000 images per domain) where
        a backbone is too slow on a CPU for all of fashion4's 17,500.
        """
        if int(per_class) < 1:
            raise ConfigError(f"{self.name}: per_class must be at least 1, got {per_class}")
        picks = pick_per_class([self.labels[d] for d in self.domains], self.num_classes, per_class, seed)
        images, labels, kept = {}, {}, {}
        for d, index in zip(self.domains, picks):
            images[d], labels[d], kept[d] = self.images[d][index], self.labels[d][index], index
        info = {**self.info, "per_class": int(per_class), "per_class_seed": int(seed)}
        return DomainDataset(self.name, list(self.domains), list(self.classes), images, labels, self.mean, self.std,
                             self.augment, info, _subset_splits(self.splits, kept))


def pick_per_class(labels: list[torch.Tensor], num_classes: int, per_class: int, seed: int = 0) -> list[torch.Tensor]:
    """The rows :meth:`DomainDataset.subset_per_class` keeps, from the labels of each domain (in the dataset's
    domain order) alone: a loader that knows its labels before decoding decodes only these rows.

    One generator seeded ``seed`` draws, domain by domain and class by class, a permutation of the class's
    members and keeps its first ``per_class``; each domain's rows are returned sorted.
    """
    generator = torch.Generator().manual_seed(int(seed))
    picks = []
    for y in labels:
        y = torch.as_tensor(y)
        keep = []
        for c in range(num_classes):
            members = torch.nonzero(y == c).flatten()
            keep.append(members[torch.randperm(len(members), generator=generator)[: int(per_class)]])
        picks.append(torch.cat(keep).sort().values)
    return picks


def _subset_splits(splits: dict[str, dict[str, torch.Tensor]], kept: dict[str, torch.Tensor]
                   ) -> dict[str, dict[str, torch.Tensor]]:
    """Official splits after keeping the sorted rows ``kept[d]`` of each domain: the kept members, renumbered."""
    out = {}
    for d, lists in splits.items():
        out[d] = {name: torch.searchsorted(kept[d], index[torch.isin(index, kept[d])]) for name, index in lists.items()}
    return out
