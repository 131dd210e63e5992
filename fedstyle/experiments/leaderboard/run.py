"""Running the leaderboard's tables with the sweep machinery, and keeping their per-seed results.

``fedstyle leaderboard run`` plans each table (:func:`~fedstyle.experiments.grid.plan_grid`: every run
validated before anything runs), leaves out the runs whose results its per-seed CSV already holds (run on
another machine: a GPU's share of the grid comes back as lines of the CSV, not as run folders), runs the rest
with :func:`~fedstyle.experiments.sweep.run_plan` (finished runs skipped, interrupted ones resumed, several
at once with ``workers``) and merges every finished run of the plan into
``benchmarks/per_seed/<csv>.csv`` (:mod:`fedstyle.experiments.report.per_seed`). Running the same command
again continues where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fedstyle.errors import ConfigError
from fedstyle.experiments.leaderboard.tables import CSV_DIR, Table

#: the columns of a leaderboard CSV; a line is one (run, held-out target)
COLUMNS = ("label", "method", "variant", "dataset", "source", "target", "seed", "rounds", "target_acc",
           "source_val", "device", "seconds")
#: what makes a line unique: a run made again replaces its lines (one made with another budget is another line)
LINE_KEY = ("variant", "dataset", "source", "target", "seed", "rounds")


@dataclass
class TablePlan:
    """A table's runs: all of them (validated), and those its CSV does not hold yet."""

    table: Table
    plan: object  # fedstyle.experiments.grid.Plan
    in_csv: list = field(default_factory=list)
    to_run: list = field(default_factory=list)
    #: the table's CSV lines when planned (the dry run's measured seconds)
    csv_lines: list = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        folders = {"done": 0, "resume": 0, "new": 0}
        for run in self.to_run:
            folders[run.status] += 1
        return {"runs": len(self.plan.runs), "in_csv": len(self.in_csv), "left": len(self.to_run), **folders}


def csv_path(table: Table, csv_dir: Path = CSV_DIR) -> Path:
    return Path(csv_dir) / f"{table.csv}.csv"


def read_csv(table: Table, csv_dir: Path = CSV_DIR) -> list[dict[str, str]]:
    """The table's CSV lines (none when it does not exist yet)."""
    from fedstyle.experiments.report.per_seed import read_rows

    path = csv_path(table, csv_dir)
    return read_rows(path, COLUMNS) if path.exists() else []


def _held(lines: Sequence[dict[str, str]]) -> dict[tuple, set[str]]:
    """(variant, dataset, source, seed, rounds) -> the targets the CSV holds for it."""
    held: dict[tuple, set[str]] = {}
    for line in lines:
        key = (line["variant"], line["dataset"], line.get("source", ""), int(line["seed"]), int(line["rounds"]))
        held.setdefault(key, set()).add(line["target"])
    return held


def run_in_csv(run, held: dict[tuple, set[str]]) -> bool:
    """Whether the CSV holds the run's result: every held-out target of it (a single-source run, whose
    protocol picks the targets, when it holds any)."""
    config = run.config
    targets = held.get((run.variant, config.dataset, config.source or "", config.seed, config.rounds))
    if not targets:
        return False
    return set(config.targets) <= targets if config.targets else True


def _crossed(grid) -> dict[str, set[str]]:
    """A table's grid's keys --only can name, each with its values (the rows by their variant names)."""
    crossed = {axis.name: set(axis.labels) for axis in grid.axes}
    crossed["variant"] = {v.name for v in grid.variants}
    return crossed


def check_only(grids: Sequence, only: Sequence[tuple[str, Sequence[str]]]) -> None:
    """A ConfigError for an ``--only KEY=V`` that no table of ``grids`` has, with the closest names: a misspelt
    variant would otherwise leave every table without a run, and the command with nothing to do. (A ``target``
    goes to the sweep's own check.)"""
    from fedstyle.registry import close_names

    known: dict[str, set[str]] = {}
    seeds = set()
    for grid in grids:
        for key, values in _crossed(grid).items():
            known.setdefault(key, set()).update(values)
        seeds.update(grid.seeds or (), *(v.seeds or () for v in grid.variants))
    for key, values in only:
        if key == "seed":
            strange = [v for v in values if not v.isdigit() or int(v) not in seeds]
            if strange:
                raise ConfigError(f"--only seed={strange[0]}: the tables' seeds are "
                                  f"{', '.join(map(str, sorted(seeds)))}")
            continue
        if key == "target":
            continue
        if key not in known:
            raise ConfigError(f"--only {key}=...: no leaderboard table crosses {key!r}; the keys: "
                              f"{', '.join(sorted(known))}, seed, target")
        for value in values:
            if value not in known[key]:
                close = close_names(value, known[key])
                hint = f"; did you mean {' or '.join(close)}?" if close else f"; the {key} names: " \
                    f"{', '.join(sorted(known[key]))}"
                raise ConfigError(f"--only {key}={value}: no leaderboard table has it{hint}")


