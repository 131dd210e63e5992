"""The one dataset contract of fedstyle: multi-domain image classification.

Every dataset (built-in, named benchmark or user folder) is a :class:`DomainDataset`: named
domains sharing one class list, and per domain a uint8 image tensor (N x 3 x H x W, decoded once
and cached on disk, memory-mapped) with int64 labels. Partitions and protocols address samples
as ``(domain, index)`` pairs, so no image is ever copied per client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedstyle.errors import ConfigError, DataError


MIN_RESOLUTION = 8


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

    def subset_per_class(self, per_class: int, seed: int = 0) -> "DomainDataset":
        """At most ``per_class`` images of every class in every domain, a seeded random pick.

        The pick depends on ``seed`` and the dataset only (not on a run's seed), so every run of a
        comparison trains and tests on the same images; it keeps the domains' order of images.
        Used to give a benchmark the size of the papers' (PACS: ~2,000 images per domain) where
        a backbone is too slow on a CPU for all of fashion4's 17,500.
        """
        if int(per_class) < 1:
            raise ConfigError(f"{self.name}: per_class must be at least 1, got {per_class}")
        generator = torch.Generator().manual_seed(int(seed))
        images, labels = {}, {}
        for d in self.domains:
            y = self.labels[d]
            keep = []
            for c in range(self.num_classes):
                members = torch.nonzero(y == c).flatten()
                keep.append(members[torch.randperm(len(members), generator=generator)[: int(per_class)]])
            index = torch.cat(keep).sort().values
            images[d], labels[d] = self.images[d][index], y[index]
        info = {**self.info, "per_class": int(per_class), "per_class_seed": int(seed)}
        return DomainDataset(self.name, list(self.domains), list(self.classes), images, labels, self.mean, self.std,
                             self.augment, info)
