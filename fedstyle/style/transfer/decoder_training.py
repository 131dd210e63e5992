"""Train the ``lite`` backend's decoder with the AdaIN loss (Huang & Belongie, ICCV'17, Eq. 11-13).

With a frozen encoder ``enc`` (EfficientNet-Lite0 up to the AdaIN stage), a content batch c and a
style batch s, t = AdaIN(enc(c), mu(enc(s)), sigma(enc(s))) and g = dec(t):

    L = L_content + lambda * L_style,    L_content = || enc(g) - t ||^2   (mean squared error)
    L_style  = sum over encoder stages i of || mu(phi_i(g)) - mu(phi_i(s)) ||^2
                                          + || sigma(phi_i(g)) - sigma(phi_i(s)) ||^2

where phi_i is the encoder up to stage i (for ``layer1``: ``stem`` and ``layer1``), all squared
norms are means over their elements, as in the public implementation.

Training images are what is available offline: every digits4 domain (32 px, upsampled to
``image_size`` as the backend does at transfer time), other datasets on request (fashion4 when its
Fashion-MNIST files are installed), and random crops of the colour photographs bundled with
scikit-image / scikit-learn.
Each step draws a content and a style batch from that pool and applies a random resized crop
(scale 0.6-1, random horizontal flip) on the device. Adam with a cosine learning-rate decay;
everything is drawn from generators seeded by ``seed``, so the same seed on the same device gives
the same decoder. The file is written atomically with its metadata (stage, width, min_size and
the command that reproduces it).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedstyle.errors import ConfigError, DataError, NonFiniteLossError
from fedstyle.io import atomic_write
from fedstyle.seeding import derive_seed
from fedstyle.style.stats import adain, channel_stats
from fedstyle.devices import resolve_device
from fedstyle.style.transfer.feature_adain import ADAIN_EPS
from fedstyle.style.transfer.lite import DECODER_FORMAT, LiteDecoder, LiteEncoder, check_stage, user_decoder_path

PHOTO_CROPS = 3000


@dataclass
class DecoderTrainingConfig:
    """Options of ``fedstyle style train-decoder`` (the CLI flags have the same names)."""

    steps: int = 6000
    batch_size: int = 32
    image_size: int = 96
    stage: str = "layer1"
    width: int = 16
    style_weight: float = 5.0
    lr: float = 1e-3
    seed: int = 0
    datasets: tuple[str, ...] = ("digits4",)
    photos: bool = True

    def validate(self) -> None:
        check_stage(self.stage)
        for name in ("steps", "batch_size", "width"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.image_size < 16:
            raise ConfigError(f"image-size must be at least 16 pixels, got {self.image_size}")
        # written so that NaN fails too (every comparison with NaN is false)
        if not (math.isfinite(self.style_weight) and self.style_weight >= 0):
            raise ConfigError(f"--style-weight must be a number >= 0, got {self.style_weight}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr must be a number > 0, got {self.lr}")

    def command(self) -> str:
        """The ``fedstyle`` command that reproduces a decoder trained with these options."""
        args = [f"--steps {self.steps}", f"--batch-size {self.batch_size}", f"--image-size {self.image_size}",
                f"--stage {self.stage}", f"--width {self.width}", f"--style-weight {self.style_weight:g}",
                f"--lr {self.lr:g}", f"--seed {self.seed}", f"--datasets {','.join(self.datasets) or 'none'}"]
        if not self.photos:
            args.append("--no-photos")
        return "fedstyle style train-decoder " + " ".join(args)


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = []
    for start in range(0, images.shape[0], 1024):  # bounded float memory
        part = images[start : start + 1024].float()
        part = F.interpolate(part, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out.append(part.round_().clamp_(0, 255).to(torch.uint8))
    return torch.cat(out)


def photo_crops(size: int, count: int, seed: int) -> torch.Tensor:
    """``count`` random size x size crops (uint8 (count, 3, size, size)) of the bundled photographs.

    Crops are cut from the photographs at full, half and quarter scale (textures of several sizes).
    """
    from PIL import Image

    from fedstyle.data.digits4 import load_photos

    rng = np.random.default_rng(derive_seed(seed, "photo-crops"))
    photos = load_photos()
    scaled = []
    for photo in photos:
        image = Image.fromarray(photo)
        for factor in (1, 2, 4):
            small = image.reduce(factor) if factor > 1 else image
            if min(small.size) >= size:
                scaled.append(np.asarray(small))
    if not scaled:
        raise DataError(f"no bundled photograph is at least {size} pixels on its shorter side")
    crops = np.empty((count, size, size, 3), dtype=np.uint8)
    for i in range(count):
        photo = scaled[rng.integers(len(scaled))]
        top = rng.integers(photo.shape[0] - size + 1)
        left = rng.integers(photo.shape[1] - size + 1)
        crops[i] = photo[top : top + size, left : left + size]
    return torch.from_numpy(crops).permute(0, 3, 1, 2).contiguous()


def training_pool(
    config: DecoderTrainingConfig, progress: bool = True, log=print
) -> tuple[torch.Tensor, tuple[str, ...]]:
    """All training images as one uint8 (N, 3, image_size, image_size) tensor, and the datasets really used.

    A dataset that cannot be loaded here (fashion4 without its files) is skipped with a message.
    """
    from fedstyle.data import load_dataset

    if not config.datasets and not config.photos:
        raise ConfigError("no training images: give at least one dataset or keep the photos")
    parts, used = [], []
    for name in config.datasets:
        try:
            dataset = load_dataset(name, progress=progress)
        except DataError as err:
            log(f"skipping {name}: {str(err)[:300]}")
            continue
        images = torch.cat([dataset.images[d] for d in dataset.domains])
        parts.append(_resize(images, config.image_size))
        used.append(name)
        log(f"{name}: {images.shape[0]} images")
    if config.photos:
        parts.append(photo_crops(config.image_size, PHOTO_CROPS, config.seed))
        log(f"photos: {PHOTO_CROPS} crops")
    if not parts:
        raise DataError("no training images could be loaded for the decoder")
    return torch.cat(parts), tuple(used)


def random_resized_crop(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Float images in [0, 1]: a random square crop of 60-100 % of the side, resized back, random h-flip."""
    count = images.shape[0]
    scale = 0.6 + 0.4 * torch.rand(count, generator=generator, device=generator.device)
    shift = (1 - scale) * (2 * torch.rand(2, count, generator=generator, device=generator.device) - 1)
    flip = torch.where(torch.rand(count, generator=generator, device=generator.device) < 0.5, -1.0, 1.0)
    theta = torch.zeros(count, 2, 3, device=images.device)
    theta[:, 0, 0] = scale * flip
    theta[:, 1, 1] = scale
    theta[:, 0, 2] = shift[0]
    theta[:, 1, 2] = shift[1]
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def adain_losses(encoder: LiteEncoder, decoder: torch.nn.Module, content: torch.Tensor, style: torch.Tensor):
    """(content loss, style loss) of the AdaIN paper for float image batches in [0, 1]."""
    with torch.no_grad():
        content_feature = encoder(content)
        style_features = encoder.stages(style)
        target = adain(content_feature, *channel_stats(style_features[-1], eps=ADAIN_EPS), eps=ADAIN_EPS)
    generated = encoder.stages(decoder(target))
    content_loss = F.mse_loss(generated[-1], target)
    style_loss = content_loss.new_zeros(())
    for g, s in zip(generated, style_features):
        g_mean, g_std = channel_stats(g, eps=ADAIN_EPS)
        s_mean, s_std = channel_stats(s, eps=ADAIN_EPS)
        style_loss = style_loss + F.mse_loss(g_mean, s_mean) + F.mse_loss(g_std, s_std)
    return content_loss, style_loss


