"""One naming scheme for every command: a method name, a preset's variant name or a row label.

``fedstyle run --method``, ``fedstyle report --claim`` and ``fedstyle reproduce --only variant=`` accept
the same names, resolved in this order (case ignored):

1. a method name (``fedavg``, ``fedAvg``; :mod:`fedstyle.cli.catalog`);
2. a variant name of a ``fedstyle reproduce`` preset (``ccst-overall-k3``);
3. a row label, as tables print it (``CCST (overall, K=3)``).

Nothing matching gets "did you mean" over the three. Everything here reads the catalog and the presets'
TOML files only, so a bad name is refused before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Sequence

from fedstyle.cli import catalog
from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.registry import did_you_mean

#: a variant's keys that are not run settings
_VARIANT_KEYS = ("name", "label", "method", "hparams")


@dataclass(frozen=True)
class MethodChoice:
    """What a name given to ``--method`` stands for: the method, and (for a preset's variant or row) its
    hyperparameters, other settings and row label."""

    method: str
    hparams: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    source: str = ""


@lru_cache(maxsize=1)
def preset_variants() -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """(preset name, variant table) of every shipped preset."""
    from fedstyle.experiments.paper import list_presets

    return tuple((name, variant) for name, data in list_presets() for variant in data.get("variant", []))


def _variant_choice(matches: Sequence[tuple[str, Mapping[str, Any]]], name: str) -> MethodChoice:
    """One choice for variants that share a name or label; several different ones are refused."""
    def key(variant):
        return repr((variant.get("method"), sorted(variant.get("hparams", {}).items()),
                     sorted((k, v) for k, v in variant.items() if k not in _VARIANT_KEYS)))

    distinct = {key(v): (preset, v) for preset, v in matches}
    if len(distinct) > 1:
        where = "; ".join(f"preset {p}: --method {v['method']}" + "".join(f" --hp {k}={x}" for k, x in
                                                                         v.get("hparams", {}).items())
                          for p, v in distinct.values())
        raise ConfigError(f"--method {name!r} names different variants of the presets ({where}); give the method "
                          "and its --hp as one of them does")
    preset, variant = next(iter(distinct.values()))
    for key_, value in variant.get("hparams", {}).items():
        if isinstance(value, (list, dict)):
            raise ConfigError(f"--method {name!r}: preset {preset}'s variant crosses {key_} over {value}; give "
                              f"--method {variant['method']} --hp {key_}=VALUE")
    settings = {k: v for k, v in variant.items() if k not in _VARIANT_KEYS}
    return MethodChoice(variant["method"], dict(variant.get("hparams", {})), settings,
                        variant.get("label", variant["name"]), f"preset {preset}'s variant {variant['name']}")


def all_names() -> list[str]:
    """Every name the scheme accepts: methods, variant names and row labels."""
    variants = preset_variants()
    return [*catalog.method_names(), *(v["name"] for _, v in variants), *(v["label"] for _, v in variants
                                                                          if "label" in v)]


def resolve_method(name: str) -> MethodChoice:
    """``--method NAME``: a method (any case), else a preset's variant name, else a row label."""
    key = name.strip().lower()
    methods = {m.lower(): m for m in catalog.method_names()}
    if key in methods:
        return MethodChoice(methods[key], source="method")
    variants = preset_variants()
    for field_ in ("name", "label"):
        matches = [(p, v) for p, v in variants if str(v.get(field_, "")).lower() == key]
        if matches:
            return _variant_choice(matches, name)
    raise UnknownNameError(f"unknown method {name!r}; {did_you_mean(name, all_names())}see `fedstyle methods` "
                           "(methods) and `fedstyle reproduce --list PAPER` (presets' variants)")


def row_resolver(labels: Sequence[str], row_methods: Mapping[str, Iterable[str]]) -> Callable[[str], str]:
    """A claim's name -> the row label it means, for a table with rows ``labels`` whose runs trained
    ``row_methods[label]``. A method name that several rows trained is refused, naming them; a name that
    resolves to no row is returned as given (the claim check then says "no row", with "did you mean")."""
    methods = {m.lower(): m for m in catalog.method_names()}
    catalog_labels = {m: entry["label"] for m, entry in catalog.load()["methods"].items()}

    def resolve(name: str) -> str:
        key = name.strip().lower()
        if key in methods:
            method = methods[key]
            rows = [label for label in labels if method in set(row_methods.get(label, ()))]
            plain = [label for label in rows if label.lower() in (key, catalog_labels[method].lower())]
            if len(rows) == 1 or len(plain) == 1:
                return (plain or rows)[0]
            if rows:
                raise ConfigError(f"{name!r} is the method of several rows: {', '.join(map(repr, rows))}; name one "
                                  "of them by its label")
        for field_ in ("name", "label"):
            named = {str(v.get("label", v["name"])) for _, v in preset_variants() if str(v.get(field_, "")).lower()
                     == key}
            rows = [label for label in labels if label in named or label.lower() == key]
            if len(rows) == 1:
                return rows[0]
        exact = [label for label in labels if label.lower() == key]
        return exact[0] if len(exact) == 1 else name

    return resolve


def resolve_variants(names: Sequence[str], variants: Sequence[Any], where: str) -> list[str]:
    """``--only variant=...`` of a sweep or preset: each name a method, a variant name or a row label of
    ``variants`` (VariantSpec objects), in that order; the variant names they stand for. A method stands for
    its variant of the same name when there is one (``fedbn``, not also ``fedbn-mixstyle``: as a claim's
    method name stands for its plain row), else for all its variants."""
    out: list[str] = []
    for name in names:
        key = name.strip().lower()
        by_name = [v.name for v in variants if v.name.lower() == key]
        by_method = [v.name for v in variants if v.method.lower() == key]
        by_label = [v.name for v in variants if v.label.lower() == key]
        found = (by_name if by_method and by_name else by_method) or by_name or by_label
        if not found:
            choices = [*(v.name for v in variants), *(v.label for v in variants)]
            raise ConfigError(f"--only variant={name}: no variant of {where} is that method, variant or row; "
                              f"{did_you_mean(name, choices)}its variants are {', '.join(v.name for v in variants)}")
        out += [v for v in found if v not in out]
    return out
