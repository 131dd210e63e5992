"""The report's figures: curves read from the runs' metrics.jsonl, drawn with matplotlib (no pyplot state).

Every figure is written as PNG and PDF (:func:`fedstyle.figures.save_figure`); a row's colour is
:func:`fedstyle.colours.colour_for` of its label, the same in every figure whatever the row order; every
accuracy axis shows chance (100 / classes) and spans at least 10 points
(:func:`fedstyle.figures.accuracy_axis`); a figure's grid holds exactly the panels drawn.

A *run* here is anything with ``metrics`` (the metrics.jsonl rows), ``seed`` and ``summary`` (the
report's ``RunRecord``); ``row_of(run)`` names the table row the run belongs to, so curves and
table rows always agree. Curves are averaged over a row's runs per seed (leave-one-domain-out runs
of one seed are merged), then drawn as the mean over seeds with a ±1 std band.

- ``accuracy.png`` / ``.pdf`` (:func:`plot_accuracy`): target accuracy per round, one panel per held-out
  domain (up to 6) and one for their mean;
- ``training.png`` / ``.pdf`` (:func:`plot_training`): mean target accuracy per round with a marker at each
  run's selected round and the chance line, mean source-validation accuracy, training loss, target
  accuracy against megabytes sent (up + down), and for peer-to-peer runs the devices' own models
  (mean ± std over devices).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from fedstyle.colours import colour_for
from fedstyle.errors import DataError
from fedstyle.figures import accuracy_axis, save_figure

MAX_DOMAIN_PANELS = 6

#: row -> series key (a domain, or a run's target) -> seed -> {round: value}
Curves = dict[str, dict[str, dict[int, dict[int, float]]]]


def _evaluations(run) -> list[dict[str, Any]]:
    return [row for row in run.metrics if "round" in row and "event" not in row]


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _target_curves(runs: Sequence, row_of: Callable) -> tuple[list[str], Curves]:
    """Domains in order, and row -> domain -> seed -> {round: target accuracy %}."""
    curves: Curves = {}
    domains: dict[str, None] = {}
    for run in runs:
        for row in _evaluations(run):
            if not isinstance(row.get("target_acc"), dict):
                continue
            for domain, accuracy in row["target_acc"].items():
                if accuracy is None:
                    continue
                domains.setdefault(domain, None)
                per_seed = curves.setdefault(row_of(run), {}).setdefault(domain, {})
                per_seed.setdefault(run.seed, {})[int(row["round"])] = 100.0 * accuracy
    return list(domains), curves


def _run_curves(runs: Sequence, row_of: Callable, value: Callable[[dict], float | None]) -> Curves:
    """row -> run's targets -> seed -> {round: value(row)} for a per-run quantity."""
    curves: Curves = {}
    for run in runs:
        key = ",".join(run.summary.get("targets", {})) or str(run.path)
        for row in _evaluations(run):
            v = value(row)
            if v is not None and math.isfinite(v):
                curves.setdefault(row_of(run), {}).setdefault(key, {}).setdefault(run.seed, {})[int(row["round"])] = v
    return curves


def _average_curve(per_domain: dict[str, dict[int, dict[int, float]]]) -> dict[int, dict[int, float]]:
    """seed -> {round: mean over that seed's domains}, at rounds where all of them were evaluated."""
    seeds = {seed for per_seed in per_domain.values() for seed in per_seed}
    averaged = {}
    for seed in seeds:
        series = [per_seed[seed] for per_seed in per_domain.values() if seed in per_seed]
        common = set.intersection(*(set(s) for s in series))
        averaged[seed] = {r: statistics.fmean(s[r] for s in series) for r in sorted(common)}
    return averaged


