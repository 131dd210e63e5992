"""One archive over HTTP: sources in order, resumable with HTTP Range, verified before it is kept.

A transfer writes ``DOWNLOADS/<file>.<source>.part`` (``<source>``: 8 hex digits of the URL) and
``….part.json`` (the URL and the server's ETag / Last-Modified). A rerun continues that file from
the same source with ``Range: bytes=N-`` and ``If-Range`` (a changed file comes back whole and the
transfer starts over; a server that ignores Range does too). Only a complete transfer whose
SHA-256 (and size) match what is known is renamed to ``DOWNLOADS/<file>``; a mismatch deletes it,
and the next source is tried. A source that fails — refused, HTTP error, a web page instead of the
archive (Google Drive's quota or login page), a connection that breaks — is reported and the next
one tried; a broken transfer keeps its ``.part`` (if any byte arrived) for the next run. A transfer
stops at the archive's known size (else the server's Content-Length): a server sending more is a
failed source, and its ``.part`` is deleted. A write that fails here (a full disk, a read-only
folder) is the data root's fault, not the source's: :class:`LocalWriteError`, one line with the path
and the room needed, and no further source is tried.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from tqdm.auto import tqdm

from fedstyle.data.download.table import Archive
from fedstyle.errors import FedstyleError
from fedstyle.io import disk_full, free_bytes, free_text, human_bytes, read_only

T = TypeVar("T")

CHUNK = 1 << 20
TIMEOUT_S = 60.0
USER_AGENT = "fedstyle-download/1 (+https://github.com/; python-urllib)"


class LocalWriteError(FedstyleError):
    """A write into the data root failed (a full disk, a read-only folder): never a source's fault, so the
    next source is not tried; the line names the path (and the room needed where known)."""


class SourceFailed(Exception):
    """One source could not deliver the archive; ``kept`` names a partial file left for a rerun."""

    def __init__(self, reason: str, kept: Path | None = None):
        super().__init__(reason)
        self.kept = kept


@dataclass(frozen=True)
class Expected:
    """What the archive's bytes must be: a SHA-256 and size from the code or an earlier record, or None."""

    sha256: str | None
    size: int | None
    source: str  # "published" or the record's path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def part_path(folder: Path, archive: Archive, url: str) -> Path:
    return folder / f"{archive.filename}.{hashlib.sha1(url.encode()).hexdigest()[:8]}.part"


def check_file(path: Path, expected: Expected) -> str:
    """SHA-256 of ``path``; a mismatch with ``expected`` deletes the file and raises SourceFailed.

    Hex digits compare in either case: PowerShell's ``Get-FileHash`` prints upper case."""
    size = path.stat().st_size
    if expected.size is not None and size != expected.size:
        path.unlink()
        raise SourceFailed(f"size {size:,} bytes is not the {expected.source} {expected.size:,}; deleted")
    digest = sha256_of(path)
    if expected.sha256 is not None and digest != expected.sha256.lower():
        path.unlink()
        raise SourceFailed(f"checksum refused: sha256 {digest[:12]}… is not the {expected.source} "
                           f"{expected.sha256[:12]}…; deleted")
    return digest


def local_write_error(err: OSError, path: Path, needed: int | None, then: str) -> LocalWriteError:
    """One line for a write into the data root that failed: the path, and for a full disk the room needed."""
    if disk_full(err):
        need = f"it needs {human_bytes(needed)} more, " if needed else ""
        return LocalWriteError(f"no space left on device for {path} ({need}{free_text(path.parent)}); free space "
                               f"or give another --data-root, then {then}")
    hint = "give a --data-root you can write to" if read_only(err) else "check the folder"
    return LocalWriteError(f"cannot write {path} ({err.strerror or err}); {hint}, then {then}")


def _locally(path: Path, action: Callable[[], T]) -> T:
    """``action()`` on the local file ``path``; an OSError is the data root's (LocalWriteError), not a source's."""
    try:
        return action()
    except OSError as err:
        raise local_write_error(err, path, None, "run the same command again") from None


