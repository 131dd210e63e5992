"""Reading finished run directories back: :class:`RunRecord` per run, :func:`load_run` and :func:`collect`.

Checks each ``summary.json`` against what the runner writes, and tolerates a truncated last line of
``metrics.jsonl`` only in a run that has no ``done`` marker.
"""

from __future__ import annotations

import json
import os
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from fedstyle.environment import describe, differences
from fedstyle.errors import ConfigError, DataError
from fedstyle.experiments.config import TRACKER_SETTINGS, inactive_settings
from fedstyle.experiments.rundir import diverged_note

WHICH = {"selected": "model chosen by the run's selection rule", "last": "last round"}
#: config keys that do not make two runs' results different settings (where and how a run ran, its
#: name, what the table shows as columns or rows anyway)
NOT_SETTINGS = frozenset({"seed", "targets", "device", "client_batching", "backend", "label", "data_root", "skip_bad_images",
                          "allow_oracle", "selection", "method", "ray_address", "client_cpus", "client_gpus",
                          "state_budget", "target_eval", *TRACKER_SETTINGS})


def _plain(value: object) -> object:
    """A setting as a hashable, printable value (lists become comma-joined strings)."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return value


@dataclass(frozen=True)
class RunRecord:
    """One run directory: its resolved config, summary, per-evaluation metrics, and completeness."""

    path: Path
    config: dict
    summary: dict
    metrics: list[dict]
    complete: bool

    @property
    def method(self) -> str:
        return self.summary["method"]

    @property
    def label(self) -> str:
        return self.summary.get("label") or self.summary["method"]

    def settings(self) -> dict[str, object]:
        """The run's comparable settings: config.json without where and how it ran and without the settings its
        other settings leave unread (:func:`~fedstyle.experiments.config.inactive_settings`), the method's
        hyperparameters as ``hp.NAME``."""
        unread = inactive_settings(self.config)
        out = {k: _plain(v) for k, v in self.config.items()
               if k not in NOT_SETTINGS and k != "hparams" and k not in unread}
        out.update({f"hp.{k}": _plain(v) for k, v in (self.config.get("hparams") or {}).items()})
        return out

    @property
    def dataset(self) -> str:
        return self.summary["dataset"]

    @property
    def seed(self) -> int:
        return self.summary["seed"]

    @property
    def selection(self) -> str:
        return self.summary["selection"]

    def target_accuracy(self, which: str) -> dict[str, float]:
        """Held-out domain -> accuracy (fraction) of the ``which`` ("selected"/"last") model."""
        return {
            domain: entry[which]
            for domain, entry in self.summary["targets"].items()
            if entry.get(which) is not None
        }

    def source_val_accuracy(self, which: str) -> float | None:
        """Mean source-validation accuracy (fraction) of the ``which`` model: the evaluation of the
        selected round ("selected") or the last evaluation ("last"); None when the metrics lack it.
        Beside the target accuracy it tells underfitting (both low) from a domain gap (only the target)."""
        rows = [r for r in self.metrics if isinstance(r.get("source_val_acc"), dict) and r["source_val_acc"]
                and "round" in r]
        if which == "selected":
            rows = [r for r in rows if r["round"] == self.summary.get("selected_round")]
        if not rows:
            return None
        values = [v for v in rows[-1]["source_val_acc"].values() if isinstance(v, (int, float))]
        return statistics.fmean(values) if values else None


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} is missing; is {path.parent} a fedstyle run directory?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error}); re-run or delete that run") from None
    if not isinstance(value, dict):
        raise DataError(f"{path} should hold a JSON object, found {type(value).__name__}")
    return value


def read_metrics(path: Path, complete: bool) -> list[dict]:
    if not path.is_file():
        return []
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise DataError(f"{path} is not a text file (a damaged or foreign metrics.jsonl); re-run that run") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise json.JSONDecodeError("not a JSON object", line, 0)
            rows.append(row)
        except json.JSONDecodeError as error:
            # A run that stopped mid-write can leave a truncated last line; anything else is damage.
            if not complete and number == len(lines):
                break
            raise DataError(f"{path} line {number} is not valid JSON ({error}); re-run that run") from None
    return rows


def _is_accuracy(value: object) -> bool:
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
    )


def _validate_summary(summary: dict, path: Path) -> None:
    for key in ("method", "dataset", "seed", "selection", "targets"):
        if key not in summary:
            raise DataError(f"{path} lacks the key {key!r}; it was not written by this fedstyle runner")
    if not isinstance(summary["seed"], int) or isinstance(summary["seed"], bool):
        raise DataError(f"{path}: 'seed' should be an integer, found {summary['seed']!r}")
    targets = summary["targets"]
    if not isinstance(targets, dict):
        raise DataError(f"{path}: 'targets' should map each held-out domain to its accuracies")
    for domain, entry in targets.items():
        if not isinstance(entry, dict) or not all(_is_accuracy(entry.get(k)) for k in WHICH):
            raise DataError(
                f"{path}: targets[{domain!r}] should be {{'selected': acc, 'last': acc}} with "
                f"accuracies as fractions in [0, 1], found {entry!r}"
            )


def load_run(run_dir: Path) -> RunRecord:
    """Load one run directory (it must contain ``summary.json``)."""
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json")
    _validate_summary(summary, run_dir / "summary.json")
    config_path = run_dir / "config.json"
    config = _read_json(config_path) if config_path.exists() else {}
    complete = (run_dir / "done").exists()
    metrics = read_metrics(run_dir / "metrics.jsonl", complete)
    return RunRecord(path=run_dir, config=config, summary=summary, metrics=metrics, complete=complete)


def _find_run_dirs(roots: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(dirs with summary.json, dirs with metrics.jsonl but no summary.json) under ``roots``."""
    found: dict[Path, None] = {}
    unfinished: dict[Path, None] = {}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise DataError(f"run directory {root} does not exist (or is not a directory)")
        if (root / "summary.json").is_file():
            found.setdefault(root.resolve(), None)
            continue
        for summary in sorted(root.rglob("summary.json")):
            found.setdefault(summary.parent.resolve(), None)
        for metrics in sorted(root.rglob("metrics.jsonl")):
            if not (metrics.parent / "summary.json").exists():
                unfinished.setdefault(metrics.parent.resolve(), None)
    return list(found), list(unfinished)


