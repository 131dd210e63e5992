"""Backend ``fft``: Fourier amplitude exchange (FedDG / ELCFS, Liu et al. CVPR'21; CCST appendix E).

The style of an image is the amplitude spectrum ``|F(x)|`` of its 2-D discrete Fourier transform,
per RGB channel: a float32 tensor (3, H, W) in the unshifted layout of :func:`torch.fft.fft2`,
in pixel units (0..255). The overall style of a dataset is the mean amplitude over all its images
(CCST appendix E, footnote 1), streamed over batches.

Transfer keeps the content's phase P_c and interpolates the amplitude inside a centred
low-frequency square M (FedDG Section 3.2, continuous frequency-space interpolation)::

    A_new = [(1 - lam) * A_c + lam * A_s] * M + A_c * (1 - M),     x_new = real(F^-1(A_new * exp(i P_c)))

``lam`` is the transfer's ``alpha`` (a float, or one value per image: FedDG draws lam ~ U(0, 1)).
The square is FedDG's: after ``fftshift`` it spans rows and columns ``c - b .. c + b`` around the
zero frequency ``c = floor(side / 2)``, with half-width ``b = floor(min(H, W) * band)`` (their ``L``),
clipped to the image; ``band = 0`` exchanges nothing (identity), ``band = 1`` the whole spectrum
(``band >= 0.5`` for square images). FedDG's code differs at both ends: its L = 0 (what its training
uses) still exchanges the zero-frequency term (here: any band in (0, 1 / min(H, W))), and for L > 0.5
the square's negative start index makes numpy exchange only a corner (a bug; see
``fedstyle.algorithms.feddg_fft``). Default ``band = 0.1``: the default of FedDG's (and FDA's)
``low_freq_mutate``; at 32 x 32 that is a 7 x 7 square (FedDG's fundus demo uses L = 0.003 at
384 x 384, a 3 x 3 square). The output is rounded and clipped to uint8.
"""

from __future__ import annotations

from typing import Iterable

import torch

from fedstyle.devices import resolve_device
from fedstyle.errors import ConfigError
from fedstyle.style.transfer.base import TRANSFER_BACKENDS, Style, StyleMismatchError, StyleTransfer, group_mean

DEFAULT_BAND = 0.1


def as_rgb(images: torch.Tensor) -> torch.Tensor:
    """A uint8 (B, 3, H, W) batch from (B, 3, H, W) or grayscale (B, 1, H, W) images."""
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ConfigError(
            f"style transfer expects images of shape (B, 3, H, W) or (B, 1, H, W), got {tuple(images.shape)}"
        )
    if images.dtype != torch.uint8:
        raise ConfigError(f"style transfer expects uint8 images (0..255), got {images.dtype}")
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


