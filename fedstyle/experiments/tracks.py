"""Tracks of a sweep file: the same rows and claims under another training recipe.

A preset compares methods under one recipe (its ``[base]``, crossed keys and ``[scales]``). A
track is a second recipe for the same comparison, chosen with ``--track NAME``: the paper's rows,
numbers and claims stay, the settings change. ``fedstyle reproduce ccst --track pretrained`` runs
CCST's table with an ImageNet-pretrained EfficientNet-Lite0 instead of a ConvNet from scratch::

    [tracks.pretrained]
    description = "ImageNet-pretrained EfficientNet-Lite0 on fashion4 at 64 px ..."
    note = "what differs from the paper on this track (appended to the paper's note)"
    targets = ["sketch"]                  # any top-level key of the file: crossed keys, seeds, targets
    [tracks.pretrained.base]              # merged into [base] (hparams merged key by key)
    backbone = "efficientnet_lite0"
    pretrained = true
    [tracks.pretrained.variant_hparams]   # per row: merged into that variant's hparams
    ccst = { style_backend = "lite" }
    [tracks.pretrained.variant_settings]  # per row: run settings laid over that variant's own
    fedccrl = { lr = 0.00083 }
    [tracks.pretrained.scales.small]      # the track's own scales replace the file's
    ...

A track may start from another: ``extends = "pretrained"`` takes that track's table and lays its own
keys over it (``base``, ``variant_hparams`` and ``variant_settings`` merged key by key, ``scales`` scale by scale
(:func:`merge_scales`), the rest replaced), so a variant of a recipe states only what it changes
(``[tracks.pretrained-batchstats]``: BatchNorm with batch statistics).

Without ``--track`` the file is read as it is and its ``[tracks]`` table is ignored.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from fedstyle.errors import ConfigError

#: what a track may not change: the rows, the paper and its claims are the comparison itself
FIXED_KEYS = ("name", "variant", "paper", "claim", "claims", "tracks", "out")


def merge_settings(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict:
    """``base`` updated by ``extra`` (a copy); ``hparams`` tables are merged key by key."""
    merged = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if key == "hparams" and isinstance(value, Mapping):
            merged.setdefault("hparams", {}).update(value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def track_names(data: Mapping[str, Any]) -> list[str]:
    tracks = data.get("tracks", {})
    return list(tracks) if isinstance(tracks, Mapping) else []


def resolve_extends(tracks: Mapping[str, Any], track: str, where: str) -> dict[str, Any]:
    """Track ``track``'s table (a copy) with ``extends = "PARENT"`` resolved: the parent's table (itself
    resolved) with this one's keys laid over it, ``base``, ``variant_hparams`` and ``variant_settings`` merged
    key by key (as :func:`merge_settings`), ``scales`` scale by scale (:func:`merge_scales`), every other key
    (``note``, ``targets``, ``seeds`` ...) replaced."""
    seen: list[str] = []
    chain: list[dict] = []
    name: Any = track
    while name is not None:
        if not isinstance(name, str) or name not in tracks:
            raise ConfigError(f"{where}: [tracks.{seen[-1]}] extends {name!r}, which is no track; "
                              f"tracks: {', '.join(tracks)}")
        if name in seen:
            raise ConfigError(f"{where}: [tracks.{track}] extends itself through {' -> '.join(seen + [name])}")
        table = tracks[name]
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: [tracks.{name}] must be a table")
        seen.append(name)
        chain.append(copy.deepcopy(dict(table)))
        name = chain[-1].pop("extends", None)
    resolved: dict[str, Any] = {}
    for table in reversed(chain):  # the farthest parent first
        for key, value in table.items():
            if key == "base" and isinstance(value, Mapping) and isinstance(resolved.get(key), Mapping):
                resolved[key] = merge_settings(resolved[key], value)
            elif (key in ("variant_hparams", "variant_settings") and isinstance(value, Mapping)
                  and isinstance(resolved.get(key), Mapping)):
                rows = dict(resolved[key])
                for row, hparams in value.items():
                    both = isinstance(rows.get(row), Mapping) and isinstance(hparams, Mapping)
                    rows[row] = {**rows[row], **hparams} if both else hparams
                resolved[key] = rows
            elif key == "scales" and isinstance(value, Mapping) and isinstance(resolved.get(key), Mapping):
                resolved[key] = merge_scales(resolved[key], value)
            else:
                resolved[key] = value
    return resolved


def merge_scales(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """A child track's ``scales`` over its parent's, scale by scale: a scale both name is the parent's with
    the child's keys laid over it (its ``base`` merged key by key, the rest replaced); the others are kept or
    added as they are. So ``[tracks.child.scales.smoke.base] rounds = 2`` changes one setting of one scale."""
    merged = copy.deepcopy(dict(parent))
    for name, table in child.items():
        if isinstance(table, Mapping) and isinstance(merged.get(name), Mapping):
            scale = dict(merged[name])
            for key, value in table.items():
                both = key == "base" and isinstance(value, Mapping) and isinstance(scale.get(key), Mapping)
                scale[key] = merge_settings(scale[key], value) if both else copy.deepcopy(value)
            merged[name] = scale
        else:
            merged[name] = copy.deepcopy(table)
    return merged


def apply_track(data: Mapping[str, Any], track: str | None, where: str) -> dict[str, Any]:
    """``data`` (a sweep file's TOML) with track ``track`` applied; without a track, ``[tracks]`` dropped."""
    rest = {k: copy.deepcopy(v) for k, v in data.items() if k != "tracks"}
    if track is None:
        return rest
    tracks = data.get("tracks")
    if not isinstance(tracks, Mapping) or not tracks:
        raise ConfigError(f"{where}: has no tracks; drop --track {track}")
    if track not in tracks:
        raise ConfigError(f"{where}: has no track {track!r}; choose one of: {', '.join(tracks)}")
    chosen = resolve_extends(tracks, track, where)
    base = chosen.pop("base", {})
    if not isinstance(base, Mapping):
        raise ConfigError(f"{where}: [tracks.{track}.base] must be a table of run settings")
    rest["base"] = merge_settings(rest.get("base", {}), base)
    note = chosen.pop("note", None)
    if note:
        paper = dict(rest.get("paper", {}))
        paper["note"] = f"{paper.get('note', '')} The {track} track: {note}".strip()
        rest["paper"] = paper
    per_row = chosen.pop("variant_hparams", {})
    if not isinstance(per_row, Mapping):
        raise ConfigError(f"{where}: [tracks.{track}.variant_hparams] must map a variant name to its hparams")
    variants = {v.get("name"): v for v in rest.get("variant", []) if isinstance(v, dict)}
    for name, hparams in per_row.items():
        if name not in variants:
            raise ConfigError(f"{where}: [tracks.{track}.variant_hparams] names {name!r}, which is no variant; "
                              f"variants: {', '.join(map(str, variants))}")
        if not isinstance(hparams, Mapping):
            raise ConfigError(f"{where}: [tracks.{track}.variant_hparams] {name} must be a table of NAME = VALUE")
        variants[name]["hparams"] = {**dict(variants[name].get("hparams", {})), **hparams}
    # a row's own run settings (a variant's `lr = ...`) would otherwise win over the track's base: a track that
    # changes the optimiser states the row's setting again here
    per_row_settings = chosen.pop("variant_settings", {})
    if not isinstance(per_row_settings, Mapping):
        raise ConfigError(f"{where}: [tracks.{track}.variant_settings] must map a variant name to run settings")
    for name, settings in per_row_settings.items():
        if name not in variants:
            raise ConfigError(f"{where}: [tracks.{track}.variant_settings] names {name!r}, which is no variant; "
                              f"variants: {', '.join(map(str, variants))}")
        if not isinstance(settings, Mapping) or "hparams" in settings or "name" in settings or "method" in settings:
            raise ConfigError(f"{where}: [tracks.{track}.variant_settings] {name} must be a table of run settings "
                              "(hyperparameters go in variant_hparams; a track never changes a row's method)")
        variants[name].update(copy.deepcopy(dict(settings)))
    for key, value in chosen.items():
        if key in FIXED_KEYS:
            raise ConfigError(f"{where}: [tracks.{track}] cannot change {key!r}: a track keeps the rows, the "
                              "paper and its claims, and changes the settings")
        rest[key] = value
    return rest
