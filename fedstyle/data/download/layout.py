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
  side by side); that folder becomes the dataset, whatever its name in the archive.
- ``terra_incognita``: DomainBed's arrangement (:mod:`fedstyle.data.download.terra`).
- ``camelyon17``: WILDS's folder, the one holding ``metadata.csv`` and ``patches/``.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Callable

from fedstyle.data.download.table import DatasetDownload
from fedstyle.errors import DataError
from fedstyle.io import atomic_write_json, make_staging_dir, remove_leftovers

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
                handle.extractall(into)
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
    os.rename(found, result)


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
            unpack(archive, unpacked)
        result = staging / "result"
        LAYOUTS[entry.layout](unpacked, result, entry)
        atomic_write_json(result / MARKER, record)
        os.rename(result, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
