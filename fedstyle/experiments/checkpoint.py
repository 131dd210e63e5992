"""Run checkpoints: every tensor of the run state in one safetensors file, bookkeeping in its metadata.

One file, replaced atomically, so a run killed at any moment leaves either the previous checkpoint
or the new one — never a mix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fedstyle.errors import FedstyleError
from fedstyle.io import aligned, atomic_write

CHECKPOINT = "checkpoint.safetensors"
_META_KEY = "fedstyle"


def save_checkpoint(run_dir: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    # safetensors wants contiguous CPU tensors that share no storage
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    return atomic_write(run_dir / CHECKPOINT, lambda tmp: save_file(plain, str(tmp), metadata={_META_KEY: json.dumps(meta)}))


def load_checkpoint(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    path = run_dir / CHECKPOINT
    if not path.exists():
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()[_META_KEY])
        return {k: aligned(v) for k, v in load_file(str(path)).items()}, meta
    except Exception as err:  # a foreign or damaged file
        raise FedstyleError(f"cannot read checkpoint {path}: {err}; delete it to restart the run from scratch") from None
