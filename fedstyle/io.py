"""Files that never lie: atomic writes, temporaries that name their owner, and directory locks.

- Atomic writes: a file is either absent, the old version, or the complete new one.
- Every temporary file or staging folder is named ``.<target>.<host>-<pid>.<random>.tmp``, so a
  later process can tell the leftovers of a dead process (removed by :func:`remove_leftovers`)
  from the work in progress of a live one (kept).
- :class:`DirectoryLock`: an OS lock (``flock``) on ``<dir>/.lock``; the kernel releases it when
  the holding process dies, so a SIGKILL leaves no stale lock, and a second holder is refused with
  the process that holds it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from fedstyle.errors import ConfigError

#: leftovers of processes on other hosts (a shared filesystem) are removed only after this long
STALE_FOREIGN_SECONDS = 24 * 3600
LOCK_NAME = ".lock"
_HOST = socket.gethostname().replace(".", "_").replace("-", "_") or "host"


def temp_prefix(name: str) -> str:
    """The prefix of a temporary beside ``name`` made by this process: ``.<name>.<host>-<pid>.``"""
    return f".{name}.{_HOST}-{os.getpid()}."


def _owner(leftover: Path) -> tuple[str, int] | None:
    """(host, pid) encoded in a temporary's name, or None for names of another shape."""
    parts = leftover.name.split(".")
    for part in reversed(parts):
        host, sep, pid = part.rpartition("-")
        if sep and pid.isdigit() and host:
            return host, int(pid)
    return None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_dead_leftover(leftover: Path, stale_seconds: float = STALE_FOREIGN_SECONDS) -> bool:
    """Whether ``leftover`` (a temporary of :func:`temp_prefix`) belongs to no live process.

    A temporary of this host whose process is gone is dead at once; one of another host, or of an
    older naming, only when older than ``stale_seconds``.
    """
    owner = _owner(leftover)
    if owner is not None and owner[0] == _HOST:
        return not process_alive(owner[1])
    try:
        return time.time() - leftover.stat().st_mtime > stale_seconds
    except OSError:
        return False


def remove_leftovers(directory: Path, pattern: str = ".*.tmp", stale_seconds: float = STALE_FOREIGN_SECONDS) -> int:
    """Delete the temporaries (files or folders) in ``directory`` matching ``pattern`` whose process
    is dead; never those of a live process. Returns how many were removed."""
    removed = 0
    if not directory.is_dir():
        return 0
    for leftover in directory.glob(pattern):
        if is_dead_leftover(leftover, stale_seconds):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
            removed += 1
    return removed


def make_staging_dir(target: Path) -> Path:
    """A fresh staging folder beside ``target`` (renamed onto it when complete), owned by this process."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=temp_prefix(target.name), suffix=".tmp", dir=target.parent))


def current_umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for every thread, for a moment)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _temporary_beside(path: Path, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` if the block succeeds.

    The file gets ``mode`` (e.g. 0o600 for a private key) before anything is written into it, or
    by default what a plain ``open`` would give under the user's umask (``mkstemp`` alone makes
    every file 0600, which colleagues on a shared server could not read).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    os.fchmod(fd, mode if mode is not None else 0o666 & ~current_umask())
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        _name_file(err, path)
        raise


def _name_file(err: BaseException, path: str | Path) -> None:
    """Give an OSError that names no file (a file object's write on a full disk: "No space left on
    device", nothing more) the ``path`` it was writing, so the one line the user gets says where."""
    if isinstance(err, OSError) and err.filename is None and err.strerror:  # an OSError("text") keeps its text
        err.filename = str(path)


def append_line(file: IO[str], text: str) -> None:
    """Write ``text`` to the open ``file`` and flush it (a row of metrics.jsonl is on disk once written);
    an OSError (a full disk) names the file."""
    try:
        file.write(text)
        file.flush()
    except OSError as err:
        _name_file(err, file.name)
        raise


def atomic_write(path: str | Path, write: Callable[[Path], Any], mode: int | None = None) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place
    (``mode``: the file's permissions, default as the user's umask gives)."""
    path = Path(path)
    with _temporary_beside(path, mode) as tmp:
        write(tmp)
        # a writer may replace the temporary instead of writing into it (safetensors' save_file makes a new
        # file, 0600), so the mode is set again on what it left
        os.chmod(tmp, mode if mode is not None else 0o666 & ~current_umask())
    return path


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; it replaces ``path`` only if the block succeeds."""
    text_options = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
    with _temporary_beside(Path(path)) as tmp, open(tmp, mode, **text_options) as file:
        yield file


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def json_text(data: Any, **kwargs: Any) -> str:
    """``json.dumps`` that refuses NaN and infinities (they are not JSON) with a message naming the key."""
    try:
        return json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:
        raise ValueError(f"not JSON: a non-finite number in {', '.join(_non_finite_keys(data)) or 'the data'}") from None


def _non_finite_keys(data: Any, prefix: str = "") -> list[str]:
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _non_finite_keys(value, f"{prefix}{key}.")
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            found += _non_finite_keys(value, f"{prefix}{i}.")
    elif isinstance(data, float) and not math.isfinite(data):
        found.append(prefix.rstrip("."))
    return found


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json_text(data, indent=2) + "\n")


