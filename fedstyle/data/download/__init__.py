"""``fedstyle data download NAME``: a benchmark's archives fetched, verified and unpacked into a data root.

``download_dataset("pacs", "data")`` leaves ``data/PACS/<domain>/<class>/<image>`` (DomainBed's
layout; ``fedstyle run --dataset pacs --data-root data/PACS``). Per archive (sources and checksums
in :mod:`fedstyle.data.download.table`):

1. ``data/downloads/<file>`` if it is there (a finished download, or one put there by hand), else
   each source in order, resuming an interrupted transfer with HTTP Range
   (:mod:`fedstyle.data.download.transfer`), with a progress bar;
2. its SHA-256 checked against the published one, else against the one this data root recorded on
   first use (``data/fedstyle-downloads.json``); a mismatch deletes the file;
3. all archives unpacked and arranged in a hidden staging folder, renamed into place in one step
   (:mod:`fedstyle.data.download.layout`); a first-use checksum is recorded only now, after the
   archive proved whole by unpacking, and the archives are deleted (``keep_archives`` keeps them).

When every source of an archive fails, one :class:`DataError` line names the sources' failures
and the manual step: which file to fetch from where, and the path to put it at.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from fedstyle.data.download.layout import MARKER, BadArchive, install, is_installed
from fedstyle.data.download.table import (DOWNLOADS, Archive, DatasetDownload, check_sha256, check_size,
                                           json_kind, shown, with_sources)
from fedstyle.data.download.transfer import TIMEOUT_S, Expected, SourceFailed, fetch_archive
from fedstyle.errors import DataError
from fedstyle.io import DirectoryLock, atomic_write_json

RECORD_NAME = "fedstyle-downloads.json"
DOWNLOADS_FOLDER = "downloads"

__all__ = ["DOWNLOADS", "DatasetDownload", "Installed", "download_dataset", "read_records"]


@dataclass(frozen=True)
class Installed:
    path: Path
    fresh: bool  # False: it was already there
    recorded: tuple[str, ...]  # archives whose first-use checksum was recorded by this call


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def read_records(data_root: Path) -> dict[str, Any]:
    """The first-use records of ``data_root`` (file name -> sha256, size, ...), each checked for its shape."""
    path = data_root / RECORD_NAME
    if not path.is_file():
        return {}
    fix = "restore it from a backup or delete it (its recorded checksums are then taken afresh on the next download)"
    try:
        records = json.loads(path.read_text())
    except ValueError:
        raise DataError(f"{path} is not valid JSON; {fix}") from None
    if not isinstance(records, dict):
        raise DataError(f"{path} holds {json_kind(records)}, not an object mapping archive names to their "
                        f"checksums; {fix}")
    for name, record in records.items():
        entry_fix = f"fix the entry in {path} (from a colleague's copy) or delete the entry to record it afresh"
        if not isinstance(record, dict):
            raise DataError(f"{path}: {name} is {shown(record)}, not an object such as "
                            f'{{"sha256": "...", "size": N}}; {entry_fix}')
        record["sha256"] = check_sha256(record.get("sha256"), f"{path}: {name}.sha256", entry_fix)
        if record.get("size") is not None:
            check_size(record["size"], f"{path}: {name}.size", entry_fix)
    return records


def _expected(archive: Archive, records: Mapping[str, Any], data_root: Path) -> Expected:
    if archive.sha256:
        return Expected(archive.sha256, archive.size, "published")
    known = records.get(archive.filename)
    if known:
        return Expected(known["sha256"], known.get("size"), f"first-use record in {data_root / RECORD_NAME}")
    return Expected(None, archive.size, "published")


def manual_step(entry: DatasetDownload, archive: Archive, original: DatasetDownload, data_root: Path,
                failures: str, kept: Path | None) -> str:
    urls = " or ".join(original.archive(archive.filename).urls)
    rerun = f"fedstyle data download {entry.name} --data-root {shlex.quote(str(data_root))}"
    text = (f"could not download {archive.filename} for {entry.name} from any source ({failures}). "
            f"Manual step: download {archive.filename} ({archive.origin or 'the publisher'}: {urls}) and put it at "
            f"{data_root / DOWNLOADS_FOLDER / archive.filename} (making the folder if needed), then run `{rerun}` "
            "again (it is verified and "
            "unpacked from there)")
    if kept is not None:
        text += f"; or run the same command again to resume the partial download kept in {kept}"
    if entry.alternative:
        text += f"; {entry.alternative}"
    return text


def download_dataset(
    name: str,
    data_root: str | Path,
    *,
    sources: Mapping[str, Mapping[str, Any]] | None = None,
    mirrors: tuple[str, ...] = (),
    keep_archives: bool = False,
    progress: bool = True,
    timeout: float = TIMEOUT_S,
    say: Callable[[str], None] = _stderr,
) -> Installed:
    """Fetch, verify and unpack benchmark ``name`` into ``data_root/<its folder>``.

    ``sources`` replaces archives' URLs and checksums (default: ``$FEDSTYLE_DOWNLOAD_SOURCES``, else
    the table); ``mirrors``: base URLs tried first (``BASE/<file name>``). Raises :class:`DataError`
    with the manual step when every source of an archive fails.
    """
    original = DOWNLOADS.get(name)
    entry = with_sources(original, sources, tuple(mirrors))
    data_root = Path(data_root).expanduser()
    target = data_root / entry.folder
    if is_installed(target):
        return Installed(target, False, ())
    if target.exists():
        raise DataError(f"{target} exists but was not made by `fedstyle data download` (it has no {MARKER}); "
                        f"read it as it is (--data-root {target}) or move it away to download afresh")
    folder = data_root / DOWNLOADS_FOLDER
    made = [path for path in (data_root, *data_root.parents) if not path.exists()]  # deepest first
    try:
        return _download(entry, original, data_root, folder, target, keep_archives, progress, timeout, say)
    finally:  # the download folder once empty, and folders this call made and left empty, go too
        for path in (folder, *made):
            with contextlib.suppress(OSError):
                path.rmdir()


def _download(entry: DatasetDownload, original: DatasetDownload, data_root: Path, folder: Path, target: Path,
              keep_archives: bool, progress: bool, timeout: float, say: Callable[[str], None]) -> Installed:
    # remove=True: the lock file goes with the lock, so no run, finished or failed, leaves downloads/.lock
    with DirectoryLock(folder, "download folder", remove=True):
        records = read_records(data_root)
        fetched = []
        for archive in entry.archives:
            try:
                got = fetch_archive(archive, folder, _expected(archive, records, data_root), progress, timeout)
            except SourceFailed as err:
                raise DataError(manual_step(entry, archive, original, data_root, str(err), err.kept)) from None
            for failure in got.failures:
                say(f"fedstyle: {archive.filename}: {failure}; the next source served it")
            fetched.append((archive, got))
        unverified = [got.path for archive, got in fetched
                      if not archive.sha256 and archive.filename not in records]
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        marker = {"dataset": entry.name, "installed": now,
                  "archives": {a.filename: {"sha256": g.sha256, "size": g.path.stat().st_size} for a, g in fetched}}
        try:
            install(entry, [got.path for _, got in fetched], target, marker)
        except BadArchive as err:
            bad = [p for p in unverified if str(p) in str(err)]
            for path in bad:
                path.unlink(missing_ok=True)
            if bad:
                raise DataError(f"{err} (deleted: no checksum vouched for it; the next run downloads it afresh)") from None
            raise DataError(f"{err}; the archives stay in {folder}: delete them to download afresh") from None
        recorded = []
        for archive, got in fetched:
            if not archive.sha256 and archive.filename not in records:
                records[archive.filename] = {"sha256": got.sha256, "size": got.path.stat().st_size,
                                             "url": got.url or "a file put in place by hand", "recorded": now}
                recorded.append(archive.filename)
                say(f"fedstyle: {archive.filename} has no published checksum; its sha256 {got.sha256} is recorded "
                    f"in {data_root / RECORD_NAME} (trust on first use: later downloads must match it)")
        if recorded:
            atomic_write_json(data_root / RECORD_NAME, records)
        if not keep_archives:
            for _, got in fetched:
                got.path.unlink(missing_ok=True)
    return Installed(target, True, tuple(recorded))