def _mean_band(per_seed: dict[int, dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """Rounds, mean over seeds, and sample std over seeds (0 where one seed) at each round."""
    rounds = sorted({r for series in per_seed.values() for r in series})
    means, stds = [], []
    for r in rounds:
        values = [series[r] for series in per_seed.values() if r in series]
        means.append(statistics.fmean(values))
        stds.append(statistics.stdev(values) if len(values) >= 2 else 0.0)
    return rounds, means, stds


def _draw_band(axes, x, means, stds, color, label, marker=True) -> None:
    low = [m - s for m, s in zip(means, stds)]
    high = [m + s for m, s in zip(means, stds)]
    axes.plot(x, means, color=color, label=label, marker="." if marker and len(x) < 30 else None)
    axes.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)


def _figure(panels: int):
    """A figure with exactly ``panels`` axes: up to 3 a row (4 as 2 x 2), a short last row centred, so no
    panel is left empty. Returns the figure and the axes in reading order."""
    from matplotlib.figure import Figure  # Figure without pyplot: no global backend/state

    columns = 2 if panels == 4 else min(panels, 3)
    rows = math.ceil(panels / columns)
    figure = Figure(figsize=(4.5 * columns, 3.4 * rows + 0.6), layout="constrained")
    grid = figure.add_gridspec(rows, 2 * columns)  # half-columns, so a short last row can sit centred
    axes = []
    for index in range(panels):
        row, column = divmod(index, columns)
        in_row = min(columns, panels - row * columns)
        left = (columns - in_row) + 2 * column  # offset of a short row, in half-columns
        axes.append(figure.add_subplot(grid[row, left: left + 2]))
    return figure, axes


def _finish(figure, axes_list, path: Path) -> Path:
    legend: dict[str, object] = {}  # a row may be missing from some panels (leave-one-out)
    for axes in axes_list:
        for handle, label in zip(*axes.get_legend_handles_labels()):
            if not label.startswith("_"):
                legend.setdefault(label, handle)
    figure.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(len(legend), 4) or 1)
    return save_figure(figure, path)


def _chance(runs: Sequence) -> float | None:
    """Chance accuracy in percent (100 / classes) when every run has the same number of classes."""
    classes = {run.summary.get("num_classes") for run in runs} - {None}
    return 100.0 / classes.pop() if len(classes) == 1 else None


def _round_axes(axes, title: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.set_title(title)
    axes.set_xlabel("round")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)


def plot_accuracy(runs: Sequence, path: str | Path, row_of: Callable | None = None) -> Path:
    """PNG of target accuracy per round per row: mean over seeds with a ±1 std band.

    One panel per held-out domain (if at most 6) plus one for the mean over held-out domains
    (omitted when there is a single domain, where it would repeat that panel).
    """
    row_of = row_of or (lambda run: run.label)
    domains, curves = _target_curves(runs, row_of)
    if not curves:
        raise DataError("the runs' metrics.jsonl files have no per-round target_acc; nothing to plot")
    panels: list[tuple[str, Curves]] = []
    if len(domains) <= MAX_DOMAIN_PANELS:
        panels += [(f"target: {d}", {label: {d: c[d]} for label, c in curves.items() if d in c}) for d in domains]
    if len(domains) > 1:
        panels.append(("mean over held-out domains", curves))
    figure, axes_list = _figure(len(panels))
    chance = _chance(runs)
    for axes, (title, panel_curves) in zip(axes_list, panels):
        for label, per_domain in panel_curves.items():
            rounds, means, stds = _mean_band(_average_curve(per_domain))
            if rounds:
                _draw_band(axes, rounds, means, stds, colour_for(label), label)
        _round_axes(axes, title, "accuracy (%)")
        accuracy_axis(axes, chance)
    return _finish(figure, axes_list, Path(path))