def collect(run_dirs: Sequence[str | os.PathLike], *, include_incomplete: bool = False) -> list[RunRecord]:
    """Load the runs in ``run_dirs``: run directories, or folders searched recursively for them.

    Runs without the ``done`` marker are skipped with a warning that lists them, unless
    ``include_incomplete``. Folders holding metrics but no ``summary.json`` yet (still running or
    crashed) cannot be tabulated and are only listed in a warning.
    """
    if not run_dirs:
        raise ConfigError("no run directories given; pass run directories or a folder containing them")
    found, unfinished = _find_run_dirs(Path(d) for d in run_dirs)
    notes = {d: diverged_note(d) for d in unfinished}
    listing = "\n  ".join(f"{d}{f' (diverged: {notes[d]})' if notes[d] else ''}" for d in unfinished)
    roots = ", ".join(str(d) for d in run_dirs)
    if not found and unfinished:
        raise DataError(f"no finished run under {roots}: {len(unfinished)} run(s) without summary.json: "
                        f"{listing.replace(chr(10) + '  ', '; ')} (still running, crashed or diverged; `fedstyle "
                        "run --resume DIR` finishes one that stopped)")
    if unfinished:
        warnings.warn(
            f"{len(unfinished)} run(s) have no summary.json yet (still running, crashed or diverged) and are "
            f"not reported:\n  {listing}",
            stacklevel=2,
        )
    if not found:
        raise DataError(f"no run directories (with summary.json) under {roots}; check the path")
    records = [load_run(d) for d in found]
    incomplete = [r for r in records if not r.complete]
    if incomplete and not include_incomplete:
        listing = "\n  ".join(str(r.path) for r in incomplete)
        warnings.warn(
            f"skipping {len(incomplete)} incomplete run(s) without a 'done' marker "
            f"(include them with include_incomplete=True / --include-incomplete):\n  {listing}",
            stacklevel=2,
        )
        records = [r for r in records if r.complete]
    # --protocol all: the model to deploy, trained on every domain; a report compares held-out accuracy
    untested = [r for r in records if not r.summary["targets"]]
    if untested:
        listing = "\n  ".join(str(r.path) for r in untested)
        if len(untested) == len(records):
            raise DataError(f"the run(s) under {roots} hold no domain out (--protocol all), and a report compares "
                            "held-out accuracy; each run's source validation is in its summary.json (source_val). "
                            "Compare methods with --protocol lodo, ltdo or single_source")
        warnings.warn(f"{len(untested)} run(s) hold no domain out (--protocol all) and are not reported:\n  "
                      f"{listing}", stacklevel=2)
        records = [r for r in records if r.summary["targets"]]
    return records


def environment_note(records: Sequence[RunRecord]) -> str:
    """One line saying in which fields the runs' environments (summary.json ``environment``, and
    ``environment_resumed`` of a run finished elsewhere) differ; empty when they agree or none recorded one."""
    environments = [env for r in records for env in (r.summary.get("environment"), r.summary.get("environment_resumed"))
                    if isinstance(env, dict)]
    found = differences(*environments) if len(environments) > 1 else {}
    if not found:
        return ""
    return (f"the runs come from different environments ({describe(found)}); their numbers may differ for that "
            f"reason too (each run's summary.json says where it ran)")

