"""Sweep files: a grid of runs written as TOML, checked whole before anything runs.

A sweep file::

    description = "FedAvg against local MixStyle over three heterogeneity levels"
    seeds = [0, 1, 2]                 # crossed: one run per seed
    targets = "each"                  # crossed: every domain of the dataset held out in turn
    lam = [0.0, 0.1, 1.0]             # any run setting given as a list is crossed
    hparams.style_p = [0.3, 0.5]      # so is a hyperparameter (every variant's method must declare it)

    [base]                            # a run config, the keys of `fedstyle run --config`
    dataset = "digits4"
    partition = "lambda"
    rounds = 8

    [[variant]]                       # rows: a name (its folder), a method, its hparams, any setting
    name = "fedavg"
    method = "fedavg"

    [[variant]]
    name = "mixstyle"
    method = "mixstyle"
    hparams = { style_stages = "layer1,layer2" }
    local_steps = [10, 20]            # a list inside a variant is crossed for that variant only

Crossing settings that belong together (a test domain with its validation domain, a topology with
its number of devices) is a *bundle* axis: a list of tables under any name that is not a setting::

    split = [{ name = "s-p", targets = ["sketch"], val_domain = "photo" },
             { name = "p-s", targets = ["photo"], val_domain = "sketch" }]

Layout: ``OUT/<variant>/<crossed keys>/seed<k>/<target>``. ``<crossed keys>`` is one folder naming
every crossed key of the run other than seeds and targets, in file order (the grid's, then the
variant's), as ``key=value`` joined by commas: ``lam=0.1,style_p=0.3``; a bundle appears as
``split=s-p`` (its ``name``, else its values joined by ``-``); a hyperparameter whose name is also
a run setting's appears as ``hp.NAME``. The folder is left out when nothing is crossed. ``<target>``
is the held-out domain (several joined by ``+``; ``others`` when the protocol picks them, as
single_source does).

Reports: the crossed run settings and bundles of the grid level split the runs into report groups
(one table each, e.g. per dataset or per lambda); crossed hyperparameters and everything a variant
crosses become rows of the table (``report_by = [...]`` names the keys that split instead). Runs on
different datasets are always in different groups.

Preset files (``fedstyle reproduce``) add ``[scales.<name>]`` tables that override the grid per
scale (``seeds``, ``targets``, any crossed key, ``[scales.X.base]`` merged into ``[base]``,
``variants = [...]`` a subset of the rows, ``description``), a ``[paper]`` table with the paper's
numbers and ``claims`` (see :mod:`fedstyle.experiments.paper`).

A variant's own settings win over a bundle's (``topology = "star"`` for a server baseline in a grid
of peer-to-peer networks); a variant may not fix a key the grid crosses as a list.

Hyperparameters in ``[base.hparams]`` apply to every variant whose method declares them (the
smoke scale of a preset can switch every style-transfer method to the ``fft`` backend); one that
no variant's method declares is an error.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import tomllib

from fedstyle.algorithms import METHODS
from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.rundir import CONFIG, DONE
from fedstyle.experiments.tracks import apply_track, merge_settings

#: keys of a sweep file that are not crossed settings
GRID_KEYS = ("name", "title", "description", "out", "seeds", "targets", "base", "variant", "hparams", "scales",
             "report_by", "paper", "claim", "claims", "tracks")
VARIANT_KEYS = ("name", "method", "label", "hparams", "seeds", "targets")
SCALE_KEYS = ("description", "seeds", "targets", "base", "variants", "hparams")
#: settings that never change a run's result: a finished run made with other values is reused
RESULT_NEUTRAL = frozenset({"device", "data_root", "backend", "ray_address", "client_cpus", "client_gpus",
                            "state_budget"})
#: a crossed value, a variant name or a target must be usable as one folder name
_FOLDER_SAFE = re.compile(r"^[A-Za-z0-9._+@-]+$")
OTHERS = "others"
#: what the sweep writes beside the variants' folders
RESERVED_NAMES = ("reports", "report.md", "report.csv", "accuracy.png", "training.png", "claims.json", "sweep.log")


# ----------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Axis:
    """A crossed key: its folder name, what it sets, and its values with their folder labels.

    ``kind``: ``setting`` (a RunConfig field), ``hparam`` (a method hyperparameter) or ``bundle``
    (a table of settings and ``hparams.*`` applied together)."""

    name: str
    key: str
    kind: str
    values: tuple
    labels: tuple[str, ...]
    scope: str = "grid"

    def apply(self, mapping: dict[str, Any], index: int) -> None:
        value = self.values[index]
        if self.kind == "setting":
            mapping[self.key] = copy.deepcopy(value)
        elif self.kind == "hparam":
            mapping.setdefault("hparams", {})[self.key] = value
        else:
            for key, item in value.items():
                if key == "name":
                    continue
                if key == "hparams":
                    mapping.setdefault("hparams", {}).update(item)
                elif key == "targets" and isinstance(item, str):
                    mapping["targets"] = [item]
                else:
                    mapping[key] = copy.deepcopy(item)

    def sets(self) -> set[str]:
        """The run settings (``hparams.X`` for hyperparameters) this axis sets."""
        if self.kind == "setting":
            return {self.key}
        if self.kind == "hparam":
            return {f"hparams.{self.key}"}
        keys: set[str] = set()
        for value in self.values:
            for key, item in value.items():
                if key == "hparams":
                    keys |= {f"hparams.{k}" for k in item}
                elif key != "name":
                    keys.add(key)
        return keys


@dataclass(frozen=True)
class VariantSpec:
    """One ``[[variant]]`` row."""

    name: str
    method: str
    label: str
    hparams: dict[str, Any]
    settings: dict[str, Any]
    axes: tuple[Axis, ...] = ()
    seeds: tuple[int, ...] | None = None
    targets: Any = None


@dataclass
class Grid:
    """A parsed sweep file (one scale of a preset), not yet expanded into runs."""

    where: str
    base: dict[str, Any]
    variants: list[VariantSpec]
    axes: list[Axis]
    seeds: list[int] | None = None
    targets: Any = None
    description: str = ""
    title: str = ""
    out: str | None = None
    report_by: list[str] | None = None
    paper: Any = None
    claims: list[Any] = field(default_factory=list)
    scale: str | None = None
    scales: dict[str, str] = field(default_factory=dict)
    name: str = ""
    #: every variant name of the file, also those a scale leaves out (claims may name them)
    all_variants: list[str] = field(default_factory=list)
    #: variant name -> its label, for every variant of the file
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedRun:
    """One run of the grid: where it lives, its config, and where it sits in the reports."""

    run_dir: Path
    rel: str
    config: RunConfig
    variant: str
    row: str
    row_label: str
    group: tuple[tuple[str, str], ...]
    status: str  # "done", "resume" (interrupted: continued from its checkpoint) or "new"

    @property
    def seed(self) -> int:
        return self.config.seed


@dataclass
class Plan:
    """Every run of a grid, validated, in table order."""

    grid: Grid
    out: Path
    runs: list[PlannedRun]
    rows: list[str]

    def counts(self) -> dict[str, int]:
        out = {"done": 0, "resume": 0, "new": 0}
        for run in self.runs:
            out[run.status] += 1
        return out

    def groups(self) -> dict[tuple[tuple[str, str], ...], list[PlannedRun]]:
        groups: dict[tuple[tuple[str, str], ...], list[PlannedRun]] = {}
        for run in self.runs:
            groups.setdefault(run.group, []).append(run)
        return groups


# ----------------------------------------------------------------------------- parsing


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def value_label(value: Any) -> str:
    """A crossed value as it appears in a folder name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "+".join(value_label(v) for v in value)
    return str(value)