def plot_training(runs: Sequence, path: str | Path, row_of: Callable | None = None) -> Path:
    """PNG of how the rows trained (see the module docstring); panels without data are left out."""
    row_of = row_of or (lambda run: run.label)
    _, target = _target_curves(runs, row_of)
    if not target:
        raise DataError("the runs' metrics.jsonl files have no per-round target_acc; nothing to plot")
    source = _run_curves(runs, row_of, lambda r: None if not r.get("source_val_acc") else
                         100.0 * statistics.fmean(r["source_val_acc"].values()))
    loss = _run_curves(runs, row_of, lambda r: r.get("train_loss") if isinstance(r.get("train_loss"), float) else None)
    megabytes = _run_curves(runs, row_of, lambda r: (r["bytes_up"] + r["bytes_down"]) / 1e6
                            if isinstance(r.get("bytes_up"), (int, float)) else None)
    devices = _run_curves(runs, row_of, lambda r: _mean(100.0 * v["mean"] for v in r["device_target_acc"].values())
                          if isinstance(r.get("device_target_acc"), dict) else None)
    device_std = _run_curves(runs, row_of, lambda r: _mean(100.0 * v["std"] for v in r["device_target_acc"].values())
                             if isinstance(r.get("device_target_acc"), dict) else None)
    panels = ["target", "source", "loss", "bytes", "devices"]
    panels = [p for p in panels if {"source": source, "loss": loss, "bytes": megabytes, "devices": devices}.get(p, 1)]
    figure, axes_list = _figure(len(panels))
    axes_of = dict(zip(panels, axes_list))

    chance = _chance(runs)
    axes = axes_of["target"]
    for label, per_domain in target.items():
        rounds, means, stds = _mean_band(_average_curve(per_domain))
        _draw_band(axes, rounds, means, stds, colour_for(label), label)
    for run in runs:  # each run's selected round, at that run's accuracy there (mean over its targets)
        chosen = next((r for r in _evaluations(run) if r["round"] == run.summary.get("selected_round")), None)
        if chosen and isinstance(chosen.get("target_acc"), dict):
            acc = _mean(chosen["target_acc"].values())
            if acc is not None:
                axes.plot([chosen["round"]], [100.0 * acc], marker="*", markersize=9, linestyle="none",
                          color=colour_for(row_of(run)), label="_selected")
    _round_axes(axes, "target accuracy (★ each run at its selected round)", "accuracy (%)")
    accuracy_axis(axes, chance)

    for name, curves, title, ylabel in (("source", source, "source-validation accuracy", "accuracy (%)"),
                                        ("loss", loss, "training loss", "loss")):
        if name not in axes_of:
            continue
        axes = axes_of[name]
        for label, per_run in curves.items():
            rounds, means, stds = _mean_band(_average_curve(per_run))
            _draw_band(axes, rounds, means, stds, colour_for(label), label)
        _round_axes(axes, title, ylabel)
        if name == "source":
            accuracy_axis(axes, chance)
        if name == "loss":
            values = [v for per_run in curves.values() for s in per_run.values() for series in s.values()
                      for v in series.values()]
            if values and min(values) > 0 and max(values) / min(values) > 50:
                axes.set_yscale("log")

    if "bytes" in axes_of:
        axes = axes_of["bytes"]
        for label in target:
            rounds, means, _ = _mean_band(_average_curve(target[label]))
            mb_rounds, mb, _ = _mean_band(_average_curve(megabytes.get(label, {})))
            at = dict(zip(mb_rounds, mb))
            xs = [at[r] for r in rounds if r in at]
            ys = [m for r, m in zip(rounds, means) if r in at]
            if xs:
                axes.plot(xs, ys, color=colour_for(label), label=label, marker="." if len(xs) < 30 else None)
        axes.set_title("target accuracy against traffic")
        axes.set_xlabel("MB sent so far (up + down)")
        axes.set_ylabel("accuracy (%)")
        axes.grid(alpha=0.3)
        accuracy_axis(axes, chance)

    if "devices" in axes_of:
        axes = axes_of["devices"]
        for label, per_run in devices.items():
            rounds, means, _ = _mean_band(_average_curve(per_run))
            _, spread, _ = _mean_band(_average_curve(device_std.get(label, {})))
            _draw_band(axes, rounds, means, spread[: len(means)] or [0.0] * len(means), colour_for(label), label)
        _round_axes(axes, "devices' own models (mean ± std over devices)", "accuracy (%)")
        accuracy_axis(axes, chance)
    return _finish(figure, axes_list, Path(path))
