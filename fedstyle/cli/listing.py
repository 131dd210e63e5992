"""Listings sized for a person: ``fedstyle methods [NAME]`` and ``fedstyle reproduce --list [PAPER]``.

A listing without a name prints one line per item and says how to see one in detail; with a name it
prints that item. Both read the catalog (:mod:`fedstyle.cli.catalog`) and the presets' TOML files only,
so they answer without importing torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from fedstyle.cli import catalog


def method_lines() -> list[str]:
    """One line per method: name, family, paper, what it shares."""
    methods = catalog.load()["methods"]
    width = max(map(len, methods))
    family = max(len(m["family"]) for m in methods.values())
    cite = max(len(m["cite"]) for m in methods.values())
    lines = [f"{'method':<{width}}  {'family':<{family}}  {'paper':<{cite}}  shares"]
    for name, entry in sorted(methods.items()):
        lines.append(f"{name:<{width}}  {entry['family']:<{family}}  {entry['cite']:<{cite}}  {entry['shares']}")
    lines += ["", "fedstyle methods NAME: a method's summary, hyperparameters (--hp NAME=VALUE) and defaults"]
    return lines


def method_detail(name: str) -> list[str]:
    """A method (any case, or a preset's variant or row label, :func:`fedstyle.cli.names.resolve_method`)
    in detail: summary, paper, what it shares, topologies, client batching and every hyperparameter."""
    from fedstyle.cli.names import resolve_method

    choice = resolve_method(name)
    entry = catalog.load()["methods"][choice.method]
    lines = [f"{choice.method}: {entry['label']} ({entry['family']})", f"  {entry['summary']}"]
    if choice.source != "method":
        settings = "".join(f" --hp {k}={v}" for k, v in choice.hparams.items())
        settings += "".join(f" --{k.replace('_', '-')} {v}" for k, v in choice.settings.items())
        lines.insert(0, f"{name!r} is {choice.source} ({choice.label!r}): --method {choice.method}{settings}")
    if entry["paper"]:
        lines.append(f"  paper: {entry['paper']}")
    reason = entry["batching"]
    lines += [f"  shares: {entry['shares']}", f"  topologies: {', '.join(entry['topologies'])}",
              f"  client batching: {'yes' if reason is None else f'no ({reason})'}",
              "  hyperparameters (--hp NAME=VALUE; the local options after style are every method's):"]
    lines += [f"    {h['describe']}" for h in entry["hparams"]]
    return lines


FROM_SCRATCH = "from-scratch"


def preset_lines(presets: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """One line per paper: its preset name and title."""
    width = max((len(name) for name, _ in presets), default=0)
    lines = [f"{name:<{width}}  {data.get('title', '')}" for name, data in presets]
    return lines + ["", "fedstyle reproduce --list PAPER: its tracks, scales and rows; fedstyle reproduce PAPER runs "
                        "its smoke scale"]


def preset_detail(name: str, data: Mapping[str, Any]) -> list[str]:
    """A preset's tracks and scales, each with its own description (a track's scales as ``extends`` resolves
    them), its rows (variant name, label, method) and the paper's numbers."""
    from fedstyle.experiments.tracks import resolve_extends

    paper = data.get("paper", {})
    lines = [f"{name}: {data.get('title', '')}" + (f" ({paper['cite']})" if paper.get("cite") else "")]
    if data.get("description"):
        lines.append(f"  {data['description']}")
    lines.append(f"  --track {FROM_SCRATCH} (default)")
    lines += _scale_lines(data.get("scales", {}))
    tracks = data.get("tracks", {})
    for track in tracks:
        table = resolve_extends(tracks, track, f"preset {name}")
        lines.append(f"  --track {track}: {table.get('description', '')}")
        lines += _scale_lines(table.get("scales", data.get("scales", {})))
    variants = data.get("variant", [])
    lines.append("  rows (--only variant=NAME; also --method NAME of fedstyle run):")
    width = max((len(v["name"]) for v in variants), default=0)
    for v in variants:
        lines.append(f"    {v['name']:<{width}}  {v.get('label', v['name'])}  ({v['method']})")
    for result in paper.get("results", []):
        lines.append(f"  paper's numbers: {result.get('name', result.get('dataset'))} ({result.get('source', '')})")
    return lines


def _scale_lines(scales: Mapping[str, Any]) -> list[str]:
    return [f"    --scale {scale:<6} {table.get('description', '')}" for scale, table in scales.items()]