def _check_folder_name(text: str, what: str, where: str) -> str:
    if not _FOLDER_SAFE.match(text) or text.startswith("."):
        raise _fail(where, f"{what} {text!r} cannot name a folder; use letters, digits and . _ + @ - only"
                    + (" (give a bundle a `name`)" if "=" in text or "/" in text else ""))
    return text


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


_merge = merge_settings


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
    merged["base"] = _merge(dict(data.get("base", {})), chosen.pop("base", {}))
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


# ----------------------------------------------------------------------------- expansion and validation


class _Datasets:
    """Datasets loaded once per (name, root, resolution) for "each" and for checking domain names."""

    def __init__(self, progress: bool):
        self.progress = progress
        self.loaded: dict[tuple, Any] = {}
        self.checked: set[tuple] = set()

    def get(self, config: RunConfig):
        from fedstyle.experiments.build import load_config_dataset

        key = (config.dataset, config.data_root, config.resolution, config.skip_bad_images, config.per_class)
        if key not in self.loaded:
            self.loaded[key] = load_config_dataset(config, progress=self.progress)
        return self.loaded[key]

    def check(self, config: RunConfig) -> None:
        """The protocol's split and the partition, as the run will build them (no model, no training)."""
        from fedstyle.partition import make_partition, make_split
        from fedstyle.seeding import derive_seed

        key = (config.dataset, config.data_root, config.resolution, config.per_class, config.protocol,
               tuple(config.targets),
               config.val_domain, config.source, config.val_fraction, config.partition, config.clients,
               config.alpha, config.lam, config.min_client_size, config.seed)
        if key in self.checked:
            return
        dataset = self.get(config)
        split = make_split(dataset, config.protocol, targets=list(config.targets), val_domain=config.val_domain,
                           source=config.source, val_fraction=config.val_fraction, seed=config.seed)
        make_partition(config.partition, split, dataset, num_clients=config.clients, alpha=config.alpha,
                       lam=config.lam, min_size=config.min_client_size, seed=derive_seed(config.seed, "partition"))
        self.checked.add(key)


