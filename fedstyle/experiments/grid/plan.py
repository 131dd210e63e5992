"""A :class:`~fedstyle.experiments.grid.spec.Grid` expanded into its runs (a :class:`Plan`), every run
validated before anything runs, and what each run directory already holds (done, resume, new)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from fedstyle.algorithms import METHODS
from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.build import check_source_validation, simulation_noise
from fedstyle.experiments.config import TRACKER_SETTINGS, RunConfig
from fedstyle.experiments.grid.spec import Grid, VariantSpec, _check_folder_name, _fail
from fedstyle.experiments.rundir import CONFIG, DONE
from fedstyle.experiments.tracks import merge_settings

#: settings that never change a run's result beyond float rounding (device, client batching): a finished run made
#: with other values is reused. target_eval changes only which rows of metrics.jsonl carry the targets' accuracy,
#: never the results summary.json reports (tests/test_target_eval.py)
RESULT_NEUTRAL = frozenset({"device", "client_batching", "data_root", "backend", "ray_address", "client_cpus", "client_gpus",
                            "state_budget", "target_eval", *TRACKER_SETTINGS})
OTHERS = "others"


# ----------------------------------------------------------------------------- the plan


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
    #: a dry run planned without the run's data: why it could not be read (empty: the data was there)
    data_missing: str = ""

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


# ----------------------------------------------------------------------------- expansion and validation


@dataclass(frozen=True)
class _AbsentData:
    """A named benchmark whose images are not there, in a plan made without data: its domains are known."""

    domains: tuple[str, ...]
    reason: str


class _Datasets:
    """Datasets loaded once per (name, root, resolution) for "each" and for checking domain names.

    ``without_data`` (a dry run): a named benchmark whose images cannot be read stands in by its known domain
    names, so its runs are listed (marked, see :meth:`missing`) instead of refused.
    """

    def __init__(self, progress: bool, without_data: bool = False, load: bool = True):
        self.progress = progress
        self.without_data = without_data
        self.load = load
        self.loaded: dict[tuple, Any] = {}
        self.checked: set[tuple] = set()

    def get(self, config: RunConfig):
        from fedstyle.data.folder import BENCHMARKS
        from fedstyle.data.registry import DATASETS
        from fedstyle.experiments.build import load_config_dataset

        key = (config.dataset, config.data_root, config.resolution, config.skip_bad_images, config.per_class,
               config.official_splits, config.image_column, config.domain_column, config.label_column)
        known = DATASETS.get(config.dataset).domains if config.dataset in DATASETS else None
        if key not in self.loaded and not self.load and known:  # the configs only: no images read
            self.loaded[key] = _AbsentData(tuple(known), "")
        if key not in self.loaded:
            try:
                self.loaded[key] = load_config_dataset(config, progress=self.progress)
            except FedstyleError as err:
                known = BENCHMARKS.get(config.dataset).domains if config.dataset in BENCHMARKS else None
                if not (self.without_data and known):
                    raise
                self.loaded[key] = _AbsentData(known, str(err))
        return self.loaded[key]

    def missing(self, config: RunConfig) -> str:
        """Why ``config``'s data could not be read in a plan without data; empty when it was read."""
        dataset = self.get(config)
        return dataset.reason if isinstance(dataset, _AbsentData) else ""

    def check(self, config: RunConfig) -> None:
        """The protocol's split and the partition, as the run will build them (no model, no training)."""
        from fedstyle.partition import make_partition, make_split
        from fedstyle.seeding import derive_seed

        key = (config.dataset, config.data_root, config.resolution, config.per_class, config.official_splits,
               config.image_column, config.domain_column, config.label_column, config.protocol,
               tuple(config.targets),
               config.val_domain, config.source, config.val_fraction, config.partition, config.clients,
               config.alpha, config.lam, config.min_client_size, config.seed, config.resolved_selection())
        if key in self.checked:
            return
        dataset = self.get(config)
        if isinstance(dataset, _AbsentData):
            return  # no images to split: the dry run lists the run, marked
        split = make_split(dataset, config.protocol, targets=list(config.targets), val_domain=config.val_domain,
                           source=config.source, val_fraction=config.val_fraction, seed=config.seed)
        check_source_validation(config, split)
        make_partition(config.partition, split, dataset, num_clients=config.clients, alpha=config.alpha,
                       lam=config.lam, min_size=config.min_client_size, seed=derive_seed(config.seed, "partition"))
        self.checked.add(key)


def _differences(stored: Mapping[str, Any], planned: RunConfig) -> list[str]:
    """Settings of a run directory's config.json that differ from the planned run (result-neutral ones aside)."""
    method = METHODS.get(planned.method)
    defaults = RunConfig().to_dict()
    want = planned.to_dict()
    # as the runner writes them (resolve_config): dp_noise_source=auto is stored as the seeded stream it ran with
    want["hparams"] = simulation_noise(method.resolve(planned.hparams))
    want["selection"] = planned.resolved_selection()
    out = []
    for key, value in want.items():
        if key in RESULT_NEUTRAL:
            continue
        if (key == "backbone" and value == "auto") or (key in ("resolution", "augment") and value is None):
            continue
        have = stored.get(key, defaults[key])  # a setting newer than the run: its default
        if key == "hparams" and isinstance(have, Mapping):
            # an option newer than the run: the run had its declared default (a new option keeps the old behaviour)
            have = {**{h.name: h.default for h in method.declared_hparams() if h.name not in have}, **have}
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
              only: Sequence[tuple[str, Sequence[str]]] = (), without_data: bool = False,
              load_data: bool = True) -> Plan:
    """Expand ``grid`` into runs under ``out`` and validate every one before anything runs.

    Each run's RunConfig is typed and checked (``RunConfig.validate``), its method's
    hyperparameters resolved, its topology and runtime checked, its split and partition built on the
    dataset (loaded once per dataset); a run directory that already holds a run of other settings is
    an error. ``load_data=False``: a dataset whose domains the registry knows is not loaded, and its runs'
    splits are not checked (the runs' configurations alone: what ``leaderboard export`` compares). ``only`` keeps the values listed per key (``variant``, ``seed``, ``target`` or a
    crossed key). Raises one ConfigError naming the first bad run. ``without_data`` (a dry run) lists the
    runs of a named benchmark whose images are not there, each with ``data_missing`` saying why, unchecked.
    """
    out = Path(out)
    datasets = _Datasets(progress, without_data, load=load_data)
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
        mapping = merge_settings(mapping, {**variant.settings, "hparams": variant.hparams})
        for axis, index in zip(axes, combo):
            axis.apply(mapping, index)
        # what the variant fixes wins over a bundle of the grid (a star baseline beside graph networks)
        mapping = merge_settings(mapping, {**variant.settings, "hparams": variant.hparams})
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
                yield PlannedRun(out / rel, rel, config, variant.name, row, row_label, group_here, "new",
                                 datasets.missing(config)), where


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
