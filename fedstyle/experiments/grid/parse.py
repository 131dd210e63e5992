"""A sweep file's TOML into a :class:`~fedstyle.experiments.grid.spec.Grid`: its track, scale and
``--set`` overrides applied, every key and value checked (the format: :mod:`fedstyle.experiments.grid`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import tomllib

from fedstyle.algorithms import METHODS
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.grid.spec import (
    Axis,
    Grid,
    VariantSpec,
    _check_folder_name,
    _fail,
)
from fedstyle.experiments.tracks import apply_track, merge_settings

#: keys of a sweep file that are not crossed settings
GRID_KEYS = ("name", "title", "description", "out", "seeds", "targets", "base", "variant", "hparams", "scales",
             "report_by", "paper", "claim", "claims", "tracks")
VARIANT_KEYS = ("name", "method", "label", "hparams", "seeds", "targets")
SCALE_KEYS = ("description", "seeds", "targets", "base", "variants", "hparams")
#: what the sweep writes beside the variants' folders
RESERVED_NAMES = ("reports", "report.md", "report.csv", "report.tex", "accuracy.png", "accuracy.pdf", "training.png",
                  "training.pdf", "claims.json", "sweep.log")


# ----------------------------------------------------------------------------- parsing


def value_label(value: Any) -> str:
    """A crossed value as it appears in a folder name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "+".join(value_label(v) for v in value)
    return str(value)


def _bundle_label(bundle: Mapping[str, Any]) -> str:
    if "name" in bundle:
        return str(bundle["name"])
    parts = []
    for key, value in bundle.items():
        if key == "hparams":
            parts += [value_label(v) for v in value.values()]
        else:
            parts.append(value_label(value))
    return "-".join(parts)


def _check_setting_keys(keys: Iterable[str], where: str, also: Sequence[str] = ()) -> None:
    fields = set(RunConfig.field_names())
    for key in keys:
        if key == "target":
            raise _fail(where, "write targets = [...] (a list of domains) instead of target")
        if key not in fields and key not in also:
            valid = ", ".join(sorted(fields))
            raise _fail(where, f"unknown setting {key!r}; valid settings: {valid}")


def _hparam_axes(table: Any, scope: str, where: str) -> list[Axis]:
    if not isinstance(table, Mapping):
        raise _fail(where, "hparams must be a table of NAME = [values]")
    axes = []
    fields = set(RunConfig.field_names())
    for name, values in table.items():
        if not isinstance(values, list):
            raise _fail(where, f"hparams.{name} = {values!r} is not a list; fixed hyperparameters go in "
                        "[base.hparams] (or the variant's hparams), lists here are crossed")
        axes.append(_make_axis(f"hp.{name}" if name in fields else name, name, "hparam", values, scope, where))
    return axes


def _make_axis(name: str, key: str, kind: str, values: list, scope: str, where: str) -> Axis:
    if not values:
        raise _fail(where, f"{name} = [] crosses nothing; give at least one value")
    if kind == "bundle":
        for value in values:
            if not isinstance(value, Mapping):
                raise _fail(where, f"{name}: a bundle axis is a list of tables of settings, got {value!r}")
            inner = {k: v for k, v in value.items() if k not in ("name", "hparams")}
            _check_setting_keys(inner, f"{where}: {name}")
            if "hparams" in value and not isinstance(value["hparams"], Mapping):
                raise _fail(where, f"{name}: hparams must be a table of NAME = VALUE")
        labels = tuple(_bundle_label(v) for v in values)
    else:
        for value in values:
            if isinstance(value, (list, dict)):
                raise _fail(where, f"{name} = {values!r}: each crossed value must be a single value")
        labels = tuple(value_label(v) for v in values)
    for label in labels:
        _check_folder_name(label, f"a value of {name}", where)
    if len(set(labels)) != len(labels):
        raise _fail(where, f"{name} has two values with the same folder name {labels}; name bundles apart with `name`")
    return Axis(name, key, kind, tuple(values), labels, scope)


