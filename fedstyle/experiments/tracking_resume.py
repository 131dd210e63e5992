"""What ``--resume`` and ``--restart`` may do to the trackers' runs (:mod:`fedstyle.experiments.tracking`).

A tracker that has logged (named in ``RUN_DIR/tracking.json``) goes on where it logs: a resume may add
trackers, never drop one (its MLflow run would stay RUNNING with the rounds so far) or move one to
another ``--mlflow-uri`` / ``--tensorboard-dir`` (the run would be split over two places); both are
refused with one line naming ``--restart``, which closes the old runs and starts new ones. A tracker
added to a finished run logs its rows and files.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fedstyle.errors import ConfigError
from fedstyle.experiments.tracking import TRACKERS, Trackers, probe_trackers, read_tracking_state, resolve_locations


def tracker_changes_on_resume(config, changes: dict[str, Any], out: Path, finished: bool = False) -> dict[str, Any]:
    """``changes`` (the settings given with --resume) with the tracker settings the run goes on with.

    Trackers may be added. One that has logged (named in tracking.json) goes on where it logs: giving
    --tracker without it, or another location for it, is refused — its run would be left RUNNING
    with the rounds so far, or split over two places. Without --tracker, the run logs on to every
    tracker it has logged to (config.json lists those of its start, tracking.json also those added
    on a resume); a location given for a tracker that has not logged yet is taken. ``finished``: the
    run is complete, its tracker runs too, so leaving one out of --tracker drops nothing.
    """
    saved = {name: state for name, state in read_tracking_state(out).items()
             if name in TRACKERS and isinstance(state, dict)}
    changes = dict(changes)
    given = changes.get("trackers")
    trackers = list(dict.fromkeys([*config.trackers, *saved])) if given is None else list(given)
    for name, state in saved.items():
        cls = TRACKERS.get(name)
        if name not in trackers and finished:
            continue
        if name not in trackers:
            flags = " ".join(f"--tracker {n}" for n in trackers)
            raise ConfigError(f"{flags} without --tracker {name} would leave its run ({cls.describe(state)}) "
                              f"unfinished; give --tracker {name} too, or start over with new tracker runs: "
                              f"fedstyle run --resume {out} --restart {flags}")
        where, wanted = state.get(cls.state_key), changes.get(cls.option)
        resolved = wanted and getattr(resolve_locations(config.updated(trackers=trackers, **{cls.option: wanted})),
                                      cls.option)
        if wanted is not None and resolved.rstrip("/") != str(where).rstrip("/"):
            flag = "--" + cls.option.replace("_", "-")
            raise ConfigError(f"{flag} {wanted}: this run's --tracker {name} logs to {cls.describe(state)} "
                              f"(tracking.json), and a tracker run cannot move; drop {flag} to log on there, or "
                              f"start over with new tracker runs: fedstyle run --resume {out} --restart {flag} {wanted}")
        changes[cls.option] = where
    for name in TRACKERS.names():  # config.json's location of a tracker no longer given goes with it
        option = TRACKERS.get(name).option
        if name not in trackers and changes.get(option) is None:
            changes[option] = None
    changes["trackers"] = trackers
    return changes


def close_logged_runs(out: Path) -> None:
    """--restart: end the tracker runs tracking.json names that are still open (a killed run's MLflow
    run stays RUNNING); one that cannot be reached is named in a warning, the restart goes on."""
    for name, state in read_tracking_state(out).items():
        if name in TRACKERS and isinstance(state, dict):
            try:
                TRACKERS.get(name).close(state)
            except Exception as err:
                print(f"fedstyle: warning: --restart could not close {TRACKERS.get(name).describe(state)} "
                      f"({err}); it stays open there", file=sys.stderr)


def log_finished_run(config, changes: dict[str, Any], out: Path, rows: list[dict[str, Any]]) -> None:
    """``--resume DIR --tracker NAME`` on a finished run: each tracker new to it logs its rows and files
    (a tracker that has logged is not moved: refused as on any resume)."""
    config = resolve_locations(config.updated(**tracker_changes_on_resume(config, changes, out, finished=True)))
    probe_trackers(config)
    trackers = Trackers(config, out)
    trackers.active = [t for t in trackers.active if t.name not in trackers.saved]
    if trackers.active:
        trackers.start(rows)
        trackers.finish("FINISHED")