def table_only(table: Table, grid, only: Sequence[tuple[str, Sequence[str]]]) -> list | None:
    """``--only KEY=V1,V2`` items that concern this table's grid; None when they leave it no run (a variant it
    does not have, a key it does not cross)."""
    crossed = _crossed(grid)
    kept = []
    for key, values in only:
        if key in ("seed", "target"):
            kept.append((key, list(values)))
            continue
        if key not in crossed:
            return None
        values = [v for v in values if v in crossed[key]]
        if not values:
            return None
        kept.append((key, values))
    return kept


def plan_table(table: Table, runs_root: Path, *, only: Sequence[tuple[str, Sequence[str]]] = (),
               overrides: Sequence = (), device: str | None = None, csv_dir: Path = CSV_DIR,
               progress: bool = False) -> TablePlan | None:
    """The table planned under ``runs_root/<table>`` (every run validated), split by what its CSV holds;
    None when ``only`` leaves it no run."""
    from fedstyle.experiments.grid import plan_grid

    grid = table.grid(overrides, device)
    mine = table_only(table, grid, only)
    if mine is None:
        return None
    plan = plan_grid(grid, Path(runs_root) / table.key, progress=progress, only=mine)
    lines = read_csv(table, csv_dir)
    held = _held(lines)
    out = TablePlan(table, plan, csv_lines=lines)
    for run in plan.runs:
        (out.in_csv if run_in_csv(run, held) else out.to_run).append(run)
    return out


def export_runs(table: Table, root: Path, csv_dir: Path = CSV_DIR, *, echo: Callable[[str], None] = print,
               csv: str | None = None, overrides: Sequence = ()) -> tuple[Path, int]:
    """Merge every finished run below ``root`` (a sweep of the table's file: made by ``fedstyle leaderboard run``
    or by ``fedstyle sweep FILE --out root``, with ``overrides`` its ``--set``) into the table's CSV (or into
    ``csv_dir/<csv>.csv``: the budget's runs). Only runs of the table's settings are merged: the table's grid is
    planned at ``root`` (with the runs' number of rounds, which each line keeps; no images are read) and a run
    folder holding other settings (another method, step count or hyperparameter) is a ConfigError, so no other
    experiment's numbers replace a kept line; a run outside the grid's folders is left out, and said. Returns
    the CSV's path and the runs merged."""
    from fedstyle.experiments.report.per_seed import merge_rows, record_rows, write_rows
    from fedstyle.experiments.report.runs import collect

    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root} is no folder of runs; give the --out of the table's sweep")
    from fedstyle.errors import DataError

    try:
        records = collect([str(root)])
    except DataError:  # no finished run there yet
        records = []
    planned = _plan_for_export(table, root, records, overrides) if records else []
    variant_of = {Path(run.run_dir).resolve(): run.variant for run in planned}
    new, merged, strangers = [], 0, []
    for record in records:
        variant = variant_of.get(Path(record.path).resolve())
        if variant is None:
            strangers.append(str(record.path))
            continue
        merged += 1
        for line in record_rows(record, variant=variant):
            new.append({**line, "rounds": str(record.config.get("rounds", ""))})
    if strangers:
        more = f" (and {len(strangers) - 1} more)" if len(strangers) > 1 else ""
        echo(f"{table.key}: left out {strangers[0]}{more}: not a run folder of the table's grid below {root}")
    path = Path(csv_dir) / f"{csv}.csv" if csv else csv_path(table, csv_dir)
    if new:
        from fedstyle.experiments.report.per_seed import read_rows

        kept = read_rows(path, COLUMNS) if path.exists() else []
        write_rows(path, merge_rows(kept, new, LINE_KEY), COLUMNS)
    return path, merged


