"""Archives into a benchmark folder, atomically: a killed extraction leaves nothing that looks complete.

Everything is unpacked and arranged inside a hidden staging folder beside the target
(``DATA_ROOT/.PACS.<host>-<pid>.<random>.tmp``, see :mod:`fedstyle.io`), the folder is given its
marker file ``.fedstyle-download.json``, and only then renamed to ``DATA_ROOT/PACS`` in one step.
Staging folders of dead processes are removed by the next run. Zip members are sanitised by
:mod:`zipfile`; tar members pass tarfile's ``data`` filter (no absolute paths, no ``..``, no links
out of the folder, no device files).

Layouts (``DatasetDownload.layout``):

- ``domain_folders``: the unpacked tree holds, at some depth, one folder containing every domain
  folder (PACS's ``kfold/``, Office-Home's ``OfficeHomeDataset_10072016/``, DomainNet's six zips
  side by side); that folder becomes the dataset, whatever its name in the archive, taking along
  the official split lists kept beside it (into its ``splits/``).
- ``terra_incognita``: DomainBed's arrangement (:mod:`fedstyle.data.download.terra`).
- ``camelyon17``: WILDS's folder, the one holding ``metadata.csv`` and ``patches/``.

An entry's ``removed`` list (DomainNet: DomainBed's ``domain_net_duplicates.txt``, 9,431 images) is then
applied: each listed file is deleted from the result, a missing one skipped, as DomainBed's
``download.py`` does (``download_domain_net``). The marker file records how many were deleted.

Files keep the times the archive records (tar does so itself; zip members are stamped as ``unzip``
stamps them), so a folder dataset's cache key (relative paths, sizes, file times) is the same for
every download of one archive and for the tree it was made from.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tarfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Callable

from fedstyle.data.download.table import DatasetDownload
from fedstyle.data.split_lists import shipped_list
from fedstyle.errors import DataError
from fedstyle.io import (atomic_write_json, disk_full, free_text, human_bytes, make_staging_dir, read_only,
                         remove_leftovers)

MARKER = ".fedstyle-download.json"
SEARCH_DEPTH = 3


class BadArchive(DataError):
    """An archive that cannot be unpacked (truncated, corrupt, not the format its name says)."""


def unpack(archive: Path, into: Path) -> None:
    """Unpack a .zip or .tar(.gz/.xz/.bz2) into ``into``; any other file is copied in as it is."""
    into.mkdir(parents=True, exist_ok=True)
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as handle:
                for member in handle.infolist():
                    path = handle.extract(member, into)
                    stamp = None if member.is_dir() else _zip_mtime(member)
                    if stamp is not None:
                        os.utime(path, (stamp, stamp))
        elif re.search(r"\.(tar|tgz|tar\.gz|tar\.xz|tar\.bz2)$", name):
            with tarfile.open(archive) as handle:
                if hasattr(tarfile, "data_filter"):
                    handle.extractall(into, filter="data")
                else:  # Python before 3.10.12 / 3.11.4: the same refusals by hand
                    handle.extractall(into, members=_safe_members(handle, archive))
        else:
            shutil.copyfile(archive, into / archive.name)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as err:
        raise BadArchive(f"{archive} cannot be unpacked ({type(err).__name__}: {err})") from None


def _zip_mtime(member: zipfile.ZipInfo) -> float | None:
    """A zip member's modification time as ``unzip`` restores it: the UTC seconds of the extended-timestamp
    field (0x5455, written by Info-ZIP's zip) where present, else the DOS date and time read as local time.

    zipfile's extract leaves every file stamped with the time of unpacking; the folder datasets' cache key
    hashes file times, so without this two downloads of one archive (or a download and the same archive
    unzipped by hand) never shared a decoded cache entry. tar members keep their times already. None: no
    time can be read (the file keeps the time of unpacking)."""
    extra = member.extra
    while len(extra) >= 4:
        kind, size = int.from_bytes(extra[:2], "little"), int.from_bytes(extra[2:4], "little")
        body = extra[4 : 4 + size]
        if kind == 0x5455 and len(body) >= 5 and body[0] & 1:
            return float(int.from_bytes(body[1:5], "little", signed=True))
        extra = extra[4 + size :]
    try:
        return time.mktime(member.date_time + (0, 0, -1))
    except (OverflowError, ValueError):  # a date the platform cannot represent
        return None


def _safe_members(handle: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    members = handle.getmembers()
    for member in members:
        path = Path(member.name)
        if path.is_absolute() or ".." in path.parts or not (member.isfile() or member.isdir()):
            raise BadArchive(f"{archive} holds {member.name!r}, which would land outside the dataset folder or is "
                             "not a plain file; refused")
    return members


def _loose(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).lower()


def _folders(root: Path, depth: int = SEARCH_DEPTH):
    yield root
    if depth:
        for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("__MACOSX", "."))):
            yield from _folders(child, depth - 1)


def find_folder(root: Path, holds: Callable[[Path], bool], what: str) -> Path:
    for folder in _folders(root):
        if holds(folder):
            return folder
    found = ", ".join(sorted(p.name for p in root.iterdir())[:8]) or "nothing"
    raise BadArchive(f"the archives hold no folder with {what} (top level: {found})")


def domain_folders(unpacked: Path, result: Path, entry: DatasetDownload) -> None:
    wanted = {_loose(d) for d in entry.domains}

    def holds(folder: Path) -> bool:
        return wanted <= {_loose(p.name) for p in folder.iterdir() if p.is_dir()}

    found = find_folder(unpacked, holds, " ".join(f"{d}/" for d in entry.domains))
    _carry_split_lists(found, entry)
    os.rename(found, result)


def _carry_split_lists(found: Path, entry: DatasetDownload) -> None:
    """Official split lists kept beside the folder of domain folders (the PACS release's ``pacs_label/`` beside
    ``pacs_data/``, Dassl's ``splits/`` beside ``images/``) moved into ``found/splits/``, where the loader looks
    (:mod:`fedstyle.data.split_lists`): only ``found`` becomes the dataset, and the lists would be left behind,
    so the download would lose the splits that the unpacked tree gives. Lists already inside ``found`` win, as
    the loader prefers them too."""
    from fedstyle.data.split_lists import LIST_FOLDERS, SPLIT_LIST_FORMATS

    fmt = SPLIT_LIST_FORMATS.get(entry.dataset)
    if fmt is None:
        return
    names = sorted({pattern.format(domain=d) for pattern in fmt.files.values() for d in entry.domains})

    def lists_in(folder: Path) -> list[Path]:
        return [folder / name for name in names if (folder / name).is_file()]

    if any(lists_in(found / sub) for sub in LIST_FOLDERS):
        return
    for sub in LIST_FOLDERS:
        lists = lists_in(found.parent / sub)
        if lists:
            (found / "splits").mkdir(exist_ok=True)
            for path in lists:
                os.rename(path, found / "splits" / path.name)
            return


def camelyon17(unpacked: Path, result: Path, entry: DatasetDownload) -> None:
    found = find_folder(unpacked, lambda f: (f / "metadata.csv").is_file() and (f / "patches").is_dir(),
                        "metadata.csv and patches/ (WILDS's Camelyon17 layout)")
    os.rename(found, result)


def _terra(unpacked: Path, result: Path, entry: DatasetDownload) -> None:
    from fedstyle.data.download.terra import arrange_terra_incognita

    arrange_terra_incognita(unpacked, result, entry.domains)


LAYOUTS: dict[str, Callable[[Path, Path, DatasetDownload], None]] = {
    "domain_folders": domain_folders, "camelyon17": camelyon17, "terra_incognita": _terra,
}


def remove_listed(result: Path, name: str) -> int:
    """Delete from ``result`` every file the shipped list ``name`` names; returns how many were there.

    A listed path that climbs out of ``result`` is refused (the list is ours, but a path is a path)."""
    removed = 0
    for line in shipped_list(name):
        relative = Path(line)
        if relative.is_absolute() or ".." in relative.parts:
            raise DataError(f"{name}: {line!r} is not a path inside the dataset folder")
        path = result / relative
        if path.is_file():
            path.unlink()
            removed += 1
    return removed


def unpacked_size(archive: Path) -> int | None:
    """Bytes ``archive`` takes unpacked: a zip's directory says it; a compressed tar would have to be read
    through (minutes for TerraIncognita's 6 GB), so None."""
    if archive.name.lower().endswith(".zip"):
        with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(archive) as handle:
            return sum(member.file_size for member in handle.infolist())
    return None


def unpack_error(err: OSError, archive: Path, where: Path) -> DataError:
    """One line for an unpacking that the disk refused: the folder, the room needed where known."""
    kept = f"the archives stay in {archive.parent}; then run the same command again"
    if disk_full(err):
        size = unpacked_size(archive)
        need = (f"it needs {human_bytes(size)} unpacked" if size is not None
                else f"it needs more than its {human_bytes(archive.stat().st_size)} packed")
        return DataError(f"no space left on device to unpack {archive.name} into {where} ({need}, "
                         f"{free_text(where)}); free space or give another --data-root ({kept})")
    hint = "give a --data-root you can write to" if read_only(err) else "check the folder"
    return DataError(f"cannot unpack {archive.name} into {where} ({err.strerror or err}: "
                     f"{err.filename or where}); {hint} ({kept})")


def is_installed(target: Path) -> bool:
    return (target / MARKER).is_file()


def install(entry: DatasetDownload, archives: list[Path], target: Path, record: dict) -> Path:
    """Unpack ``archives`` and arrange them as ``entry.layout`` says into ``target``, atomically;
    ``record`` (what was installed from where) is written into the marker file."""
    remove_leftovers(target.parent, f".{target.name}.*.tmp")  # staging of killed runs (dead processes)
    staging = make_staging_dir(target)
    try:
        unpacked = staging / "unpacked"
        for archive in archives:
            try:
                unpack(archive, unpacked)
            except OSError as err:  # a full disk or a read-only folder names where, and the room needed
                shutil.rmtree(staging, ignore_errors=True)  # first, so the line says what is free without it
                raise unpack_error(err, archive, target.parent) from None
        result = staging / "result"
        try:
            LAYOUTS[entry.layout](unpacked, result, entry)
            if entry.removed:
                record = {**record, "removed": {"list": entry.removed, "files": remove_listed(result, entry.removed)}}
            atomic_write_json(result / MARKER, record)
            os.rename(result, target)
        except OSError as err:
            if not (disk_full(err) or read_only(err)):
                raise
            shutil.rmtree(staging, ignore_errors=True)
            raise DataError(f"cannot arrange {target.name} in {target.parent} ({err.strerror or err}; "
                            f"{free_text(target.parent)}); free space or give another --data-root (the archives "
                            f"stay in {archives[0].parent}; then run the same command again)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