def _check_finite(values: torch.Tensor, step: int, config: DecoderTrainingConfig) -> None:
    """A NonFiniteLossError, before anything is written, when the losses or the weights hold NaN or infinity."""
    if not bool(torch.isfinite(values).all()):
        raise NonFiniteLossError(f"decoder training diverged by step {step} (NaN or infinite loss or weights); "
                                 f"nothing was written. Lower --lr (now {config.lr:g}) or --style-weight "
                                 f"(now {config.style_weight:g})")


def train_decoder(
    config: DecoderTrainingConfig,
    out: str | Path | None = None,
    device: str = "auto",
    quiet: bool = False,
    encoder_weights: str | None = None,
    pool: torch.Tensor | None = None,
) -> Path:
    """Train a lite decoder and write it (safetensors with metadata) to ``out`` or the user cache; returns the path."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    config.validate()
    log = (lambda *a, **k: None) if quiet else (lambda *a, **k: print(*a, **k, file=sys.stderr))
    dev = resolve_device(device)
    out = Path(out) if out is not None else user_decoder_path(config.stage)
    if out.suffix != ".safetensors":
        raise ConfigError(f"--out must end in .safetensors, got {out}")
    if pool is None:
        pool, used = training_pool(config, progress=not quiet, log=log)
        config = replace(config, datasets=used)  # the metadata records what was really used
    pool = pool.to(dev)
    torch.manual_seed(derive_seed(config.seed, "decoder-init"))
    encoder = LiteEncoder(config.stage, encoder_weights).to(dev).eval().requires_grad_(False)
    decoder = LiteDecoder(config.stage, config.width).to(dev).train()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, config.steps) / config.steps))
    )
    generator = torch.Generator(device=dev).manual_seed(derive_seed(config.seed, "decoder-batches"))
    started = time.perf_counter()
    running = None
    bar = tqdm(range(config.steps), desc=f"decoder {config.stage}", unit="step", disable=quiet,
               dynamic_ncols=True, file=sys.stderr)
    for step, _ in enumerate(bar):
        picks = torch.randint(pool.shape[0], (2, config.batch_size), generator=generator, device=dev)
        content = random_resized_crop(pool[picks[0]].float() / 255.0, generator)
        style = random_resized_crop(pool[picks[1]].float() / 255.0, generator)
        content_loss, style_loss = adain_losses(encoder, decoder, content, style)
        loss = content_loss + config.style_weight * style_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        values = torch.stack([content_loss.detach(), style_loss.detach()])
        running = values if running is None else 0.98 * running + 0.02 * values
        if step % 50 == 0:  # one device sync per 50 steps: a diverged run stops early, not after all its steps
            _check_finite(running, step + 1, config)
            if not quiet:
                bar.set_postfix(content=f"{running[0].item():.4f}", style=f"{running[1].item():.4f}")
    bar.close()
    _check_finite(torch.cat([running, *(p.detach().flatten() for p in decoder.parameters())]), config.steps, config)
    seconds = time.perf_counter() - started
    metadata = {key: str(value) for key, value in asdict(config).items() if key != "datasets"}
    metadata.update(
        format=DECODER_FORMAT,
        encoder="efficientnet_lite0",
        datasets=",".join(config.datasets),
        min_size=str(config.image_size),
        command=config.command(),
        device=dev.type,
        train_seconds=f"{seconds:.1f}",
        final_content_loss=f"{running[0].item():.5f}",
        final_style_loss=f"{running[1].item():.5f}",
    )
    state = {key: value.detach().cpu().contiguous() for key, value in decoder.state_dict().items()}
    atomic_write(out, lambda tmp: save_file(state, str(tmp), metadata=metadata))
    log(f"wrote {out} ({seconds:.0f} s; content loss {metadata['final_content_loss']}, "
        f"style loss {metadata['final_style_loss']})")
    return out
