"""Atomic file writes: a file is either absent, the old version, or the complete new one."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    with _temporary_beside(path) as tmp:
        write(tmp)
    return path


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; it replaces ``path`` only if the block succeeds."""
    text_options = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
    with _temporary_beside(Path(path)) as tmp, open(tmp, mode, **text_options) as file:
        yield file


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def aligned(tensor):
    """``tensor`` in memory from torch's own allocator (64-byte aligned on the CPU), copied if it is not.

    Tensors read from a file (safetensors) or a message (NumPy) may start at any 8-byte boundary;
    CPU reductions — a BLAS dot product such as FedDyn's ``<grad, w>`` — peel a different number of
    leading elements at another alignment and round differently. Aligned as the simulator's own
    tensors are, a resumed run and a Flower run stay bitwise equal to an uninterrupted in-process one.
    """
    if tensor.device.type == "cpu" and tensor.data_ptr() % 64:
        return tensor.clone()
    return tensor