def _plan_for_export(table: Table, root: Path, records: Sequence, overrides: Sequence = ()) -> list:
    """The table's runs planned at ``root`` with ``overrides`` and the finished runs' number of rounds (the
    budget's runs have their own); every run folder there checked against those settings, no images read."""
    from fedstyle.experiments.grid import plan_grid

    variants = {variant for variant, _, _ in table.rows()}
    # the rounds of the runs in the table's rows' folders (a stray run's do not count)
    ours = [r for r in records if Path(r.path).resolve().relative_to(root.resolve()).parts[:1] in
            {(v,) for v in variants}]
    rounds = sorted({int(r.config.get("rounds", 0)) for r in ours})
    if len(rounds) > 1:
        raise ConfigError(f"{root} holds runs of {' and '.join(map(str, rounds))} rounds; export the runs of each "
                          "budget from a folder of their own")
    grid = table.grid([*overrides, *([("rounds", rounds[0])] if rounds else [])])
    try:
        return plan_grid(grid, root, without_data=True, load_data=False).runs
    except ConfigError as err:
        raise ConfigError(f"{err}. Nothing was merged into the table's CSV: its lines are the table's own "
                          f"settings (benchmarks/leaderboard/{table.key}.toml, and --set)") from None


def run_table(table_plan: TablePlan, launcher=None, *, quiet: bool = False, csv_dir: Path = CSV_DIR,
              export_only: bool = False, overrides: Sequence = ()):
    """Run what the table's CSV lacks (sweep machinery), then merge the finished runs into the CSV.
    Returns (the sweep outcome or None, the CSV's path, the runs added to it)."""
    from fedstyle.experiments.grid import Plan
    from fedstyle.experiments.sweep import run_plan

    outcome = None
    if table_plan.to_run and not export_only:
        plan = table_plan.plan
        rows = [row for row in plan.rows if any(r.row == row for r in table_plan.to_run)]
        remaining = Plan(plan.grid, plan.out, list(table_plan.to_run), rows)
        outcome, _ = run_plan(remaining, launcher, quiet=quiet)
    path, added = export_runs(table_plan.table, table_plan.plan.out, csv_dir, overrides=overrides) \
        if table_plan.plan.out.is_dir() else (csv_path(table_plan.table, csv_dir), 0)
    return outcome, path, added


def dry_run_lines(plans: Sequence[TablePlan], estimate: Callable) -> list[str]:
    """What ``--dry-run`` prints: per table its runs (all validated), how many its CSV holds, how many are
    left, and the CPU hours of those left and of the whole table by ``estimate(table, run, unmeasured, how)``
    (a run's CPU seconds; see :meth:`~fedstyle.experiments.leaderboard.cost.CostModel.seconds`)."""
    lines = []
    total_left = total_all = 0.0
    unmeasured: set[str] = set()
    for tp in plans:
        counts = tp.counts()
        how: dict[str, set[str]] = {}
        per_row: dict[str, list[float]] = {}
        for run in tp.to_run:
            per_row.setdefault(run.variant, []).append(estimate(tp.table.key, run, unmeasured, how))
        left = sum(sum(seconds) for seconds in per_row.values())
        whole = left + sum(estimate(tp.table.key, run, unmeasured, {}) for run in tp.in_csv)
        total_left, total_all = total_left + left, total_all + whole
        lines.append(f"{tp.table.key} ({tp.table.title}): {counts['runs']} runs, every one validated; "
                     f"{counts['in_csv']} in {tp.table.csv}.csv, {counts['left']} left ({counts['done']} finished "
                     f"in their folders, to export; {counts['resume']} to resume; {counts['new']} new); "
                     f"about {left / 3600:.1f} CPU hours left of {whole / 3600:.1f}")
        for variant, seconds_each in per_row.items():
            seconds = sum(seconds_each) / len(seconds_each)
            charged = how.get(variant, set())
            note = (" (not measured: the table's median row)" if variant in unmeasured else
                    " (its finished runs' median)" if charged == {"finished"} else
                    " (its finished runs' median where a dataset has them)" if "finished" in charged else "")
            lines.append(f"    {variant:<22} {len(seconds_each):4d} runs x {seconds:6.0f} CPU s{note}")
        if tp.table.excluded:
            for method, reason in tp.table.excluded.items():
                lines.append(f"    excluded {method}: {reason}")
    lines.append(f"all tables: about {total_left / 3600:.1f} CPU hours left of {total_all / 3600:.1f} (one core "
                 "each: a row's finished CPU runs' median wall seconds on a dataset, else the estimate measured in "
                 "benchmarks/leaderboard/cost.json)")
    return lines