def _open(url: str, offset: int, validator: str | None, timeout: float):
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)


def _resume_point(part: Path, sidecar: Path) -> tuple[int, str | None]:
    """Bytes already in ``part`` and the validator its source gave (0 and None: start afresh)."""
    offset = part.stat().st_size if part.exists() else 0
    if not offset or not sidecar.exists():
        return offset, None
    try:
        return offset, json.loads(sidecar.read_text()).get("validator")
    except (ValueError, AttributeError):  # a damaged sidecar: the part cannot be trusted to continue
        return 0, None


def _start(url: str, part: Path, sidecar: Path, timeout: float):
    """Open the transfer; returns (response, offset to append at, total size or None).

    Network faults propagate (the caller reads them as the source's); local ones are LocalWriteError."""
    for _ in range(3):
        offset, validator = _locally(part, lambda: _resume_point(part, sidecar))
        try:
            response = _open(url, offset, validator, timeout)
        except urllib.error.HTTPError as err:
            if err.code == 416 and offset:  # nothing after our bytes: the part may be whole already
                total = err.headers.get("Content-Range", "").rpartition("/")[2]
                if total.isdigit() and int(total) == offset:
                    return None, offset, offset
                _locally(part, part.unlink)  # longer than the file: start over
                continue
            raise SourceFailed(f"HTTP {err.code} {err.reason}") from None
        if response.headers.get_content_type() == "text/html":
            response.close()
            raise SourceFailed("served a web page, not the archive (a quota, login or removed-file page)")
        length = response.headers.get("Content-Length")
        length = int(length) if length and length.isdigit() else None
        if offset and response.status == 206:
            first, _, total = response.headers.get("Content-Range", "").removeprefix("bytes ").partition("/")
            if first.partition("-")[0] != str(offset):
                response.close()
                _locally(part, part.unlink)
                continue
            return response, offset, int(total) if total.isdigit() else None
        # a fresh transfer, or the server sent the whole file again (no Range support, or it changed)
        validator = response.headers.get("ETag")
        if not validator or validator.startswith("W/"):
            validator = response.headers.get("Last-Modified")
        try:
            _locally(sidecar, lambda: sidecar.write_text(json.dumps({"url": url, "validator": validator})))
        except LocalWriteError:
            response.close()
            raise
        return response, 0, length
    raise SourceFailed("its answers to Range requests do not fit the partial file")


