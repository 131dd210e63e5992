"""One archive over HTTP: sources in order, resumable with HTTP Range, verified before it is kept.

A transfer writes ``DOWNLOADS/<file>.<source>.part`` (``<source>``: 8 hex digits of the URL) and
``….part.json`` (the URL and the server's ETag / Last-Modified). A rerun continues that file from
the same source with ``Range: bytes=N-`` and ``If-Range`` (a changed file comes back whole and the
transfer starts over; a server that ignores Range does too). Only a complete transfer whose
SHA-256 (and size) match what is known is renamed to ``DOWNLOADS/<file>``; a mismatch deletes it,
and the next source is tried. A source that fails — refused, HTTP error, a web page instead of the
archive (Google Drive's quota or login page), a connection that breaks — is reported and the next
one tried; a broken transfer keeps its ``.part`` for the next run.
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

from tqdm.auto import tqdm

from fedstyle.data.download.table import Archive

CHUNK = 1 << 20
TIMEOUT_S = 60.0
USER_AGENT = "fedstyle-download/1 (+https://github.com/; python-urllib)"


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


def mb(count: float) -> str:
    return f"{count / 1e6:,.1f} MB"


def host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def part_path(folder: Path, archive: Archive, url: str) -> Path:
    return folder / f"{archive.filename}.{hashlib.sha1(url.encode()).hexdigest()[:8]}.part"


def check_file(path: Path, expected: Expected) -> str:
    """SHA-256 of ``path``; a mismatch with ``expected`` deletes the file and raises SourceFailed."""
    size = path.stat().st_size
    if expected.size is not None and size != expected.size:
        path.unlink()
        raise SourceFailed(f"size {size:,} bytes is not the {expected.source} {expected.size:,}; deleted")
    digest = sha256_of(path)
    if expected.sha256 is not None and digest != expected.sha256:
        path.unlink()
        raise SourceFailed(f"checksum refused: sha256 {digest[:12]}… is not the {expected.source} "
                           f"{expected.sha256[:12]}…; deleted")
    return digest


def _open(url: str, offset: int, validator: str | None, timeout: float):
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)


def _start(url: str, part: Path, sidecar: Path, timeout: float):
    """Open the transfer; returns (response, offset to append at, total size or None)."""
    offset = part.stat().st_size if part.exists() else 0
    validator = None
    if offset and sidecar.exists():
        try:
            validator = json.loads(sidecar.read_text()).get("validator")
        except ValueError:
            offset = 0
    try:
        response = _open(url, offset, validator, timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing after our bytes: the part may be whole already
            total = err.headers.get("Content-Range", "").rpartition("/")[2]
            if total.isdigit() and int(total) == offset:
                return None, offset, offset
            part.unlink()  # longer than the file: start over
            return _start(url, part, sidecar, timeout)
        raise SourceFailed(f"HTTP {err.code} {err.reason}") from None
    if response.headers.get_content_type() == "text/html":
        response.close()
        raise SourceFailed("served a web page, not the archive (a quota, login or removed-file page)")
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    if offset and response.status == 206:
        start, _, total = response.headers.get("Content-Range", "").removeprefix("bytes ").partition("/")
        if start.partition("-")[0] != str(offset):
            response.close()
            part.unlink()
            return _start(url, part, sidecar, timeout)
        return response, offset, int(total) if total.isdigit() else None
    # a fresh transfer, or the server sent the whole file again (no Range support, or it changed)
    validator = response.headers.get("ETag")
    if not validator or validator.startswith("W/"):
        validator = response.headers.get("Last-Modified")
    sidecar.write_text(json.dumps({"url": url, "validator": validator}))
    return response, 0, length


def fetch_from(url: str, archive: Archive, folder: Path, progress: bool, timeout: float = TIMEOUT_S) -> Path:
    """Transfer ``archive`` from ``url`` into ``folder``'s partial file; returns the complete partial."""
    part = part_path(folder, archive, url)
    sidecar = part.with_name(part.name + ".json")
    try:
        response, offset, total = _start(url, part, sidecar, timeout)
    except SourceFailed:
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        raise SourceFailed(f"unreachable ({getattr(err, 'reason', err)})") from None
    if response is None:
        return part
    received = offset
    # a failed read is the source's fault (kept for a rerun); a failed write (a full disk) is not, and propagates
    with response, open(part, "ab" if offset else "wb") as out, tqdm(
        total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
        desc=archive.filename, disable=not progress, leave=False,
    ) as bar:
        while True:
            try:
                block = response.read(CHUNK)
            except (OSError, http.client.HTTPException) as err:
                raise SourceFailed(f"the connection broke after {mb(received)}"
                                   + (f" of {mb(total)}" if total else "") + f" ({type(err).__name__})",
                                   kept=part) from None
            if not block:
                break
            out.write(block)
            received += len(block)
            bar.update(len(block))
    if total is not None and received < total:
        raise SourceFailed(f"the connection closed after {mb(received)} of {mb(total)}", kept=part)
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
            part = fetch_from(url, archive, folder, progress, timeout)
            digest = check_file(part, expected)
        except SourceFailed as err:
            failures.append(f"{host(url)}: {err}")
            kept = err.kept or kept
            if err.kept is None:
                _drop_sidecar(part_path(folder, archive, url))
            continue
        os.replace(part, target)
        for leftover in folder.glob(f"{archive.filename}.*.part*"):
            leftover.unlink(missing_ok=True)
        return Fetched(target, digest, url, tuple(failures))
    raise SourceFailed("; ".join(failures) or "no source listed", kept=kept)


def _drop_sidecar(part: Path) -> None:
    if not part.exists():
        part.with_name(part.name + ".json").unlink(missing_ok=True)