def _differences(stored: Mapping[str, Any], planned: RunConfig) -> list[str]:
    """Settings of a run directory's config.json that differ from the planned run (result-neutral ones aside)."""
    method = METHODS.get(planned.method)
    defaults = RunConfig().to_dict()
    want = planned.to_dict()
    want["hparams"] = method.resolve(planned.hparams)
    want["selection"] = planned.resolved_selection()
    out = []
    for key, value in want.items():
        if key in RESULT_NEUTRAL:
            continue
        if (key == "backbone" and value == "auto") or (key in ("resolution", "augment") and value is None):
            continue
        have = stored.get(key, defaults[key])  # a setting newer than the run: its default
        if key == "hparams" and isinstance(have, Mapping):
            out += [f"hparams.{k}" for k in sorted(set(value) | set(have)) if value.get(k) != have.get(k)]
        elif have != value:
            out.append(f"{key} ({have!r} there, {value!r} here)")
    return out


def run_status(run_dir: Path, config: RunConfig) -> str:
    """``done``, ``resume`` or ``new``; a directory holding a run of other settings is an error."""
    path = run_dir / CONFIG
    if not path.exists():
        return "new"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ConfigError(f"{path} is unreadable: the run directory is damaged; delete {run_dir} to run it again")
    if not isinstance(stored, dict):
        raise ConfigError(f"{path} holds no run configuration; delete {run_dir} to run it again")
    differs = _differences(stored, config)
    if differs:
        raise ConfigError(f"{run_dir} holds a run made with other settings ({', '.join(differs[:3])}"
                          f"{', ...' if len(differs) > 3 else ''}); delete it or give the sweep another --out")
    return "done" if (run_dir / DONE).exists() else "resume"


def _describe(parts: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in parts)