def _setting_axes(table: Mapping[str, Any], skip: Sequence[str], scope: str, where: str) -> tuple[list[Axis], dict]:
    """Lists of settings (crossed) and bundles in ``table``; returns (axes, fixed settings)."""
    fields = set(RunConfig.field_names())
    axes, fixed = [], {}
    for key, value in table.items():
        if key in skip:
            continue
        if key in fields:
            if key in ("targets", "seed"):
                raise _fail(where, f"write the crossed {key} as `{'targets' if key == 'targets' else 'seeds'} = [...]`")
            if isinstance(value, list):
                axes.append(_make_axis(key, key, "setting", value, scope, where))
            else:
                fixed[key] = value
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            axes.append(_make_axis(key, key, "bundle", value, scope, where))
        else:
            raise _fail(where, f"unknown key {key!r}; a sweep file holds {', '.join(GRID_KEYS)}, run settings "
                        "given as lists (crossed) and bundles (lists of tables)")
    return axes, fixed


def _seeds(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool)
                                                            and s >= 0 for s in value):
        raise _fail(where, f"seeds = {value!r} must be a non-empty list of whole numbers >= 0, e.g. [0, 1, 2]")
    if len(set(value)) != len(value):
        raise _fail(where, f"seeds = {value!r} lists a seed twice")
    return list(value)


def _targets(value: Any, where: str) -> Any:
    """``"each"`` or a list of target sets (a string: one domain; a list: several in one run)."""
    if value == "each":
        return "each"
    if not isinstance(value, list) or not value:
        raise _fail(where, f'targets = {value!r} must be "each" (every domain in turn) or a list of domains')
    out = []
    for item in value:
        names = [item] if isinstance(item, str) else item
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _fail(where, f"targets: {item!r} is neither a domain nor a list of domains")
        out.append(tuple(names))
    return out


def _parse_variant(raw: Any, index: int, where: str) -> VariantSpec:
    if not isinstance(raw, Mapping):
        raise _fail(where, f"[[variant]] {index + 1} must be a table")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, f"[[variant]] {index + 1} needs a name (its folder), e.g. name = \"fedavg\"")
    here = f"{where}: variant {name!r}"
    _check_folder_name(name, "variant name", where)
    if name in RESERVED_NAMES:
        raise _fail(where, f"variant name {name!r} is reserved for the reports; choose another")
    method = raw.get("method")
    if not isinstance(method, str):
        raise _fail(here, "needs method = \"NAME\" (see `fedstyle methods`)")
    if method not in METHODS:
        raise _fail(here, f"unknown method {method!r}; choose one of: {', '.join(METHODS.names())}")
    label = raw.get("label", name)
    if not isinstance(label, str) or not label:
        raise _fail(here, "label must be a non-empty string")
    hparams_raw = raw.get("hparams", {})
    if not isinstance(hparams_raw, Mapping):
        raise _fail(here, "hparams must be a table of NAME = VALUE")
    fixed_hp = {k: v for k, v in hparams_raw.items() if not isinstance(v, list)}
    axes = _hparam_axes({k: v for k, v in hparams_raw.items() if isinstance(v, list)}, name, here)
    setting_axes, settings = _setting_axes(raw, VARIANT_KEYS, name, here)
    seeds = tuple(_seeds(raw["seeds"], here)) if "seeds" in raw else None
    targets = _targets(raw["targets"], here) if "targets" in raw else None
    return VariantSpec(name, method, label, fixed_hp, settings, tuple(setting_axes + axes), seeds, targets)


