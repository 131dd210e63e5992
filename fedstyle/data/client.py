"""A client's training data: uint8 tensors decoded once, batches as index gathers plus one batched transform.

Optional **aligned views** ride along: named uint8 tensors with one row per sample (row i is a
variant of image i, e.g. PARDON's transfer of image i to the global style). A batch then carries
each view beside the image, cut by the *same* random crop and flip, because the views are
augmented together with the image as extra channels of one batch.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

import torch

from fedstyle.errors import ConfigError


class ClientData:
    """A client's training samples as uint8 tensors plus a batched transform.

    Images are gathered once from the dataset cache when the client is created; batches are
    index gathers, a device transfer and one batched transform (no DataLoader, no decoding).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, domains: torch.Tensor, transform: Callable,
                 views: Mapping[str, torch.Tensor] | None = None):
        if len(images) != len(labels) or len(labels) != len(domains):
            raise ConfigError("client images, labels and domains must have the same length")
        self.images = images
        self.labels = labels
        self.domains = domains
        self.transform = transform
        self.views: dict[str, torch.Tensor] = {}
        for name, view in (views or {}).items():
            self.set_view(name, view)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str) -> "ClientData":
        return ClientData(self.images.to(device), self.labels.to(device), self.domains.to(device), self.transform,
                          {k: v.to(device) for k, v in self.views.items()})

    # -- aligned views ------------------------------------------------------------------
    def set_view(self, name: str, images: torch.Tensor) -> None:
        """Attach ``images`` (uint8, one row per sample, same H x W) as the aligned view ``name``."""
        if images.dim() != 4 or images.dtype != torch.uint8 or len(images) != len(self):
            raise ConfigError(f"view {name!r} must be uint8 (N, C, H, W) with N = {len(self)} rows, got "
                              f"{images.dtype} {tuple(images.shape)}")
        if images.shape[-2:] != self.images.shape[-2:]:
            raise ConfigError(f"view {name!r} is {tuple(images.shape[-2:])} but the images are "
                              f"{tuple(self.images.shape[-2:])}; aligned views share the image size")
        self.views[name] = images if images.device == self.images.device else images.to(self.images.device)

    def replace(self, images: torch.Tensor, source: torch.Tensor) -> None:
        """Make the samples ``images`` with the labels, domains and views of rows ``source`` (in place:
        the runtime keeps this object across rounds). CCST's augmented set, for example."""
        if len(images) != len(source):
            raise ConfigError(f"{len(images)} new images for {len(source)} source indices")
        device = self.images.device
        self.labels = self.labels[source.to(self.labels.device)]
        self.domains = self.domains[source.to(self.domains.device)]
        self.views = {k: v[source.to(v.device)] for k, v in self.views.items()}
        self.images = images if device.type == "cpu" else images.to(device)

    # -- batches ------------------------------------------------------------------------
    def num_batches(self, batch_size: int) -> int:
        n = len(self)
        full, rest = divmod(n, batch_size)
        # a trailing batch of one sample is dropped: BatchNorm cannot train on it
        return full + (1 if rest >= 2 or (rest == 1 and full == 0) else 0)

    def batches(
        self,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
        steps: int,
        views: bool = False,
    ) -> Iterator[tuple]:
        """Yield ``steps`` augmented batches (x float on ``device``, y, domain), reshuffling per epoch.

        With ``views=True`` each batch is ``(x, y, domain, {name: view})``, every view augmented
        exactly as x (the same crop offsets and flips).
        """
        n = len(self)
        if n == 0:
            raise ConfigError("a client has no training samples; choose a partition that leaves no client empty")
        if views and not self.views:
            raise ConfigError("this client has no aligned views; the method must attach them in its setup "
                              "(ClientData.set_view) before training asks for them")
        per_epoch = self.num_batches(batch_size)
        done = 0
        while done < steps:
            order = torch.randperm(n, generator=generator)
            for b in range(per_epoch):
                if done == steps:
                    return
                idx = order[b * batch_size : (b + 1) * batch_size].to(self.images.device)
                x = self.images.index_select(0, idx).to(device, non_blocking=True)
                y = self.labels.index_select(0, idx).to(device, non_blocking=True)
                d = self.domains.index_select(0, idx).to(device, non_blocking=True)
                if views:
                    names = sorted(self.views)
                    parts = [self.views[k].index_select(0, idx).to(device, non_blocking=True) for k in names]
                    x, *outs = self.transform.aligned([x, *parts], train=True, generator=generator)
                    yield x, y, d, dict(zip(names, outs))
                else:
                    yield self.transform(x, train=True, generator=generator), y, d
                done += 1