def plan_grid(grid: Grid, out: str | Path, *, progress: bool = False,
              only: Sequence[tuple[str, Sequence[str]]] = ()) -> Plan:
    """Expand ``grid`` into runs under ``out`` and validate every one before anything runs.

    Each run's RunConfig is typed and checked (``RunConfig.validate``), its method's
    hyperparameters resolved, its topology and runtime checked, its split and partition built on the
    dataset (loaded once per dataset); a run directory that already holds a run of other settings is
    an error. ``only`` keeps the values listed per key (``variant``, ``seed``, ``target`` or a
    crossed key). Raises one ConfigError naming the first bad run.
    """
    out = Path(out)
    datasets = _Datasets(progress)
    only_values = _check_only(grid, only)
    variants = [v for v in grid.variants if "variant" not in only_values or v.name in only_values["variant"]]
    declared = {v.name: {h.name for h in METHODS.get(v.method).declared_hparams()} for v in grid.variants}
    for name in grid.base.get("hparams", {}):
        if not any(name in d for d in declared.values()):
            raise _fail(grid.where, f"[base.hparams] {name!r} is a hyperparameter of none of the variants' methods "
                        f"({', '.join(sorted({v.method for v in grid.variants}))})")
    group_axes = set(grid.report_by) if grid.report_by is not None else \
        {a.name for a in grid.axes if a.kind != "hparam"}
    runs: list[PlannedRun] = []
    rows: list[str] = []
    seen: dict[Path, str] = {}
    errors: list[str] = []
    for variant in variants:
        for run, where in _variant_runs(grid, variant, declared[variant.name], group_axes, only_values, datasets,
                                        out):
            if run.run_dir in seen:
                raise _fail(grid.where, f"two runs would share the folder {run.rel} ({seen[run.run_dir]} and {where})")
            seen[run.run_dir] = where
            try:
                run = dataclasses.replace(run, status=run_status(run.run_dir, run.config))
            except ConfigError as err:
                errors.append(str(err))
                continue
            runs.append(run)
            if run.row not in rows:
                rows.append(run.row)
    if errors:
        more = f" (and {len(errors) - 1} more run directories)" if len(errors) > 1 else ""
        raise ConfigError(errors[0] + more)
    if not runs:
        raise ConfigError(f"{grid.where}: the grid (with --only) has no runs")
    _name_groups(runs, group_axes)
    from fedstyle.experiments.paper import check_claim_rows

    check_claim_rows(grid, rows)
    return Plan(grid, out, runs, rows)


def _check_only(grid: Grid, only: Sequence[tuple[str, Sequence[str]]]) -> dict[str, set[str]]:
    """``--only`` as key -> kept values, each key crossed by the grid and each value one of its values."""
    wanted = {key: set(values) for key, values in only}
    values_of: dict[str, set[str]] = {"variant": {v.name for v in grid.variants}}
    for axis in [*grid.axes, *(a for v in grid.variants for a in v.axes)]:
        values_of.setdefault(axis.name, set()).update(axis.labels)
    known = {"seed", "target", *values_of}
    for key, values in wanted.items():
        if key not in known:
            raise ConfigError(f"--only {key}: not a crossed key of {grid.where}; choose from "
                              f"{', '.join(sorted(known))}")
        unknown = sorted(values - values_of[key]) if key in values_of else []
        if unknown:
            raise ConfigError(f"--only {key}={unknown[0]}: {key} takes {', '.join(sorted(values_of[key]))}")
    return wanted


def _check_run(config: RunConfig, datasets: _Datasets) -> None:
    """Everything about one run that can be checked without training it."""
    from fedstyle.experiments.runner import check_backend

    config.validate()
    method = METHODS.get(config.method)
    method.resolve(config.hparams)
    if config.topology not in method.topologies:
        raise ConfigError(f"method {config.method!r} runs on {', '.join(method.topologies)}, not topology "
                          f"{config.topology}")
    check_backend(config)  # the runtime exists here and runs this topology
    datasets.check(config)


