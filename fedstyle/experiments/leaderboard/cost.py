"""The leaderboard's CPU-hours estimate, from measured seconds (benchmarks/leaderboard/cost.json, written by
benchmarks/leaderboard/measure_cost.py; its ``basis`` says how it was measured).

A row's run on dataset D costs ``s(row, 1 round) x s(reference, whole run on D) / s(reference, 1 round) x R /
R_whole`` CPU seconds: its measured one-round run (on the table's first dataset) scaled by the table's reference
row's (FedAvg, DSGD) measured ratio of a whole run on D (``R_whole`` rounds) to one round, and by the run's rounds
``R`` over ``R_whole``. The whole runs are measured per dataset because evaluation differs: fashion4's domains hold
17,500 images, digits4's 2,500 to 5,000. A row the file lacks (a method registered after the measurement) is
charged the table's median row and named as not measured. A file measured before per-dataset whole runs gives one
number for every dataset.

The grid's own finished runs come first (:meth:`CostModel.learn_finished`): a run whose row, dataset and rounds
have finished CPU runs in the table's CSV is charged their median wall seconds. The scaling above assumes a row's
extra work grows with the data as FedAvg's does, and some rows' does not: FedDG-GA measures its gaps on each
client's whole training split every round, so its fashion4 run took about 10x FedAvg's, its digits4 run 2.5x.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fedstyle.errors import ConfigError


class CostModel:
    """CPU seconds per run, per table and row, from a cost.json."""

    def __init__(self, data: dict, where: str = "cost.json"):
        self.where = where
        self.tables = data.get("tables", {})
        self.basis = data.get("basis", "")
        self.date = data.get("date", "")
        #: (table, row, dataset, rounds) -> wall seconds of its finished CPU runs
        self.finished: dict[tuple, list[float]] = {}

    def learn_finished(self, table: str, lines) -> None:
        """Keep the wall seconds of a table's finished CPU runs (its CSV's lines: variant, dataset, rounds,
        device, seconds); a GPU run's seconds say nothing of a CPU's."""
        for line in lines:
            if line.get("device") == "cpu" and line.get("seconds"):
                key = (table, line["variant"], line["dataset"], int(line["rounds"]))
                self.finished.setdefault(key, []).append(float(line["seconds"]))

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path} does not exist: measure the runs' cost first with "
                              "`python benchmarks/leaderboard/measure_cost.py`")
        return cls(json.loads(path.read_text()), str(path))

    def seconds(self, table: str, variant: str, unmeasured: set[str] | None = None, rounds: int | None = None,
                dataset: str | None = None, how: dict[str, set[str]] | None = None) -> float:
        """A run's CPU seconds (see the module docstring); ``unmeasured`` collects the rows charged the median;
        ``how`` records per row what each run was charged: "finished" (its finished runs' median) or "estimate"."""
        measured = self.finished.get((table, variant, dataset, rounds))
        if how is not None:
            how.setdefault(variant, set()).add("finished" if measured else "estimate")
        if measured:
            return statistics.median(measured)
        entry = self.tables.get(table)
        if not entry:
            raise ConfigError(f"{self.where} has no measurement of table {table!r}: run "
                              f"`python benchmarks/leaderboard/measure_cost.py --tables {table}`")
        rows = entry["rows_one_round"]
        whole = entry["reference_whole"]
        if isinstance(whole, dict):  # per dataset
            if dataset not in whole:
                raise ConfigError(f"{self.where} has no whole run of table {table!r} on {dataset!r}: run "
                                  f"`python benchmarks/leaderboard/measure_cost.py --tables {table}`")
            whole = whole[dataset]
        scale = whole / entry["reference_one_round"]
        if rounds is not None:
            scale *= rounds / entry["reference_rounds"]
        if variant not in rows:
            if unmeasured is not None:
                unmeasured.add(variant)
            return statistics.median(rows.values()) * scale
        return rows[variant] * scale

    def run_seconds(self, table: str, run, unmeasured: set[str] | None = None,
                    how: dict[str, set[str]] | None = None) -> float:
        return self.seconds(table, run.variant, unmeasured, run.config.rounds, run.config.dataset, how)