def low_frequency_mask(height: int, width: int, band: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean (H, W) mask of FedDG's centred low-frequency square, in the unshifted FFT layout."""
    mask = torch.zeros(height, width, dtype=torch.bool, device=device)
    if band <= 0:
        return mask
    b = int(min(height, width) * band)  # floor, as FedDG's np.floor(np.amin((h, w)) * L)
    ch, cw = height // 2, width // 2
    mask[max(0, ch - b) : ch + b + 1, max(0, cw - b) : cw + b + 1] = True
    return torch.fft.ifftshift(mask, dim=(-2, -1))


@TRANSFER_BACKENDS.register("fft")
class FFTAmplitude(StyleTransfer):
    """Amplitude-spectrum styles and low-frequency amplitude interpolation (see the module docstring).

    Args:
        band: FedDG's L, the half-width of the exchanged square as a fraction of min(H, W) (0..0.5+).
        device: where the transforms run (``auto``, ``cpu``, ``cuda``, ...); styles and images come back on the CPU.
    """

    name = "fft"

    def __init__(self, band: float = DEFAULT_BAND, device: torch.device | str = "cpu"):
        if not 0.0 <= float(band) <= 1.0:
            raise ConfigError(f"fft band must be in [0, 1] (a fraction of the image side), got {band}")
        self.band = float(band)
        self.device = resolve_device(device)

    @property
    def encoder_id(self) -> str:
        return "fft2-amplitude"  # no weights: any two fft backends make comparable styles

    def _spectrum(self, images: torch.Tensor) -> torch.Tensor:
        x = as_rgb(images).to(self.device, torch.float32)
        return torch.fft.fft2(x, dim=(-2, -1))

    @torch.no_grad()
    def image_styles(self, images: torch.Tensor) -> Style:
        return Style(self.name, self.encoder_id, {"amplitude": self._spectrum(images).abs().cpu()})

    @torch.no_grad()
    def dataset_style(self, batches: Iterable[torch.Tensor]) -> Style:
        total, count, shape = None, 0, None
        for batch in batches:
            amplitude = self._spectrum(batch).abs().to(torch.float64)
            if shape is None:
                shape = amplitude.shape[-2:]
            elif amplitude.shape[-2:] != shape:
                raise ConfigError(
                    f"the fft backend needs every image of a dataset at one size; got {tuple(shape)} and "
                    f"{tuple(amplitude.shape[-2:])}: resize the images (e.g. --resolution) first"
                )
            batch_sum = amplitude.sum(0)
            total = batch_sum if total is None else total + batch_sum
            count += amplitude.shape[0]
        if count == 0:
            raise StyleMismatchError("cannot compute the overall style of an empty dataset")
        return Style(self.name, self.encoder_id, {"amplitude": (total / count).float().unsqueeze(0).cpu()})

    @torch.no_grad()
    def pool_styles(self, style: Style, groups: torch.Tensor) -> Style:
        """Each group's mean amplitude: :meth:`dataset_style` of the group's images, from their spectra."""
        self.check(style)
        return Style(self.name, self.encoder_id, {"amplitude": group_mean(style.tensors["amplitude"], groups).float()})

    @torch.no_grad()
    def transfer(self, content: torch.Tensor, style: Style, alpha: float | torch.Tensor = 1.0) -> torch.Tensor:
        """Restyle ``content``; ``alpha`` is FedDG's lam, a float or a (B,) tensor of per-image ratios."""
        self.check(style)
        spectrum = self._spectrum(content)
        batch, height, width = spectrum.shape[0], *spectrum.shape[-2:]
        target = style.tensors["amplitude"].to(self.device, torch.float32)
        if target.shape[-2:] != (height, width):
            raise ConfigError(
                f"fft style amplitude is {tuple(target.shape[-2:])} but the content images are {(height, width)}; "
                "compute styles and transfer at the same image size"
            )
        if target.shape[0] not in (1, batch):
            raise ConfigError(
                f"transfer got {target.shape[0]} styles for {batch} images; give one style or one per image"
            )
        lam = torch.as_tensor(alpha, dtype=torch.float32, device=self.device)
        if lam.dim() == 1 and lam.shape[0] != batch:
            raise ConfigError(f"transfer got {lam.shape[0]} ratios for {batch} images")
        if bool(((lam < 0) | (lam > 1)).any()):
            raise ConfigError(f"the interpolation ratio alpha must be in [0, 1], got {alpha}")
        out = exchange_amplitude(spectrum, target, self.band, lam)
        return out.round_().clamp_(0, 255).to(torch.uint8).cpu()


def exchange_amplitude(
    spectrum: torch.Tensor, amplitude: torch.Tensor, band: float, lam: torch.Tensor | float
) -> torch.Tensor:
    """FedDG's amplitude interpolation on a complex spectrum (B, C, H, W): the real image with the content's phase and the
    amplitude ``[(1 - lam) A_c + lam A_s] * M + A_c * (1 - M)``; ``lam`` a number or one per image."""
    lam = torch.as_tensor(lam, dtype=torch.float32, device=spectrum.device)
    if lam.dim() == 1:
        lam = lam.view(-1, 1, 1, 1)
    content_amplitude, phase = spectrum.abs(), spectrum.angle()
    mixed = torch.lerp(content_amplitude, amplitude.expand_as(content_amplitude), lam)
    mask = low_frequency_mask(*spectrum.shape[-2:], band, spectrum.device)
    new_amplitude = torch.where(mask, mixed, content_amplitude)
    return torch.fft.ifft2(torch.polar(new_amplitude, phase), dim=(-2, -1)).real