def _variant_runs(grid: Grid, variant: VariantSpec, declared: set[str], group_axes: set[str],
                  only: dict[str, set[str]], datasets: _Datasets, out: Path) -> Iterable[tuple[PlannedRun, str]]:
    """The variant's runs (status not yet known), each checked, with a description of where it comes from."""
    axes = [*grid.axes, *variant.axes]
    for axis in axes:
        if axis.kind == "hparam" and axis.key not in declared:
            raise _fail(grid.where, f"{axis.name} is crossed for variant {variant.name!r}, but {variant.method} "
                        f"has no hyperparameter {axis.key!r}")
    target_spec = variant.targets if variant.targets is not None else grid.targets
    targets_crossed_by_axis = any("targets" in a.sets() for a in axes)
    choices = [[i for i, label in enumerate(a.labels) if a.name not in only or label in only[a.name]] for a in axes]
    for combo in itertools.product(*choices):
        mapping = {k: v for k, v in grid.base.items() if k != "hparams"}
        mapping["hparams"] = {k: v for k, v in grid.base.get("hparams", {}).items() if k in declared}
        mapping = _merge(mapping, {**variant.settings, "hparams": variant.hparams})
        for axis, index in zip(axes, combo):
            axis.apply(mapping, index)
        # what the variant fixes wins over a bundle of the grid (a star baseline beside graph networks)
        mapping = _merge(mapping, {**variant.settings, "hparams": variant.hparams})
        parts = [(a.name, a.labels[i]) for a, i in zip(axes, combo)]
        splits = [a.name in group_axes and a.scope == "grid" for a in axes]
        group = tuple(part for part, split in zip(parts, splits) if split)
        row_parts = [part for part, split in zip(parts, splits) if not split]
        row = variant.name + (f"[{','.join(f'{k}={v}' for k, v in row_parts)}]" if row_parts else "")
        row_label = variant.label + (f" ({_describe(row_parts)})" if row_parts else "")
        mapping.update(method=variant.method, label=row_label)
        here = f"{grid.where}: variant {variant.name!r}" + (f" ({_describe(parts)})" if parts else "")
        probe = _typed(mapping, here)
        if targets_crossed_by_axis or target_spec is None:
            target_sets = [tuple(probe.targets)]
        elif target_spec == "each":
            try:
                target_sets = [(d,) for d in datasets.get(probe).domains]
            except FedstyleError as err:
                raise _fail(here, str(err)) from None
        else:
            target_sets = list(target_spec)
        for seed in list(variant.seeds or grid.seeds or [probe.seed]):
            if "seed" in only and str(seed) not in only["seed"]:
                continue
            for targets in target_sets:
                target_label = "+".join(targets) if targets else OTHERS
                if "target" in only and target_label not in only["target"]:
                    continue
                _check_folder_name(target_label, "target", here)
                config = _typed({**mapping, "seed": seed, "targets": list(targets)}, here)
                where = f"{here} seed {seed} target {target_label}"
                try:
                    _check_run(config, datasets)
                except FedstyleError as err:
                    raise _fail(where, str(err)) from None
                rel = "/".join(p for p in (variant.name, ",".join(f"{k}={v}" for k, v in parts), f"seed{seed}",
                                           target_label) if p)
                if not any(k == "dataset" for k, _ in group):
                    group_here = group + (("dataset", config.dataset),)
                else:
                    group_here = group
                yield PlannedRun(out / rel, rel, config, variant.name, row, row_label, group_here, "new"), where


def _name_groups(runs: list[PlannedRun], group_axes: set[str]) -> None:
    """Drop ``dataset`` from the group names when the grid does not cross it and uses one dataset only."""
    datasets = {r.config.dataset for r in runs}
    if len(datasets) > 1 or "dataset" in group_axes:
        return
    for i, run in enumerate(runs):
        runs[i] = dataclasses.replace(run, group=tuple(p for p in run.group if p[0] != "dataset"))


def _typed(mapping: Mapping[str, Any], where: str) -> RunConfig:
    try:
        return RunConfig.from_mapping(mapping, where=where)
    except TypeError as err:  # a value of the wrong shape for the dataclass
        raise _fail(where, str(err)) from None


def group_folder(group: Sequence[tuple[str, str]]) -> str:
    """A report group's folder name: ``key=value`` joined by commas (``all`` for the whole grid)."""
    return ",".join(f"{k}={v}" for k, v in group) or "all"


def group_title(group: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in group) or "all runs"