def _drop(part: Path) -> None:
    """The partial file and its sidecar removed (nothing worth resuming)."""
    part.unlink(missing_ok=True)
    part.with_name(part.name + ".json").unlink(missing_ok=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _write_all(out, block: bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[out.write(view) or 0 :]


def fetch_from(url: str, archive: Archive, folder: Path, progress: bool, timeout: float = TIMEOUT_S,
               expected: Expected | None = None) -> Path:
    """Transfer ``archive`` from ``url`` into ``folder``'s partial file; returns the complete partial.

    The transfer stops at the expected size (else the server's Content-Length or Content-Range total): a
    server that sends more is refused and its partial file deleted, so an endless answer cannot fill the
    disk. Blocks are written as they arrive (``read1``: no waiting for a full block) to an unbuffered file,
    so an interrupted transfer keeps every byte it received for the rerun. A failed read is the source's
    fault (SourceFailed, the part kept for a rerun); a failed write is the data root's (LocalWriteError)."""
    part = part_path(folder, archive, url)
    sidecar = part.with_name(part.name + ".json")
    size = expected.size if expected is not None else None
    try:
        response, offset, total = _start(url, part, sidecar, timeout)
    except SourceFailed:
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        raise SourceFailed(f"unreachable ({getattr(err, 'reason', err)})") from None
    if response is None:
        return part
    if size is not None and total is not None and total != size:
        response.close()
        _drop(part)
        raise SourceFailed(f"serves {total:,} bytes, not the {expected.source} size {size:,}")
    bound = size if size is not None else total
    said = f"the {expected.source} size" if size is not None else "the size the server announced"
    if bound is not None:
        free = free_bytes(folder)
        if free is not None and free < bound - offset:
            response.close()
            if not offset:
                _drop(part)
            raise LocalWriteError(f"no space left on device for {part}: it needs {human_bytes(bound - offset)} more, "
                                  f"{free_text(folder)}; free space or give another --data-root, then run the same "
                                  "command again")
    received = offset
    read = getattr(response, "read1", response.read)
    try:
        out = _locally(part, lambda: open(part, "ab" if offset else "wb", buffering=0))
    except LocalWriteError:
        response.close()
        raise
    try:
        with response, out, tqdm(total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                                 desc=archive.filename, disable=not progress, leave=False) as bar:
            while True:
                try:
                    block = read(CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise SourceFailed(f"the connection broke after {human_bytes(received)}"
                                       + (f" of {human_bytes(total)}" if total else "") + f" ({type(err).__name__})",
                                       kept=part if received else None) from None
                if not block:
                    break
                if bound is not None and received + len(block) > bound:
                    _drop(part)
                    raise SourceFailed(f"sent more than {said} ({bound:,} bytes); stopped there and deleted "
                                       "the partial file")
                try:
                    _write_all(out, block)
                except OSError as err:
                    on_disk = _size(part)  # what reached the disk, part of the last block included
                    if bound is None or not on_disk:  # no size named (the answer may never end), or nothing in it
                        _drop(part)
                        then = "run the same command again"
                    else:  # a true beginning of the file: the rerun continues it
                        then = f"run the same command again to resume the {human_bytes(on_disk)} kept in {part}"
                        received = on_disk  # not dropped below as an empty part
                    raise local_write_error(err, part, bound - on_disk if bound is not None else None,
                                            then) from None
                received += len(block)
                bar.update(len(block))
    except BaseException:
        if received == 0:  # nothing arrived: no empty partial file is left for a "resume"
            _drop(part)
        raise
    if bound is not None and received < bound:  # closed early: the part is a true beginning, kept for a rerun
        if not received:
            _drop(part)
        raise SourceFailed(f"the connection closed after {human_bytes(received)} of {human_bytes(bound)}",
                           kept=part if received else None)
    return part


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    url: str  # where the bytes came from ("" for a file that was already there)
    failures: tuple[str, ...]  # sources that failed before one succeeded


def fetch_archive(archive: Archive, folder: Path, expected: Expected, progress: bool,
                  timeout: float = TIMEOUT_S) -> Fetched:
    """``folder/<file>`` complete and matching ``expected``: an existing copy (a finished download, or
    one put there by hand) is verified; otherwise the sources are tried in order.

    Raises
    :class:`SourceFailed` ``("; "``-joined failures, kept partial)`` when every source fails.
    """
    target = folder / archive.filename
    failures: list[str] = []
    if target.exists():
        try:
            return Fetched(target, check_file(target, expected), "", ())
        except SourceFailed as err:
            failures.append(f"{target}: {err}")
    kept = None
    for url in archive.urls:
        try:
            part = fetch_from(url, archive, folder, progress, timeout, expected)
            digest = check_file(part, expected)
        except SourceFailed as err:
            failures.append(f"{host(url)}: {err}")
            kept = err.kept or kept
            if err.kept is None:
                _drop_sidecar(part_path(folder, archive, url))
            continue
        _locally(target, lambda: os.replace(part, target))
        for leftover in folder.glob(f"{archive.filename}.*.part*"):
            leftover.unlink(missing_ok=True)
        return Fetched(target, digest, url, tuple(failures))
    raise SourceFailed("; ".join(failures) or "no source listed", kept=kept)


def _drop_sidecar(part: Path) -> None:
    if not part.exists():
        part.with_name(part.name + ".json").unlink(missing_ok=True)
