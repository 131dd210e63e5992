"""Where a run ran: the software and hardware that can change its numbers, recorded once per run.

Two runs of one config can differ in their last digits when torch, the BLAS threads or the device differ; a
run that records them can be told apart from a bug. :func:`probe` returns fedstyle's version and git commit
(with a dirty flag; None outside a git checkout), Python, torch, CUDA and cuDNN (None unless the run's device
is a GPU), the device's name, the CPU model, torch's thread count and the versions of the key dependencies.
It costs one ``git`` call per process (cached), never one per round. :func:`differences` names the fields in
which two records differ, for ``fedstyle report`` and ``fedstyle run --resume``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

#: distributions whose versions a run records besides torch: those that compute (numpy, scipy, torchvision), read
#: data (pillow, safetensors, datasets) or carry a federation (flwr, ray); absent ones are left out
KEY_PACKAGES = ("numpy", "scipy", "scikit-learn", "pillow", "safetensors", "matplotlib", "networkx", "torchvision",
                "finch-clust", "flwr", "ray", "datasets", "mlflow-skinny", "tensorboard")

#: seconds a ``git`` call may take before the commit is recorded as unknown (a hung network filesystem, say)
GIT_TIMEOUT = 5.0


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS`` stdout, or None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout at ``root``; (None, None) when ``root`` is not one (an installed
    wheel) or git cannot say. Dirty: a tracked file differs from the commit (untracked files do not count)."""
    if not (root / ".git").exists():  # a directory in a clone, a file in a worktree
        return None, None
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return commit.strip(), None if status is None else bool(status.strip())


def _cpu_model() -> str | None:
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere what the platform module says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            for line in file:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


@functools.cache
def _process_record() -> dict[str, Any]:
    """What stays fixed for the life of the process (computed once: a git call and the package versions)."""
    commit, dirty = git_state(Path(__file__).resolve().parent.parent)
    return {
        "fedstyle": _version("fedstyle"),
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "packages": {name: v for name in KEY_PACKAGES if (v := _version(name)) is not None},
    }


def probe(device: Any = "cpu") -> dict[str, Any]:
    """The environment of a run on ``device`` (a name or ``torch.device``) as a JSON-ready dict."""
    import torch

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    if on_gpu:
        device_name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        device_name = _process_record()["cpu"]
    else:
        device_name = device.type  # mps: Apple's GPU has no model name in torch
    record = {**_process_record(), "torch": torch.__version__, "device": str(device), "device_name": device_name,
              "cuda": torch.version.cuda if on_gpu else None,
              "cudnn": torch.backends.cudnn.version() if on_gpu and torch.backends.cudnn.is_available() else None,
              "torch_threads": torch.get_num_threads()}
    record["packages"] = dict(record.pop("packages"))  # a copy: the cached record stays as probed
    return record


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """``packages`` flattened to ``packages.numpy`` and so on, so a difference names the package."""
    flat = {k: v for k, v in record.items() if k != "packages"}
    flat.update({f"packages.{k}": v for k, v in (record.get("packages") or {}).items()})
    return flat


def differences(*records: dict[str, Any]) -> dict[str, list[Any]]:
    """Field -> the distinct values it takes across ``records``, for each field that is not the same in all
    (``packages.numpy`` for a package; a package missing from a record counts as None)."""
    flats = [_flat(r) for r in records]
    fields = sorted({k for flat in flats for k in flat})
    found = {}
    for field in fields:
        values: list[Any] = []
        for flat in flats:
            if flat.get(field) not in values:
                values.append(flat.get(field))
        if len(values) > 1:
            found[field] = values
    return found


def describe(found: dict[str, list[Any]], limit: int = 4) -> str:
    """``torch 2.1.0 / 2.4.1, torch_threads 2 / 8`` (at most ``limit`` fields, then ``and N more``)."""
    parts = [f"{field} {' / '.join(map(str, values))}" for field, values in list(found.items())[:limit]]
    if len(found) > limit:
        parts.append(f"and {len(found) - limit} more")
    return ", ".join(parts)


if __name__ == "__main__":  # python -m fedstyle.environment: what a run here would record
    import json

    json.dump(probe(sys.argv[1] if len(sys.argv) > 1 else "cpu"), sys.stdout, indent=2)
    print()
