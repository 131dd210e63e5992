"""A client's training data: rows of a shared sample pool, batches as index gathers plus one batched transform.

Every client of a run holds only the *row indices* of its samples in one :class:`SamplePool` (the
run's training images, labels and domain ids, decoded once and shared): a client costs 8 bytes
per sample, so a run of thousands of clients holds the images once, not once per client. A batch
is a gather of its rows from the pool, a device transfer and one batched transform — the same
bytes in the same order as a client that owned a copy of its images.

Optional **aligned views** ride along: named uint8 tensors with one row per sample (row i is a
variant of image i, e.g. PARDON's transfer of image i to the global style). A batch then carries
each view beside the image, cut by the *same* random crop and flip, because the views are
augmented together with the image as extra channels of one batch. Views (and the images a method
puts in with :meth:`ClientData.replace`, CCST's augmented set say) belong to the client.

Images and views may be :class:`fedstyle.data.lazy.LazyImages` (generated rows made when a batch
first reads them): batches read only their rows; ``images`` and the views' ``index_select`` make
what they read.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

import torch

from fedstyle.data.lazy import LazyImages, read_images
from fedstyle.errors import ConfigError


class SamplePool:
    """Samples shared by clients: uint8 images (N, C, H, W), labels (N,) and domain ids (N,).

    :meth:`to` moves the pool to a device once and hands every later caller the same copy, so
    the clients of a run that share a pool on the CPU share one on the accelerator too.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, domains: torch.Tensor):
        if len(images) != len(labels) or len(labels) != len(domains):
            raise ConfigError("client images, labels and domains must have the same length")
        self.images, self.labels, self.domains = images, labels, domains
        self._copies: dict[torch.device, SamplePool] = {images.device: self}

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def device(self) -> torch.device:
        return self.images.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.images, self.labels, self.domains))

    def to(self, device: torch.device | str) -> "SamplePool":
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        copy = self._copies.get(device)
        if copy is None:
            copy = SamplePool(self.images.to(device), self.labels.to(device), self.domains.to(device))
            copy._copies = self._copies  # every copy knows the others
            self._copies[device] = copy
        return copy


