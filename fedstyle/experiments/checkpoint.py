"""Run checkpoints: every tensor of the run state in one safetensors file, bookkeeping in its metadata.

One file, replaced atomically, so a run killed at any moment leaves either the previous checkpoint
or the new one — never a mix. The metadata holds the run's bookkeeping as JSON (round, time,
selector, traffic, and a copy of the metrics.jsonl rows the checkpoint covers, so a damaged or
truncated metrics file is restored on resume) and a SHA-256 over that JSON and every tensor's name,
dtype, shape and bytes: a flipped bit anywhere in the file is refused on load. A write that fails
(a full disk) is one line naming the file, and leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fedstyle.errors import FedstyleError
from fedstyle.io import aligned, atomic_write, disk_full, free_text, human_bytes, tensors_digest

CHECKPOINT = "checkpoint.safetensors"
_META_KEY = "fedstyle"
_DIGEST_KEY = "sha256"
#: checkpoints from version 2 on carry the digest (older ones are read without verification)
FORMAT = 2


class CheckpointError(FedstyleError):
    """A checkpoint that cannot be trusted: damaged, foreign, or of another model."""


def save_checkpoint(run_dir: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    # safetensors wants contiguous CPU tensors that share no storage
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    meta_json = json.dumps({**meta, "format": FORMAT}, allow_nan=False)
    metadata = {_META_KEY: meta_json, _DIGEST_KEY: tensors_digest(meta_json, plain)}
    path = run_dir / CHECKPOINT
    had = path.exists()
    try:
        return atomic_write(path, lambda tmp: save_file(plain, str(tmp), metadata=metadata))
    except (OSError, SafetensorError) as err:  # the temporary is gone; the previous checkpoint is as it was
        kept = (f"the checkpoint there is unchanged: free space and continue the run with --resume {run_dir}"
                if had else "no checkpoint was written")  # `fedstyle run` or `fedstyle deploy`: both save here
        if disk_full(err):
            size = sum(t.numel() * t.element_size() for t in plain.values())
            raise CheckpointError(f"no space left on device for the checkpoint {path} (it needs {human_bytes(size)}, "
                                  f"{free_text(run_dir)}); {kept}") from None
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0][:120]
        raise CheckpointError(f"cannot write the checkpoint {path}: {reason}; {kept}") from None


def load_checkpoint(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The checkpoint's tensors and bookkeeping, verified against its digest; None when there is none."""
    path = run_dir / CHECKPOINT
    if not path.exists():
        return None
    damaged = (f"{path} is damaged or not a fedstyle checkpoint ({{}}); restore it from a copy, or start the run "
               f"over with `fedstyle run --resume {run_dir} --restart`")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = {k: aligned(v) for k, v in load_file(str(path)).items()}  # see fedstyle.io.aligned
        meta_json = metadata[_META_KEY]
        meta = json.loads(meta_json)
    except Exception as err:  # a foreign, truncated or damaged file
        reason = f"missing {err}" if isinstance(err, KeyError) else str(err).splitlines()[0][:120]
        raise CheckpointError(damaged.format(reason)) from None
    if not isinstance(meta, dict) or "round" not in meta:
        raise CheckpointError(damaged.format("no run bookkeeping in its metadata"))
    if meta.get("format", 1) >= FORMAT or _DIGEST_KEY in metadata:
        if metadata.get(_DIGEST_KEY) != tensors_digest(meta_json, tensors):
            raise CheckpointError(damaged.format("its SHA-256 does not match what was written"))
    return tensors, meta
