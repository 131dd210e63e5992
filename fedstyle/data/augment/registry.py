"""``BATCH_AUGMENTATIONS``: the augmentations ``--hp augment=NAME`` selects, and their options.

``build_augmentation(name, mean, std, "k=v,k2=v2")`` builds one for a dataset's normalisation.
Options are written ``NAME=VALUE`` separated by commas; lists use ``/`` (``kernel_sizes=1/3/5``);
booleans true/false. The complement module takes its generators' options with a dotted prefix
(``randconv.per_sample=true``). Unknown names or bad values fail with a one-line ConfigError.
``augment_labelled`` applies one to a labelled training batch (what ``--hp augment=`` does).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

import torch

from fedstyle.data.augment.augmix import AugMix
from fedstyle.data.augment.common import Augmentation
from fedstyle.data.augment.complement import StyleComplement
from fedstyle.data.augment.randconv import RandConv
from fedstyle.data.augment.texture import TextureCorruption
from fedstyle.errors import ConfigError
from fedstyle.registry import Registry

BATCH_AUGMENTATIONS: Registry[type[Augmentation]] = Registry("augmentation")
for _cls in (RandConv, AugMix, TextureCorruption):
    BATCH_AUGMENTATIONS.add(_cls.name, _cls)
    StyleComplement.MEMBERS[_cls.name] = _cls
BATCH_AUGMENTATIONS.add(StyleComplement.name, StyleComplement)

_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _parse_value(where: str, default: Any, text: str) -> Any:
    try:
        if isinstance(default, bool):
            low = text.lower()
            if low not in _TRUE | _FALSE:
                raise ValueError
            return low in _TRUE
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            kind = type(default[0]) if default else str
            return tuple(_parse_value(where, kind(), part.strip()) for part in text.split("/") if part.strip())
        return text
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a valid {type(default).__name__} (default "
                          f"{'/'.join(map(str, default)) if isinstance(default, tuple) else default!r})") from None


def _parse_one(cls: type[Augmentation], key: str, text: str) -> Any:
    if key not in cls.OPTIONS:
        raise ConfigError(f"augment_args: {cls.name} has no option {key!r}; options: {', '.join(cls.OPTIONS)}")
    return _parse_value(f"augment_args {cls.name}.{key}", cls.OPTIONS[key][0], text)


def parse_options(name: str, text: str | Mapping[str, Any]) -> dict[str, Any]:
    """The constructor keywords of augmentation ``name`` from ``"k=v,k2=v2"`` (or an already parsed mapping)."""
    cls = BATCH_AUGMENTATIONS.get(name)
    if isinstance(text, Mapping):
        return dict(text)
    out: dict[str, Any] = {}
    for entry in (e.strip() for e in str(text).split(",")):
        if not entry:
            continue
        key, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not key:
            raise ConfigError(f"augment_args expects NAME=VALUE entries separated by commas, got {entry!r} "
                              "(e.g. kernel_sizes=1/3,per_sample=true)")
        sub, dot, subkey = key.partition(".")
        if dot:
            if cls is not StyleComplement or sub not in StyleComplement.MEMBERS:
                raise ConfigError(f"augment_args {key!r}: dotted options name a generator of augment=complement "
                                  f"({'/'.join(sorted(StyleComplement.MEMBERS))})")
            out.setdefault("suboptions", {}).setdefault(sub, {})[subkey] = _parse_one(StyleComplement.MEMBERS[sub],
                                                                                      subkey, value)
        else:
            out[key] = _parse_one(cls, key, value)
    return out


def build_augmentation(name: str, mean: Sequence[float], std: Sequence[float],
                       options: str | Mapping[str, Any] = "") -> Augmentation:
    """Augmentation ``name`` for batches normalised with ``mean`` / ``std``, with ``options``."""
    cls = BATCH_AUGMENTATIONS.get(name)
    try:
        return cls(mean, std, **parse_options(name, options))
    except TypeError as err:  # a mapping with a keyword the class does not take
        raise ConfigError(f"augmentation {name!r}: {err}") from None


def augmentation_label(name: str) -> str:
    return BATCH_AUGMENTATIONS.get(name).label or name


@lru_cache(maxsize=32)
def _cached(name: str, options: str, mean: tuple, std: tuple) -> Augmentation:
    return build_augmentation(name, mean, std, options)


def augment_labelled(name: str, options: str, transform: Any, x: torch.Tensor, y: torch.Tensor, p: float = 1.0,
                     views: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Augment a labelled training batch with augmentation ``name`` (``options`` as in ``augment_args``),
    for data normalised by ``transform`` (anything with ``mean`` and ``std``, e.g. a BatchTransform).

    ``views = 0``: each sample is replaced by its augmented version with probability ``p``.
    ``views = V >= 1``: the batch becomes ``[x, view_1, ..., view_V]`` (each view augmented afresh,
    per sample with probability ``p``) and the labels are repeated V + 1 times. A channels-last
    batch stays channels-last. Draws from torch's global generators (see :mod:`.common`).
    """
    mean, std = getattr(transform, "mean", None), getattr(transform, "std", None)
    if mean is None or std is None:
        raise ConfigError(f"augment={name} needs the data's normalisation (a transform with mean and std), "
                          f"got {type(transform).__name__}")
    augmentation = _cached(name, options, tuple(mean), tuple(std))

    def maybe(view: torch.Tensor) -> torch.Tensor:
        if p >= 1.0:
            return view
        keep = (torch.rand(x.shape[0]) >= p).to(x.device, non_blocking=True).view(-1, 1, 1, 1)
        return torch.where(keep, x, view)

    if views == 0:
        out = maybe(augmentation(x))
    else:
        out = torch.cat([x, *(maybe(v) for v in augmentation.views(x, views))])
        y = y.repeat(views + 1)
    if x.is_contiguous(memory_format=torch.channels_last):
        out = out.contiguous(memory_format=torch.channels_last)
    return out, y