class ClientData:
    """A client's training samples plus a batched transform.

    ``ClientData(images, labels, domains, transform)`` owns its samples; :meth:`from_pool` makes a
    client of rows of a shared :class:`SamplePool` (what a run builds: no per-client image copy).
    Either way ``images``, ``labels`` and ``domains`` are the client's samples in order — for a
    pool client they are gathered when read (a copy; keep it only as long as needed) — and
    batches are index gathers, a device transfer and one batched transform (no DataLoader, no
    decoding).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, domains: torch.Tensor, transform: Callable,
                 views: Mapping[str, torch.Tensor] | None = None):
        self._pool = SamplePool(images, labels, domains)
        self._rows: torch.Tensor | None = None  # None: every row of the pool, in order
        self.transform = transform
        self.views: dict[str, torch.Tensor] = {}
        for name, view in (views or {}).items():
            self.set_view(name, view)

    @classmethod
    def from_pool(cls, pool: SamplePool, rows: torch.Tensor, transform: Callable) -> "ClientData":
        """The client holding rows ``rows`` (int64 indices, repeats allowed) of ``pool``."""
        if rows.dim() != 1 or rows.dtype != torch.long:
            raise ConfigError(f"client rows must be a 1-D int64 tensor, got {rows.dtype} {tuple(rows.shape)}")
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= len(pool)):
            raise ConfigError(f"client rows must lie in [0, {len(pool)}) (the pool's samples)")
        data = cls.__new__(cls)
        data._pool, data._rows = pool, rows.to(pool.device)
        data.transform, data.views = transform, {}
        return data

    @property
    def pool(self) -> SamplePool:
        return self._pool

    @property
    def rows(self) -> torch.Tensor | None:
        """The client's rows of :attr:`pool` (None when the client owns the whole pool)."""
        return self._rows

    def _take(self, tensor: torch.Tensor) -> torch.Tensor:
        return read_images(tensor, self._rows)  # a LazyImages store makes the rows it lacks

    @property
    def images(self) -> torch.Tensor:
        return self._take(self._pool.images)

    @property
    def labels(self) -> torch.Tensor:
        return self._take(self._pool.labels)

    @property
    def domains(self) -> torch.Tensor:
        return self._take(self._pool.domains)

    def __len__(self) -> int:
        return len(self._pool) if self._rows is None else int(self._rows.shape[0])

    def take(self, positions: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Images and labels of the client's samples at ``positions`` (a slice, or int64 positions in
        ``0 .. len(self) - 1``), on the pool's device. Only those rows are gathered: ``images[a:b]`` would
        gather every row of the client first, which made an evaluation pass over a pool client quadratic."""
        if isinstance(positions, slice):
            start, stop, step = positions.indices(len(self))
            positions = torch.arange(start, stop, step, device=self._pool.device)
        positions = positions.to(self._pool.device)
        rows = positions if self._rows is None else self._rows.index_select(0, positions)
        return read_images(self._pool.images, rows), self._pool.labels.index_select(0, rows)

    def to(self, device: torch.device | str) -> "ClientData":
        data = ClientData.__new__(ClientData)
        data._pool = self._pool.to(device)
        data._rows = None if self._rows is None else self._rows.to(device)
        data.transform = self.transform
        data.views = {k: v.to(device) for k, v in self.views.items()}
        return data

    # -- aligned views ------------------------------------------------------------------
    def set_view(self, name: str, images: torch.Tensor | LazyImages) -> None:
        """Attach ``images`` (uint8, one row per sample, same H x W) as the aligned view ``name``."""
        if images.dim() != 4 or images.dtype != torch.uint8 or len(images) != len(self):
            raise ConfigError(f"view {name!r} must be uint8 (N, C, H, W) with N = {len(self)} rows, got "
                              f"{images.dtype} {tuple(images.shape)}")
        size = tuple(self._pool.images.shape[-2:])
        if tuple(images.shape[-2:]) != size:
            raise ConfigError(f"view {name!r} is {tuple(images.shape[-2:])} but the images are "
                              f"{size}; aligned views share the image size")
        device = self._pool.device
        self.views[name] = images if images.device == device else images.to(device)

    def replace(self, images: torch.Tensor | LazyImages, source: torch.Tensor) -> None:
        """Make the samples ``images`` with the labels, domains and views of rows ``source`` (in place:
        the runtime keeps this object across rounds). CCST's augmented set, for example. The client
        then owns its samples (they leave the shared pool)."""
        if len(images) != len(source):
            raise ConfigError(f"{len(images)} new images for {len(source)} source indices")
        device = self._pool.device
        source = source.to(device)
        labels, domains = self.labels.index_select(0, source), self.domains.index_select(0, source)
        self.views = {k: v.index_select(0, source) for k, v in self.views.items()}
        self._pool = SamplePool(images if device.type == "cpu" else images.to(device), labels, domains)
        self._rows = None

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
        pool = self._pool
        done = 0
        while done < steps:
            order = torch.randperm(n, generator=generator)
            for b in range(per_epoch):
                if done == steps:
                    return
                idx = order[b * batch_size : (b + 1) * batch_size].to(pool.device)  # the client's positions
                rows = idx if self._rows is None else self._rows.index_select(0, idx)  # the pool's rows
                x = pool.images.index_select(0, rows).to(device, non_blocking=True)
                y = pool.labels.index_select(0, rows).to(device, non_blocking=True)
                d = pool.domains.index_select(0, rows).to(device, non_blocking=True)
                if views:
                    names = sorted(self.views)
                    parts = [self.views[k].index_select(0, idx).to(device, non_blocking=True) for k in names]
                    x, *outs = self.transform.aligned([x, *parts], train=True, generator=generator)
                    yield x, y, d, dict(zip(names, outs))
                else:
                    yield self.transform(x, train=True, generator=generator), y, d
                done += 1
