"""``fedstyle style demo``: a PNG grid of content images x styles for a visual check of a backend.

Columns after the first: every domain's overall style (CCST Eq. 8, over up to ``STYLE_SAMPLE``
images of the domain; its header shows four of them), then one single-image style per domain (its
header shows that image). Rows after the first: ``per_domain`` content images of every domain; the
first column shows them unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from fedstyle.errors import ConfigError
from fedstyle.figures import save_figure
from fedstyle.seeding import derive_seed

#: images per domain that its overall style is computed from in the demo
STYLE_SAMPLE = 200


def mosaic(images: torch.Tensor) -> np.ndarray:
    """Four uint8 (3, H, W) images as one 2 x 2 (H, W, 3) tile at the same size."""
    tiles = torch.nn.functional.interpolate(images[:4].float(), scale_factor=0.5, mode="bilinear", antialias=True)
    top, bottom = torch.cat([tiles[0], tiles[1]], dim=2), torch.cat([tiles[2], tiles[3]], dim=2)
    return torch.cat([top, bottom], dim=1).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


def typed_options(backend: str, options: dict) -> dict:
    """``--hp NAME=VALUE`` strings as the backend's constructor takes them: a name it does not take, or a value
    that is not of its default's type, is a ConfigError naming the backend's options (they were TypeErrors)."""
    import inspect

    from fedstyle.registry import close_names
    from fedstyle.style.transfer import TRANSFER_BACKENDS

    params = {name: p for name, p in inspect.signature(TRANSFER_BACKENDS.get(backend).__init__).parameters.items()
              if name not in ("self", "device") and p.kind is p.POSITIONAL_OR_KEYWORD}
    typed = {}
    for name, value in options.items():
        if name not in params:
            close = close_names(name, params)
            raise ConfigError(f"--hp {name}: the {backend} backend takes no option {name!r}"
                              f"{'; did you mean ' + ' or '.join(close) + '?' if close else ''}; its options: "
                              f"{', '.join(params) or 'none'}")
        default = params[name].default
        kind = type(default) if isinstance(default, (bool, int, float)) else None
        if kind is None or not isinstance(value, str):
            typed[name] = value
            continue
        try:
            typed[name] = {"true": True, "false": False}[value.lower()] if kind is bool else kind(value)
        except (KeyError, ValueError):
            takes = {bool: "true or false", int: "a whole number"}.get(kind, "a number")
            raise ConfigError(f"--hp {name}={value}: {name} takes {takes} (default {default})") from None
    return typed


def style_demo(
    out: str | os.PathLike = "style_demo.png",
    dataset: str = "digits4",
    backend: str = "lite",
    options: dict | None = None,
    per_domain: int = 2,
    seed: int = 0,
    device: str = "auto",
    data_root: str | None = None,
    skip_bad_images: bool = False,
) -> Path:
    """Write the grid to ``out`` (atomically) and return its path."""
    from matplotlib.figure import Figure

    from fedstyle.data import load_dataset
    from fedstyle.style.transfer import TRANSFER_BACKENDS, Style

    if per_domain < 1:
        raise ConfigError(f"--per-domain must be at least 1, got {per_domain}")
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out must be a .png file, got {out}")
    model = TRANSFER_BACKENDS.get(backend)(**{"device": device, **typed_options(backend, options or {})})
    data = load_dataset(dataset, data_root=data_root, skip_bad_images=skip_bad_images, progress=False)
    rng = np.random.default_rng(derive_seed(seed, "style-demo"))

    headers, styles, titles = [], [], []
    for domain in data.domains:  # overall style of each domain
        sample = torch.from_numpy(np.sort(rng.choice(data.size(domain), min(STYLE_SAMPLE, data.size(domain)),
                                                     replace=False)))
        images = data.images[domain][sample]
        styles.append(model.dataset_style([images]))
        headers.append(mosaic(images))
        titles.append(f"{domain}\n(overall)")
    for domain in data.domains:  # one single-image style per domain
        image = data.images[domain][int(rng.integers(data.size(domain)))][None]
        styles.append(model.image_styles(image))
        headers.append(image[0].permute(1, 2, 0).numpy())
        titles.append(f"{domain}\n(one image)")
    bank = Style.concat(styles)

    contents, labels = [], []
    for domain in data.domains:
        picks = np.sort(rng.choice(data.size(domain), per_domain, replace=False))
        contents.append(data.images[domain][torch.from_numpy(picks)])
        labels += [domain] * per_domain
    content = torch.cat(contents)
    # every content image x every style in one batch per style
    restyled = [model.transfer(content, bank.select(k)) for k in range(len(bank))]

    rows, cols = content.shape[0] + 1, len(bank) + 1
    figure = Figure(figsize=(0.9 * cols + 0.6, 0.9 * rows + 0.6), dpi=100)
    axes = figure.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_axis_off()
    for k, (header, title) in enumerate(zip(headers, titles)):
        axes[0, k + 1].imshow(header, interpolation="nearest")
        axes[0, k + 1].set_title(title, fontsize=7)
    for i in range(content.shape[0]):
        axes[i + 1, 0].imshow(content[i].permute(1, 2, 0).numpy(), interpolation="nearest")
        axes[i + 1, 0].set_ylabel(labels[i], fontsize=7)
        for k in range(len(bank)):
            axes[i + 1, k + 1].imshow(restyled[k][i].permute(1, 2, 0).numpy(), interpolation="nearest")
    figure.suptitle(f"{data.name}: {backend} style transfer (rows: content, columns: target style)", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out, dpi=100)  # and the PDF beside it
