"""Per-seed result files: one CSV line per (run, held-out target), kept in the repository
(benchmarks/per_seed/NAME.csv), so a verdict by :mod:`fedstyle.experiments.verdict`'s rule and the leaderboard
can be read again without the run folders (large, and gone with the machine they ran on).

A line: ``label`` (the report's row name), ``variant`` (the sweep's row), ``dataset``, ``target``, ``seed``,
``target_acc`` (the selected model's accuracy on the target, in percent), ``source_val`` (the same model's mean
source-validation accuracy, in percent), ``device``, ``seconds`` (the run's wall time). The leaderboard's files
add ``method`` and ``source`` (single-source runs' one source domain). Used by benchmarks/per_seed.py and
``fedstyle leaderboard``.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from fedstyle.errors import ConfigError
from fedstyle.experiments.verdict import source_cell, target_cell

COLUMNS = ("label", "variant", "dataset", "target", "seed", "target_acc", "source_val", "device", "seconds")


def record_rows(record, which: str = "selected", *, variant: str, label: str | None = None) -> list[dict[str, str]]:
    """The lines of one finished run (a :class:`~fedstyle.experiments.report.runs.RunRecord`), one per held-out
    target; ``label`` names the row instead of the run's own (``{label}`` in it stands for the run's)."""
    source_val = record.source_val_accuracy(which)
    name = label.replace("{label}", record.label) if label else record.label
    return [{"label": name, "method": record.method, "variant": variant, "dataset": record.dataset,
             "source": str(record.config.get("source") or ""), "target": target, "seed": str(record.seed),
             "target_acc": f"{100 * acc:.2f}", "source_val": "" if source_val is None else f"{100 * source_val:.2f}",
             "device": ran_on(record), "seconds": str(record.summary.get("seconds", ""))}
            for target, acc in sorted(record.target_accuracy(which).items())]


def ran_on(record) -> str:
    """Where the run ran: summary.json's environment (``cpu``, ``cuda``; ``cuda+cpu`` for a run resumed on another
    device), else the configured ``--device`` (a run from before environments were recorded: maybe ``auto``)."""
    started = (record.summary.get("environment") or {}).get("device")
    if not started:
        return str(record.config.get("device", ""))
    finished = (record.summary.get("environment_resumed") or {}).get("device", started)
    return started if finished == started else f"{started}+{finished}"


def sort_key(row: Mapping[str, str]) -> tuple:
    return (row["label"], row["dataset"], row.get("source", ""), row["target"], int(row["seed"]))


def write_rows(path: Path, rows: Iterable[Mapping[str, str]], columns: Sequence[str] = COLUMNS) -> Path:
    """``rows`` sorted (label, dataset, source, target, seed) into the CSV ``path``, written atomically."""
    from fedstyle.io import atomic_write_text

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(sorted(rows, key=sort_key))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buffer.getvalue())
    return path


#: columns that hold numbers: (parse, may be empty) -- a run without source validation writes source_val ""
NUMERIC = {"seed": (int, False), "rounds": (int, False), "target_acc": (float, False), "source_val": (float, True),
           "seconds": (float, True)}


#: columns of percentages
PERCENT = ("target_acc", "source_val")


def read_rows(path: Path, required: Sequence[str] = ()) -> list[dict[str, str]]:
    """The lines of a per-seed CSV. A ConfigError names the files beside it when it does not exist, a column of
    ``required`` its header lacks, and the line when one has too few or too many fields, a number column that is
    not a finite number or a percentage outside 0-100 (a hand edit, a merge conflict), so no reader fails later
    on a value it cannot read or ranks one it should not."""
    path = Path(path)
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in path.parent.glob("*.csv"))) or "none"
        raise ConfigError(f"{path} does not exist; the tables kept here: {have}")
    fix = f"mend or delete that line (a kept CSV is in git: `git diff {path}` shows what changed)"
    rows = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path} has no column {', '.join(missing)} (its header: "
                              f"{','.join(reader.fieldnames or []) or 'none'}; wanted: {','.join(required)}); "
                              f"mend the header (`git diff {path}` shows what changed)")
        for row in reader:
            if None in row or None in row.values():
                count = len([v for k, v in row.items() if k is not None and v is not None]) + len(row.get(None, []))
                raise ConfigError(f"{path}, line {reader.line_num}: {count} fields where the header has "
                                  f"{len(reader.fieldnames)}; {fix}")
            for column, (parse, may_be_empty) in NUMERIC.items():
                value = row.get(column)
                if value is None or (value == "" and may_be_empty):
                    continue
                try:
                    number = parse(value)
                except ValueError:
                    number = math.nan
                if not math.isfinite(number):
                    raise ConfigError(f"{path}, line {reader.line_num}: {column} = {value!r} is not "
                                      f"{'an integer' if parse is int else 'a finite number'}; {fix}")
                if column in PERCENT and not 0 <= number <= 100:
                    raise ConfigError(f"{path}, line {reader.line_num}: {column} = {value} is no percentage "
                                      f"(0 to 100); {fix}")
            rows.append(row)
    return rows


def merge_rows(kept: Iterable[Mapping[str, str]], new: Iterable[Mapping[str, str]],
               key: Sequence[str]) -> list[dict[str, str]]:
    """``kept`` with ``new`` added; a new line replaces a kept one with the same ``key`` columns (a run made
    again), kept lines no new one replaces stay (runs made on another machine)."""
    merged = {tuple(row.get(k, "") for k in key): dict(row) for row in kept}
    merged.update({tuple(row.get(k, "") for k in key): dict(row) for row in new})
    return list(merged.values())


def accuracies(rows: Iterable[Mapping[str, str]], label: str, dataset: str | None = None,
               cell=None) -> dict[tuple[str, int], float]:
    """(cell, seed) -> target accuracy (%) of one row, the form :func:`~fedstyle.experiments.verdict.judge_paired`
    takes; a cell is "dataset → target" unless ``cell(row)`` says otherwise. A single-source line (its ``source``
    set) belongs to the cell of its source, "dataset: source →", valued at the mean over its targets, as the
    leaderboard's single-source table pairs them. Two lines of one row for the same target, source and seed
    (two budgets in one file, say) are refused: pairing would keep one of them silently."""
    rows = list(rows)
    name = cell or (lambda r: source_cell(r["dataset"], r["source"]) if r.get("source")
                    else target_cell(r["dataset"], r["target"]))
    values: dict[tuple[str, int], list[float]] = {}
    seen: dict[tuple, Mapping[str, str]] = {}
    for r in rows:
        if r["label"] != label or dataset not in (None, r["dataset"]):
            continue
        run = (r["dataset"], r.get("source", ""), r["target"], int(r["seed"]))
        if run in seen:
            differs = [k for k in r if k not in ("target_acc", "source_val", "seconds") and r[k] != seen[run].get(k)]
            raise ConfigError(f"two lines of {label!r} for {target_cell(r['dataset'], r['target'])}, seed {r['seed']}"
                              f"{f', source {run[1]}' if run[1] else ''}"
                              f"{' (they differ in ' + ', '.join(differs) + ')' if differs else ''}; "
                              f"keep one line per run (one file per budget) to pair them")
        seen[run] = r
        values.setdefault((name(r), int(r["seed"])), []).append(float(r["target_acc"]))
    if not values:
        labels = ", ".join(sorted({r["label"] for r in rows}))
        raise ConfigError(f"no row {label!r}{f' on {dataset}' if dataset else ''}; the rows: {labels}")
    return {key: statistics.fmean(accs) for key, accs in values.items()}