def _apply_scale(data: dict, scale: str | None, where: str) -> tuple[dict, str | None, dict[str, str]]:
    scales = data.get("scales")
    if scales is None:
        if scale is not None:
            raise _fail(where, f"has no scales; drop --scale {scale}")
        return data, None, {}
    if not isinstance(scales, Mapping) or not scales:
        raise _fail(where, "[scales] must hold one table per scale, e.g. [scales.smoke]")
    described = {}
    for name, table in scales.items():
        if not isinstance(table, Mapping):
            raise _fail(where, f"[scales.{name}] must be a table")
        described[name] = str(table.get("description", ""))
    if scale is None:
        raise _fail(where, f"choose a scale with --scale: {', '.join(scales)}")
    if scale not in scales:
        raise _fail(where, f"has no scale {scale!r}; choose one of: {', '.join(scales)}")
    chosen = dict(scales[scale])
    merged = {k: v for k, v in data.items() if k != "scales"}
    merged["base"] = merge_settings(dict(data.get("base", {})), chosen.pop("base", {}))
    if "hparams" in chosen:
        merged["hparams"] = {**dict(data.get("hparams", {})), **chosen.pop("hparams")}
    if "variants" in chosen:
        keep = chosen.pop("variants")
        names = [v.get("name") for v in data.get("variant", []) if isinstance(v, Mapping)]
        if not isinstance(keep, list) or not all(isinstance(n, str) for n in keep):
            raise _fail(where, f"[scales.{scale}] variants must be a list of variant names")
        unknown = [n for n in keep if n not in names]
        if unknown:
            raise _fail(where, f"[scales.{scale}] variants: no variant named {unknown[0]!r}; the file has "
                        f"{', '.join(names)}")
        merged["variant"] = [v for v in data.get("variant", []) if v.get("name") in keep]
    if "description" in chosen:
        text = chosen.pop("description")
        merged["description"] = (str(data.get("description", "")) + f" Scale {scale}: {text}").strip()
    for key, value in chosen.items():  # a key the scale crosses is no longer fixed by [base]
        if isinstance(value, list) or (key == "targets" and value == "each"):
            for fixed in {"targets": ("targets", "target"), "seeds": ("seed",)}.get(key, (key,)):
                merged["base"].pop(fixed, None)
    merged.update(chosen)  # seeds, targets, crossed keys
    return merged, scale, described


def parse_override(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set``: the value read as TOML (``2``, ``0.1``, ``true``, ``[0, 1]``), else a string."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects KEY=VALUE, got {item!r} (e.g. --set rounds=2 or --set hparams.k=1)")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return key, value


def _apply_overrides(data: dict, overrides: Sequence[tuple[str, Any]], where: str) -> dict:
    data = copy.deepcopy(data)
    crossed = {k for k, v in data.items() if k not in GRID_KEYS and isinstance(v, list)}
    for key, value in overrides:
        if key in ("seeds", "targets") or (key in crossed and isinstance(value, list)):
            data[key] = value
        elif key in crossed:  # one value for a key the grid crosses: it is fixed instead
            data.pop(key)
            data.setdefault("base", {})[key] = value
        elif key.startswith("hparams."):
            name = key.partition(".")[2]
            if name in data.get("hparams", {}):
                data["hparams"][name] = value
            else:
                data.setdefault("base", {}).setdefault("hparams", {})[name] = value
        elif key in GRID_KEYS:
            raise ConfigError(f"--set {key}=...: {key} is not a run setting; edit the sweep file")
        else:
            _check_setting_keys([key], f"--set {key}")
            data.setdefault("base", {})[key] = value
            for variant in data.get("variant", []):
                if isinstance(variant, Mapping) and key in variant and isinstance(variant[key], list):
                    raise ConfigError(f"--set {key}: variant {variant.get('name')!r} crosses {key}; "
                                      "edit the sweep file")
    return data


def _name_overrides(data: dict, overrides: Sequence[tuple[str, Any]]) -> dict:
    """``data`` whose description and paper note end by naming the command line's changes (``--set``,
    ``--device``): both are the sweep file's prose (a track's "SGD lr 5e-3"), which a report prints beside runs
    that ``--set lr=0.002`` changed."""
    if not overrides:
        return data
    values = ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}" for key, value in overrides)
    changed = f"Changed on the command line: {values} (the text before describes the file's own settings)."
    data = dict(data)
    data["description"] = f"{data.get('description', '')} {changed}".strip()
    if isinstance(data.get("paper"), Mapping) and data["paper"].get("note"):
        data["paper"] = {**data["paper"], "note": f"{data['paper']['note']} {changed}"}
    return data


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; give the sweep file (TOML) itself")
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file; give a TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None