class LockedError(ConfigError):
    """Another live process holds the directory's lock."""


class DirectoryLock:
    """An exclusive OS lock on ``directory/.lock`` held while the context is open.

    ``flock`` is released by the kernel when the process dies (also on SIGKILL): a lock file left
    behind by a dead process locks nothing. The file records the holder's host and pid, which a
    refused process names in its error.

    ``shared=True`` (or :meth:`share` on a held lock) holds it shared: with the other processes of one
    writer that take it shared too (a deployment and its ServerApp), never with an exclusive holder, so
    every other writer stays refused for as long as any of them lives.

    ``remove=True`` deletes the lock file on release (a download folder is left as it was found). The
    file is unlinked while still locked, and every taker checks after ``flock`` that the file it locked
    is still the one at the path (else it locks afresh), so two processes never both hold it: one
    that opened the old file just before the unlink finds it gone and takes the new one.
    """

    def __init__(self, directory: str | Path, what: str = "run directory", *, shared: bool = False,
                 remove: bool = False):
        self.directory = Path(directory)
        self.what = what
        self.shared = shared
        self.remove = remove
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    def acquire(self) -> "DirectoryLock":
        import fcntl

        while True:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the folder was removed (emptied by a remove=True holder) in between
                continue
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise LockedError(f"{self.directory} is in use by {holder}; wait for it to finish or stop it "
                                  f"(a {self.what} is written by one process at a time)") from None
            if self._still_at_path(fd):
                break
            os.close(fd)  # locked a file that a remove=True holder unlinked before releasing it: lock afresh
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def share(self) -> "DirectoryLock":
        """Hold the (acquired) lock shared from now on: other shared holders may join, exclusive ones stay
        refused (one ``flock`` call, which converts the lock in place: no other taker gets in between on Linux)."""
        import fcntl

        if self._fd is not None and not self.shared:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            self.shared = True
        return self

    def _still_at_path(self, fd: int) -> bool:
        try:
            here, there = os.fstat(fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            if self.remove:  # unlinked while still held: see the class docstring
                with contextlib.suppress(OSError):
                    self.path.unlink()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# -- full disks and read-only folders ------------------------------------------------------------
#: errno values of a write refused for want of room (a full disk, a quota) and of a folder that cannot be written
_FULL = (errno.ENOSPC, errno.EDQUOT)
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _errno_of(err: BaseException) -> int | None:
    """The errno of ``err``: an OSError's, or the ``(os error N)`` that Rust I/O errors (safetensors) carry."""
    if isinstance(err, OSError) and err.errno is not None:
        return err.errno
    text = str(err)
    start = text.rfind("(os error ")
    if start >= 0:
        number = text[start + len("(os error "):].split(")")[0]
        if number.isdigit():
            return int(number)
    return None


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` is a write refused for want of room: ENOSPC, or EDQUOT (a quota)."""
    return _errno_of(err) in _FULL


def read_only(err: BaseException) -> bool:
    """Whether ``err`` is a write refused by the filesystem or the permissions: EROFS, EACCES, EPERM."""
    return _errno_of(err) in _READ_ONLY


def free_bytes(path: str | Path) -> int | None:
    """Bytes free for this user on the filesystem of ``path`` (or its nearest existing parent); None if unknown."""
    path = Path(path)
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def human_bytes(count: float) -> str:
    """``1.5 GB``-style sizes for messages (decimal units)."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{int(count)} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def free_text(path: str | Path) -> str:
    """``"3.1 MB free"`` on the filesystem of ``path``, for a message about a full disk."""
    free = free_bytes(path)
    return f"{human_bytes(free) if free is not None else 'an unknown amount'} free"


def reserve(fd: int, size: int) -> None:
    """Allocate ``size`` bytes of the file ``fd`` now, so that writing them later (through a memory map,
    where a full disk is a SIGBUS that kills the process) cannot fail for want of room; raises OSError
    (ENOSPC) here instead. A filesystem without ``fallocate`` is left as it is (its writes may still fail)."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return
        raise


# -- checksums over tensors -----------------------------------------------------------------------
def tensors_digest(meta_json: str, tensors) -> str:
    """SHA-256 over ``meta_json`` and every tensor's name, dtype, shape and bytes (in name order):
    what a checkpoint and a cached client style carry, so a flipped bit in either is refused on load."""
    import torch

    digest = hashlib.sha256(meta_json.encode())
    for key in sorted(tensors):
        t = tensors[key].detach().to("cpu").contiguous()
        digest.update(f"|{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


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
