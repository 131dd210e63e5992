"""Filesystem faults for tests (issue 39): a read-only cache and a full disk, real where this process
may mount (root: a read-only bind mount, a small tmpfs); elsewhere (or with FEDSTYLE_TESTS_NO_MOUNT=1)
the system calls that write fail with the errno the kernel gives (EROFS, EACCES, ENOSPC), never a
PermissionError faked higher up."""

from __future__ import annotations

import builtins
import errno
import functools
import io
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=None)
def can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("mount") or os.environ.get("FEDSTYLE_TESTS_NO_MOUNT"):
        return False
    probe = tempfile.mkdtemp()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", probe], capture_output=True).returncode
        if ok == 0:
            subprocess.run(["umount", probe], capture_output=True)
        return ok == 0
    finally:
        os.rmdir(probe)


def _under(path, root: str) -> bool:
    try:
        return os.path.abspath(os.fspath(path)).startswith(root)
    except TypeError:  # a file descriptor
        return False


def fd_under(fd: int, root: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(root)
    except OSError:
        return False


def refuse_writes(monkeypatch, root: Path, code: int) -> None:
    """Every write under ``root`` fails as the kernel fails it on a read-only filesystem (EROFS) or in a
    folder without permission (EACCES): open for writing, mkdir of a new name, rename, unlink."""
    root = str(root)

    def refuse(path):
        raise OSError(code, os.strerror(code), os.fspath(path))

    real_os_open, real_open, real_mkdir = os.open, builtins.open, os.mkdir
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & writing and dir_fd is None and _under(path, root):
            refuse(path)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and _under(file, root):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def mkdir(path, mode=0o777, *, dir_fd=None):
        if dir_fd is None and _under(path, root):
            if os.path.exists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))
            refuse(path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    def guarded(real):
        def call(path, *args, **kwargs):
            if _under(path, root):
                refuse(path)
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    for name in ("replace", "rename", "unlink", "rmdir", "truncate"):
        monkeypatch.setattr(os, name, guarded(getattr(os, name)))


@contextmanager
def read_only_copy(source: Path, target: Path, monkeypatch, code: int = errno.EROFS):
    """``source`` seen read-only at ``target``: a read-only bind mount (EROFS from the kernel) where this
    process may mount and ``code`` is EROFS; else writes under ``target`` fail with ``code``."""
    if code == errno.EROFS and can_mount():
        target.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
            with pytest.raises(OSError, match="Read-only file system"):
                (target / "probe").write_text("x")
            yield target
        finally:
            subprocess.run(["umount", "-l", str(target)], check=True)
        return
    shutil.copytree(source, target)
    with monkeypatch.context() as patch:
        refuse_writes(patch, target, code)
        yield target


class SmallDisk:
    """A folder on a small filesystem that :meth:`fill` makes full (leaving ``room`` bytes): a tmpfs where
    this process may mount; else writes under it (``pwrite``, ``fallocate``, safetensors) fail with ENOSPC."""

    def __init__(self, path: Path, monkeypatch, size: str = "2m"):
        self.path, self.monkeypatch, self.real = path, monkeypatch, can_mount()
        path.mkdir(parents=True)
        if self.real:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        self.full = False

    def fill(self, room: int = 0) -> None:
        self.full = True
        if self.real:
            fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                size = 0
                while True:
                    try:
                        size += os.write(fd, b"\1" * 4096)
                    except OSError as err:
                        assert err.errno == errno.ENOSPC
                        break
                os.ftruncate(fd, max(0, size - room))
            finally:
                os.close(fd)
            return
        root = str(self.path)
        from safetensors import SafetensorError
        import safetensors.torch

        def full(real):
            def call(fd, *args, **kwargs):
                if self.full and fd_under(fd, root):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real(fd, *args, **kwargs)
            return call

        def save_file(tensors, filename, *args, real=safetensors.torch.save_file, **kwargs):
            if self.full and _under(filename, root):  # as safetensors' Rust writer says it
                raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return real(tensors, filename, *args, **kwargs)

        self.monkeypatch.setattr(os, "pwrite", full(os.pwrite))
        self.monkeypatch.setattr(os, "posix_fallocate", full(os.posix_fallocate))
        import fedstyle.experiments.checkpoint as checkpoint

        self.monkeypatch.setattr(safetensors.torch, "save_file", save_file)
        self.monkeypatch.setattr(checkpoint, "save_file", save_file)

    def free(self) -> None:
        self.full = False
        (self.path / "filler").unlink(missing_ok=True)

    def close(self) -> None:
        if self.real:
            subprocess.run(["umount", "-l", str(self.path)], check=True)
