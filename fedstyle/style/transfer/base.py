"""Image-level style transfer: one interface, several backends (AdaIN, offline default, FFT amplitude).

A :class:`Style` is a batch of N styles as plain tensors plus metadata naming the backend and the
encoder that made them, so styles travel as payloads (no pickle) and styles of different origins
are never mixed silently. A backend computes the style of images, the overall style of a whole
dataset (streamed, never holding all features), and transfers content images to given styles.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable

import torch

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.payload import Payload
from fedstyle.registry import Registry


class StyleMismatchError(FedstyleError):
    """Styles from different backends or encoders, or an empty style bank."""


@dataclass
class Style:
    """N styles (leading dimension N of every tensor) made by ``backend`` with ``encoder``.

    Attributes:
        backend: name of the backend in :data:`TRANSFER_BACKENDS` (``adain``, ``fft``, ...).
        encoder: identifies the encoder and its weights (e.g. ``vgg19_normalised:<hash>``); styles
            are only comparable within one encoder.
        tensors: named tensors, each of shape (N, ...); AdaIN-like backends use ``mean`` and ``std``
            of shape (N, C), the FFT backend ``amplitude`` of shape (N, 3, H, W).
    """

    backend: str
    encoder: str
    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0]) if self.tensors else 0

    def select(self, index: torch.Tensor | list[int] | int) -> "Style":
        """The styles at ``index`` (a leading-dimension index), as a new Style."""
        if isinstance(index, int):
            index = [index]
        idx = torch.as_tensor(index, dtype=torch.long)
        return Style(self.backend, self.encoder, {k: v[idx.to(v.device)] for k, v in self.tensors.items()})

    def to(self, device: torch.device | str) -> "Style":
        return Style(self.backend, self.encoder, {k: v.to(device) for k, v in self.tensors.items()})

    def check_compatible(self, other: "Style") -> None:
        if (self.backend, self.encoder) != (other.backend, other.encoder):
            raise StyleMismatchError(
                f"cannot mix styles made by backend {other.backend!r} / encoder {other.encoder!r} with styles made by "
                f"{self.backend!r} / {self.encoder!r}; compute every style with the same style backend and weights"
            )

    @staticmethod
    def concat(styles: Iterable["Style"]) -> "Style":
        """One bank from several; refuses an empty list and mixed backends or encoders."""
        styles = [s for s in styles]
        if not styles or all(len(s) == 0 for s in styles):
            raise StyleMismatchError("the style bank is empty: no client contributed a style")
        first = styles[0]
        for s in styles[1:]:
            first.check_compatible(s)
        return Style(first.backend, first.encoder, {k: torch.cat([s.tensors[k] for s in styles]) for k in first.tensors})

    # -- payloads -----------------------------------------------------------------------
    def to_payload(self, prefix: str = "style") -> Payload:
        out: Payload = {f"{prefix}/backend": self.backend, f"{prefix}/encoder": self.encoder}
        out.update({f"{prefix}/tensor/{k}": v for k, v in self.tensors.items()})
        return out

    @staticmethod
    def from_payload(payload: Payload, prefix: str = "style") -> "Style":
        try:
            backend, encoder = str(payload[f"{prefix}/backend"]), str(payload[f"{prefix}/encoder"])
        except KeyError:
            raise StyleMismatchError(f"the payload holds no style under {prefix!r}") from None
        head = f"{prefix}/tensor/"
        tensors = {k[len(head):]: v for k, v in payload.items() if k.startswith(head)}
        return Style(backend, encoder, tensors)


def group_sizes(groups: torch.Tensor) -> torch.Tensor:
    """Members per group of the labels ``groups`` (N,) in 0..G-1; every group must be non-empty."""
    groups = torch.as_tensor(groups, dtype=torch.long)
    if groups.dim() != 1 or groups.numel() == 0:
        raise StyleMismatchError(f"group labels must be a non-empty (N,) tensor, got shape {tuple(groups.shape)}")
    counts = torch.bincount(groups)
    if bool((counts == 0).any()) or int(groups.min()) < 0:
        raise StyleMismatchError("group labels must be 0..G-1 with every group non-empty")
    return counts


def group_mean(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Row mean of ``values`` (N, ...) within each group (G, ...), in float64."""
    groups = torch.as_tensor(groups, dtype=torch.long)
    counts = group_sizes(groups).to(values.device, torch.float64)
    sums = torch.zeros((len(counts), *values.shape[1:]), dtype=torch.float64, device=values.device)
    sums.index_add_(0, groups.to(values.device), values.to(torch.float64))
    return sums / counts.view(-1, *([1] * (values.dim() - 1)))


class StyleTransfer(ABC):
    """A style-transfer backend. Images in and out are uint8 (B, 3, H, W) tensors, RGB."""

    name: str = ""
    #: whether the backend can release its styles under clipping and noise (:mod:`fedstyle.style.privacy`):
    #: ``dataset_style(batches, privacy=, generator=)`` and ``private_styles(style, privacy, generator)``
    supports_privacy: bool = False

    @property
    @abstractmethod
    def encoder_id(self) -> str:
        """Identifies the encoder and its weights (goes into every Style this backend makes)."""

    @abstractmethod
    def image_styles(self, images: torch.Tensor) -> Style:
        """The style of each image: a Style with N = B."""

    @abstractmethod
    def dataset_style(self, batches: Iterable[torch.Tensor]) -> Style:
        """The overall style of all images of all batches (N = 1), accumulated in a streaming way."""

    @abstractmethod
    def transfer(self, content: torch.Tensor, style: Style, alpha: float = 1.0) -> torch.Tensor:
        """Restyle ``content`` (B images) to ``style`` (N = B, one style per image, or N = 1 for all)."""

    def pool_styles(self, style: Style, groups: torch.Tensor) -> Style:
        """The dataset style of each group of images from their per-image styles.

        ``style`` holds N per-image styles (from :meth:`image_styles`, images of one size) and
        ``groups`` (N,) labels 0..G-1; the result holds G styles, style g equal to
        :meth:`dataset_style` over the images of group g (PARDON Eq. 2: a cluster's style over all
        pixels of its members) without encoding the images again. Backends that cannot pool raise
        NotImplementedError; callers then compute :meth:`dataset_style` per group.
        """
        raise NotImplementedError(f"the {self.name!r} backend cannot pool per-image styles")

    def check(self, style: Style) -> None:
        if (style.backend, style.encoder) != (self.name, self.encoder_id):
            raise StyleMismatchError(
                f"this {self.name!r} backend (encoder {self.encoder_id!r}) cannot use a style made by backend "
                f"{style.backend!r} / encoder {style.encoder!r}; compute the styles with the same backend and weights"
            )


#: name -> factory(**options) returning a StyleTransfer
TRANSFER_BACKENDS: Registry = Registry("style backend")


def check_private_backend(backend: str | StyleTransfer) -> None:
    """Refuse the style privacy defence (dp_clip / dp_noise) for a backend (a registered name or a backend)
    that does not support it (the ``fft`` backend's amplitude spectra are refused, not clipped)."""
    found = TRANSFER_BACKENDS.get(backend) if isinstance(backend, str) else backend
    name = backend if isinstance(backend, str) else backend.name
    if not getattr(found, "supports_privacy", False):
        able = [n for n, factory in TRANSFER_BACKENDS.items() if getattr(factory, "supports_privacy", False)]
        raise ConfigError(f"dp_clip / dp_noise (clipped, noisy styles) are not supported by the {name!r} style "
                          f"backend; use style_backend={' or '.join(able)}, or dp_clip=0 dp_noise=0")
