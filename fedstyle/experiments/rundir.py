"""The run directory's guarantees: one writer at a time, nothing half-written, nothing silently lost.

- **Lock**: a run directory is written by one process at a time (:class:`~fedstyle.io.DirectoryLock`
  on ``DIR/.lock``; a killed process leaves no stale lock). A second run, resume or deployment into
  it is refused with the process that holds it.
- **New runs** start only in a directory that does not exist or is empty; one that fails before its
  first checkpoint removes what it wrote (an interrupted one stays resumable).
- **Resume** reads everything it trusts from the checkpoint, which is verified (SHA-256), checked
  against the run's model, and holds a copy of the metrics rows it covers: a truncated, damaged or
  deleted metrics.jsonl is restored from it. A run directory whose checkpoint is missing while
  its metrics show progress is refused (``--restart`` starts it over on purpose).
- **Leftovers** of dead processes (``.*.tmp`` beside the run's files) are removed on resume;
  those of a live process never are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.experiments.config import TRACKER_SETTINGS, RunConfig
from fedstyle.io import LOCK_NAME, remove_leftovers

CONFIG, METRICS, SUMMARY, DONE, PARTITION = "config.json", "metrics.jsonl", "summary.json", "done", "partition.json"
#: how `fedstyle deploy` starts the run's federation, written before config.json: a run directory holding
#: it continues only on a federation (`fedstyle deploy --resume`), never on the in-process simulator
DEPLOYMENT = "flower/deploy.json"

#: written when a run diverges (NaN or infinite loss or weights), with the error's message: resuming would repeat
#: the divergence (the same seeds), so the folder is a finished attempt, not an interrupted one
DIVERGED = "diverged.txt"


def diverged_note(out: Path) -> str:
    """The divergence recorded in ``out`` (its first line), or empty."""
    path = Path(out) / DIVERGED
    if not path.is_file():
        return ""
    return (path.read_text(errors="replace").strip().splitlines() or ["diverged"])[0]


#: what ``fedstyle run --resume`` accepts besides the run directory: where and how the run executes,
#: nothing that changes what it computes (--state-budget moves client states between memory and disk
#: bit for bit; the Ray settings place the clients — a cluster may come back at another address; like
#: --device, --client-cpus sets the actors' thread count, which can change floating-point rounding;
#: --tracker and its settings only log the run elsewhere)
RESUME_OPTIONS = ("device", "data_root", "quiet", "state_budget", "ray_address", "client_cpus", "client_gpus",
                  "target_eval", *TRACKER_SETTINGS)


def check_new_run_dir(out: Path) -> None:
    """Refuse an ``--out`` that is a file, already holds a run, or holds anything else."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory; choose another --out")
    if not out.exists():
        return
    entries = [e for e in out.iterdir() if e.name != LOCK_NAME and not e.name.endswith(".tmp")]
    if (out / CONFIG).exists():
        note = diverged_note(out)
        if note:
            raise ConfigError(f"{out} holds a run that diverged ({note}); delete it or choose another "
                              "--out, with a lower --lr")
        raise ConfigError(f"{out} already holds a run; continue it with `{resume_command(out)}` "
                          "or choose another --out")
    if entries:
        raise ConfigError(f"{out} exists and is not empty; choose another --out")


def resume_command(out: Path) -> str:
    """The command that continues the run in ``out`` on the runtime it was started with."""
    return f"fedstyle deploy --resume {out}" if (out / DEPLOYMENT).exists() else f"fedstyle run --resume {out}"


def refuse_deployment(out: Path) -> None:
    """A deployment's run directory is continued by its own runtime: the in-process simulator would run
    its config silently elsewhere than the federation it was started on."""
    if (out / DEPLOYMENT).exists():
        raise ConfigError(f"{out} was started by `fedstyle deploy`: continue it on its federation with "
                          f"`fedstyle deploy --resume {out}`")


def read_run_config(out: Path, starter: str = "fedstyle run") -> RunConfig:
    """The run directory's config.json (``starter``: the command that starts such a run, for the error)."""
    path = out / CONFIG
    if not out.is_dir():
        what = "it is a file" if out.exists() else "it does not exist"
        raise ConfigError(f"{out} holds no run ({what}); start one with `{starter} --out {out} ...`")
    if not path.exists():
        raise ConfigError(f"{out} holds no run (no {CONFIG}); start one with `{starter} --out {out} ...`")
    try:
        values = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{path} is not valid JSON: the run directory is damaged; start a new run") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} does not hold a run configuration; start a new run")
    # a run saved before official splits existed split every domain by the seeded rule: resume it so
    values.setdefault("official_splits", False)
    return RunConfig.from_mapping(values, where=str(path))


def read_summary(out: Path) -> dict[str, Any] | None:
    """summary.json of a finished run, or None when it is missing or unreadable (it is then rebuilt)."""
    try:
        summary = json.loads((out / SUMMARY).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def read_metrics_file(path: Path) -> list[dict[str, Any]]:
    """The readable rows of metrics.jsonl up to the first damaged one (a row cut by a kill, say)."""
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return rows
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if not isinstance(row, dict) or ("round" not in row and "event" not in row):
            break
        rows.append(row)
    return rows


def evaluation_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "round" in r and "event" not in r]


def clean_leftovers(out: Path) -> int:
    """Remove temporaries that dead processes left in the run directory (never a live one's)."""
    return remove_leftovers(out, ".*.tmp")


def check_checkpoint_fits(fresh: dict[str, Any], saved: dict[str, Any], run_dir: Path) -> None:
    """The checkpoint's model tensors have the keys and shapes of this run's model."""
    model_prefixes = ("global/", "device/", "momentum/")
    want = {k: tuple(v.shape) for k, v in fresh.items() if k.startswith(model_prefixes)}
    have = {k: tuple(v.shape) for k, v in saved.items() if k.startswith(model_prefixes)}
    if want == have:
        return
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    reshaped = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    detail = "; ".join(part for part in (
        f"missing {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "") if missing else "",
        f"unexpected {extra[0]}" + (f" and {len(extra) - 1} more" if len(extra) > 1 else "") if extra else "",
        f"{reshaped[0]} is {have[reshaped[0]]}, the model's is {want[reshaped[0]]}" if reshaped else "",
    ) if part)
    raise FedstyleError(f"{run_dir / 'checkpoint.safetensors'} holds another model than this run's config "
                        f"builds ({detail}); it belongs to a different run — restore this run's checkpoint or "
                        f"start over with `fedstyle run --resume {run_dir} --restart`")