def parse_grid(data: Mapping[str, Any], where: str, *, scale: str | None = None,
               overrides: Sequence[tuple[str, Any]] = (), track: str | None = None) -> Grid:
    """A :class:`Grid` from a sweep file's TOML data (one track and scale of it), with ``--set`` overrides applied."""
    from fedstyle.experiments.paper import parse_claims, parse_paper
    data = apply_track(data, track, where)

    all_variants = [v.get("name") for v in data.get("variant", []) if isinstance(v, Mapping)]
    labels = {v.get("name"): str(v.get("label", v.get("name"))) for v in data.get("variant", [])
              if isinstance(v, Mapping) and isinstance(v.get("name"), str)}
    data, scale, scales = _apply_scale(dict(data), scale, where)
    data = _apply_overrides(data, overrides, where)
    data = _name_overrides(data, overrides)
    base = data.get("base", {})
    if not isinstance(base, Mapping):
        raise _fail(where, "[base] must be a table of run settings")
    base = dict(base)
    if "target" in base:
        t = base.pop("target")
        base["targets"] = [t] if isinstance(t, str) else t
    _check_setting_keys(base, f"{where}: [base]")
    if "hparams" in base and not isinstance(base["hparams"], Mapping):
        raise _fail(where, "[base.hparams] must be a table of NAME = VALUE")
    variants_raw = data.get("variant")
    if not isinstance(variants_raw, list) or not variants_raw:
        raise _fail(where, "needs at least one [[variant]] row (name and method)")
    variants = [_parse_variant(v, i, where) for i, v in enumerate(variants_raw)]
    names = [v.name for v in variants]
    for name in names:
        if names.count(name) > 1:
            raise _fail(where, f"two variants are named {name!r}; names are folder names and must differ")
    axes, fixed = _setting_axes(data, GRID_KEYS, "grid", where)
    if fixed:
        key = next(iter(fixed))
        raise _fail(where, f"{key} = {fixed[key]!r} at the top is not crossed; fixed settings go in [base] "
                    f"(a list is crossed: {key} = [..])")
    axes += _hparam_axes(data.get("hparams", {}), "grid", where)
    seeds = _seeds(data["seeds"], where) if "seeds" in data else None
    targets = _targets(data["targets"], where) if "targets" in data else None
    if seeds is not None and "seed" in base:
        raise _fail(where, "seed is both in [base] and crossed as seeds = [...]; keep one")
    if targets is not None and "targets" in base:
        raise _fail(where, "targets are both in [base] and crossed at the top; keep one")
    if targets is not None and any("targets" in a.sets() for a in axes):
        raise _fail(where, "targets are crossed at the top and set by a bundle; keep one")
    names_seen = {a.name for a in axes}
    for axis in axes:
        clash = axis.sets() & set(base) - {"hparams"}
        if clash:
            raise _fail(where, f"{sorted(clash)[0]} is both in [base] and crossed by {axis.name}; keep one")
    for variant in variants:
        for axis in variant.axes:
            if axis.name in names_seen:
                raise _fail(where, f"variant {variant.name!r} crosses {axis.name}, which the grid crosses already")
        grid_sets = set().union(*(a.sets() for a in axes if a.kind != "bundle")) if axes else set()
        own = set(variant.settings) | {f"hparams.{k}" for k in variant.hparams}
        for axis in variant.axes:
            own |= axis.sets()
        clash = grid_sets & own
        if clash:
            raise _fail(where, f"variant {variant.name!r} sets {sorted(clash)[0]}, which the grid crosses; keep one")
    report_by = data.get("report_by")
    if report_by is not None:
        if not isinstance(report_by, list) or not all(isinstance(k, str) for k in report_by):
            raise _fail(where, "report_by must be a list of crossed keys, e.g. report_by = [\"dataset\"]")
        unknown = [k for k in report_by if k not in names_seen]
        if unknown:
            raise _fail(where, f"report_by: {unknown[0]!r} is not a key the grid crosses "
                        f"({', '.join(sorted(names_seen)) or 'none'})")
    out = data.get("out")
    if out is not None and not isinstance(out, str):
        raise _fail(where, "out must be a folder path (a string)")
    grid = Grid(where=where, base=base, variants=variants, axes=axes, seeds=seeds, targets=targets,
                description=str(data.get("description", "")), title=str(data.get("title", "")), out=out,
                report_by=report_by, scale=scale, scales=scales, name=str(data.get("name", "")),
                all_variants=[n for n in all_variants if isinstance(n, str)], labels=labels)
    grid.paper = parse_paper(data.get("paper"), where)
    grid.claims = parse_claims(data, where)
    return grid


def load_grid(path: str | Path, *, scale: str | None = None, overrides: Sequence[tuple[str, Any]] = (),
              track: str | None = None) -> Grid:
    """Read and parse a sweep file."""
    return parse_grid(read_toml(path), str(path), scale=scale, overrides=overrides, track=track)

