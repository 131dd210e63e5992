"""`fedstyle data download` under faults (issue 55 items 2, 5, 7, 12): a server that never stops sending,
a disk that fills (simulated at the write, never by filling one), a transfer interrupted in its first
megabyte, and configuration of the wrong shape. Every source is a loopback server on 127.0.0.1."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import time
import zipfile
from pathlib import Path

import pytest

from archive_server import ENDLESS_CAP, ArchiveServer
from fedstyle.cli.main import main
from fedstyle.data.download import RECORD_NAME, download_dataset
from fedstyle.data.download.layout import MARKER
from fedstyle.data.download.table import SOURCES_ENV
from fedstyle.errors import ConfigError, DataError, FedstyleError
from fedstyle.io import DirectoryLock

CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
DOMAINS = ("art_painting", "cartoon", "photo", "sketch")


@pytest.fixture(scope="module")
def pacs_zip() -> bytes:
    """A PACS.zip in miniature (one stored text file per cell: unpacking needs no image)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as handle:
        for domain in DOMAINS:
            for cls in CLASSES:
                handle.writestr(f"kfold/{domain}/{cls}/pic.jpg", f"{domain}/{cls}".encode() * 40)
    return out.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def left_behind(root: Path) -> list[str]:
    """Everything under ``root`` (relative paths), to check that a failure leaves nothing."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def sent_by(server: ArchiveServer, path: str) -> int:
    """Bytes the server's endless answer at ``path`` wrote before the client hung up (it notes it on its thread)."""
    deadline = time.monotonic() + 10
    while path not in server.behaviour.sent and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.behaviour.sent[path]


# -- item 2: a download is bounded by the archive's size -------------------------------------------------------


def test_an_endless_answer_stops_at_the_known_size_and_the_next_source_serves_it(tmp_path, pacs_zip):
    """No Content-Length and bytes without end: the transfer stops past the published size, deletes the part and
    tries the next source; before, it wrote until the disk was full (here: the server's 64 MB cap)."""
    notes = []
    with ArchiveServer() as server:
        server.behaviour.files["/endless/PACS.zip"] = pacs_zip
        server.behaviour.endless["/endless/PACS.zip"] = False
        server.behaviour.files["/good/PACS.zip"] = pacs_zip
        sources = {"PACS.zip": {"urls": [server.url("/endless/PACS.zip"), server.url("/good/PACS.zip")],
                                "sha256": sha(pacs_zip), "size": len(pacs_zip)}}
        done = download_dataset("pacs", tmp_path, sources=sources, progress=False, say=notes.append)
        assert sent_by(server, "/endless/PACS.zip") < ENDLESS_CAP // 4  # it stopped reading long before the cap
    assert done.fresh and (tmp_path / "PACS" / MARKER).is_file()
    assert len(notes) == 1 and f"sent more than the published size ({len(pacs_zip):,} bytes)" in notes[0]
    assert "deleted the partial file" in notes[0]
    assert left_behind(tmp_path / "downloads") == []


def test_more_than_content_length_is_never_written(tmp_path, pacs_zip):
    """No size known but the server's Content-Length: the archive ends there, whatever follows on the wire."""
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        server.behaviour.endless["/PACS.zip"] = True
        done = download_dataset("pacs", tmp_path, sources={"PACS.zip": {"urls": [server.url("/PACS.zip")]}},
                                progress=False, say=lambda line: None, keep_archives=True)
    assert (tmp_path / "downloads" / "PACS.zip").read_bytes() == pacs_zip
    assert done.recorded == ("PACS.zip",)


def test_a_server_announcing_another_size_is_refused_before_a_byte_is_written(tmp_path, pacs_zip):
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip + b"trailing bytes"
        sources = {"PACS.zip": {"urls": [server.url("/PACS.zip")], "size": len(pacs_zip)}}
        with pytest.raises(DataError, match=f"serves {len(pacs_zip) + 14:,} bytes, not the published size"):
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
    assert left_behind(tmp_path) == []


# -- items 2 and 7: the local disk is never a source's fault ---------------------------------------------------


def full_disk_after(allowed: int):
    """``open`` for transfer.py whose files take ``allowed`` bytes, then fail every write with ENOSPC."""
    import builtins

    class FillingFile:
        def __init__(self, handle):
            self.handle, self.room = handle, allowed

        def write(self, data):
            if not self.room:
                raise OSError(errno.ENOSPC, "No space left on device")
            taken = bytes(data[: self.room])
            self.room -= len(taken)
            return self.handle.write(taken)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    return lambda *args, **kwargs: FillingFile(builtins.open(*args, **kwargs))


def test_a_full_disk_at_the_sidecar_is_one_line_and_no_source_is_blamed(tmp_path, monkeypatch, capsys, pacs_zip):
    """The sidecar write in the transfer's start sat inside `except OSError -> unreachable`: a full disk was the
    mirror's fault and the next source was tried into the same disk."""
    real_write_text = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".part.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    with ArchiveServer() as server:
        server.behaviour.files["/mirror/PACS.zip"] = pacs_zip
        server.behaviour.files["/second/PACS.zip"] = pacs_zip
        sources = tmp_path / "sources.json"
        real_write_text(sources, json.dumps({"PACS.zip": {"urls": [server.url("/second/PACS.zip")]}}))
        monkeypatch.setenv(SOURCES_ENV, str(sources))
        code = main(["data", "download", "pacs", "--data-root", str(tmp_path / "data"), "--quiet",
                     "--mirror", server.url("/mirror")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("fedstyle: error: no space left on device for ") and ".part.json" in err
    assert "unreachable" not in err and "--data-root" in err
    assert [path for path, _ in server.behaviour.log] == ["/mirror/PACS.zip"]  # the next source is not tried
    assert left_behind(tmp_path / "data") == []


@pytest.mark.parametrize("room", [0, 5_000])
def test_a_full_disk_during_the_part_write_names_the_file_and_the_room_needed(tmp_path, monkeypatch, pacs_zip, room):
    """ENOSPC at the .part: one line with the path and what is still needed; the next source is not tried. A part
    with bytes in it is a true beginning of the file (its size is known) and is kept, and the rerun resumes it."""
    import fedstyle.data.download.transfer as transfer

    monkeypatch.setattr(transfer, "open", full_disk_after(room), raising=False)
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        server.behaviour.files["/second/PACS.zip"] = pacs_zip
        sources = {"PACS.zip": {"urls": [server.url("/PACS.zip"), server.url("/second/PACS.zip")],
                                "sha256": sha(pacs_zip)}}
        with pytest.raises(FedstyleError) as full:
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
        message = str(full.value)
        parts = list((tmp_path / "downloads").glob("PACS.zip.*.part")) if room else []
        assert "\n" not in message and not isinstance(full.value, DataError)
        assert message.startswith("no space left on device for ") and ".part (it needs " in message
        assert [path for path, _ in server.behaviour.log] == ["/PACS.zip"]
        if not room:
            assert left_behind(tmp_path) == []
            return
        assert len(parts) == 1 and parts[0].stat().st_size == room
        assert f"resume the 5.0 kB kept in {parts[0]}" in message
        assert not (tmp_path / "downloads" / ".lock").exists()
        monkeypatch.undo()
        download_dataset("pacs", tmp_path, sources=sources, progress=False)
    assert server.behaviour.log[-1] == ("/PACS.zip", f"bytes={room}-")
    assert (tmp_path / "PACS" / MARKER).is_file()


def test_too_little_room_for_a_known_size_is_said_before_downloading(tmp_path, monkeypatch, pacs_zip):
    import fedstyle.data.download.transfer as transfer
    import fedstyle.io as fio

    monkeypatch.setattr(transfer, "free_bytes", lambda path: 500)
    monkeypatch.setattr(fio, "free_bytes", lambda path: 500)
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        sources = {"PACS.zip": {"urls": [server.url("/PACS.zip")], "size": len(pacs_zip)}}
        with pytest.raises(FedstyleError, match=r"no space left on device for .*PACS\.zip\.\w+\.part: it needs "
                                                r"\d+\.\d kB more, 500 bytes free; free space"):
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
    assert left_behind(tmp_path) == []


def test_a_full_disk_while_unpacking_names_the_folder_and_the_unpacked_size(tmp_path, monkeypatch, pacs_zip):
    """The extraction's ENOSPC said "No space left on device" and nothing else."""
    from fedstyle.io import human_bytes

    def full(self, member, path=None, pwd=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "extract", full)
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        sources = {"PACS.zip": {"urls": [server.url("/PACS.zip")], "sha256": sha(pacs_zip)}}
        with pytest.raises(DataError) as full_disk:
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
    unpacked = sum(len(f"{d}/{c}".encode()) * 40 for d in DOMAINS for c in CLASSES)
    message = str(full_disk.value)
    assert "\n" not in message
    assert message.startswith(f"no space left on device to unpack PACS.zip into {tmp_path} (it needs "
                              f"{human_bytes(unpacked)} unpacked, ")
    assert f"the archives stay in {tmp_path / 'downloads'}" in message
    assert left_behind(tmp_path) == ["downloads", "downloads/PACS.zip"]  # no staging folder, no lock file


# -- item 12: nothing left but what a rerun resumes -----------------------------------------------------------


def test_a_stall_in_the_first_megabyte_keeps_what_arrived_and_the_rerun_resumes(tmp_path, pacs_zip):
    """100 kB, then silence: the timeout keeps the 100 kB (1 MB blocks read whole lost them, an empty .part was
    kept and the rerun started over)."""
    archive = bytes(range(256)) * 1200 + pacs_zip  # over 100 kB; bytes before a zip leave it readable
    sources = {"PACS.zip": {"sha256": sha(archive)}}
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = archive
        server.behaviour.stall_after["/PACS.zip"] = 100_000
        sources["PACS.zip"]["urls"] = [server.url("/PACS.zip")]
        with pytest.raises(DataError, match="connection broke after 100.0 kB .*resume the partial download kept in"):
            download_dataset("pacs", tmp_path, sources=sources, progress=False, timeout=0.5)
        parts = list((tmp_path / "downloads").glob("PACS.zip.*.part"))
        assert len(parts) == 1 and parts[0].stat().st_size == 100_000
        assert not (tmp_path / "downloads" / ".lock").exists()
        done = download_dataset("pacs", tmp_path, sources=sources, progress=False)
    assert server.behaviour.log[-1] == ("/PACS.zip", "bytes=100000-") and done.fresh


def test_a_stall_before_any_byte_leaves_nothing(tmp_path, pacs_zip):
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        server.behaviour.stall_after["/PACS.zip"] = 0
        with pytest.raises(DataError) as failed:
            download_dataset("pacs", tmp_path, sources={"PACS.zip": {"urls": [server.url("/PACS.zip")]}},
                             progress=False, timeout=0.3)
    assert "resume" not in str(failed.value)
    assert left_behind(tmp_path) == []


def test_an_interrupt_leaves_no_lock_and_a_data_root_made_for_nothing_goes(tmp_path, monkeypatch, pacs_zip):
    import fedstyle.data.download as download

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(download, "fetch_archive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        download_dataset("pacs", tmp_path / "new" / "root", sources={"PACS.zip": {"urls": ["http://127.0.0.1:9/"]}},
                         progress=False)
    assert left_behind(tmp_path) == []


def test_a_removed_lock_file_is_never_held_twice(tmp_path, monkeypatch):
    """remove=True unlinks the lock file before unlocking it. A process that opened the old file just before that
    and locks it afterwards must notice that the path now names another file, and lock that one instead."""
    first = DirectoryLock(tmp_path, "download folder", remove=True).acquire()
    stale = os.open(first.path, os.O_RDWR)  # a second process opens the file ...
    first.release()  # ... the first holder removes it and unlocks ...
    assert not first.path.exists()
    third = DirectoryLock(tmp_path, "download folder").acquire()  # ... and a third process takes a new file
    real_open, handed = os.open, []

    def racing_open(path, *args, **kwargs):
        if not handed and str(path) == str(third.path):
            handed.append(stale)
            return stale  # the second process's open happened before the removal
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    from fedstyle.io import LockedError

    with pytest.raises(LockedError):  # it locked the stale file, saw the path moved on, and met the third's lock
        DirectoryLock(tmp_path, "download folder").acquire()
    monkeypatch.undo()
    assert handed == [stale]
    third.release()


# -- item 5: configuration of the wrong shape ----------------------------------------------------------------


@pytest.mark.parametrize("body, names", [
    ('null', "holds null, not an object"),
    ('"PACS.zip"', "holds a string, not an object"),
    ('[{"urls": []}]', "holds an array, not an object"),
    ('{"PACS.zip": null}', "PACS.zip is null, not an object"),
    ('{"PACS.zip": "https://x.org/PACS.zip"}', 'PACS.zip is "https://x.org/PACS.zip", not an object'),
    ('{"PACS.zip": {"sha256": 123}}', "PACS.zip.sha256 is 123, not a SHA-256"),
    ('{"PACS.zip": {"size": "abc"}}', 'PACS.zip.size is "abc", not a size in bytes'),
    ('{"PACS.zip": {"size": true}}', "PACS.zip.size is true, not a size in bytes"),
    ('{"PACS.zip": {"urls": "https://x.org/PACS.zip"}}', 'PACS.zip.urls is "https://x.org/PACS.zip", not a list'),
    ('{"PACS.zip": {"urls": [null]}}', r"PACS.zip.urls\[0\] is null, not a URL"),
    ('{"PACS.zip": {"urls": ["not a url"]}}', r'PACS.zip.urls\[0\] is "not a url", not a URL'),
])
def test_download_sources_of_the_wrong_shape_get_one_line(tmp_path, monkeypatch, capsys, body, names):
    sources = tmp_path / "sources.json"
    sources.write_text(body)
    monkeypatch.setenv(SOURCES_ENV, str(sources))
    code = main(["data", "download", "pacs", "--data-root", str(tmp_path / "data"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    where = f"{SOURCES_ENV}={sources}" if "holds" in names else f"{sources}: "
    assert err.startswith(f"fedstyle: error: {where}")
    assert re.search(names, err) and ("fix or unset it" in err or f"or unset {SOURCES_ENV}" in err)
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("mirror", ["", "not a url", "mirror.example.org/domainbed", "htp://x"])
def test_a_mirror_that_is_no_url_gets_one_line(tmp_path, capsys, mirror):
    code = main(["data", "download", "pacs", "--data-root", str(tmp_path / "data"), "--quiet", "--mirror", mirror])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"fedstyle: error: --mirror is {json.dumps(mirror)}, not a URL: give one such as https://")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("record, names", [
    ('null', "holds null, not an object"),
    ('["PACS.zip"]', "holds an array, not an object"),
    ('{"PACS.zip": null}', "PACS.zip is null, not an object"),
    ('{"PACS.zip": {"sha256": 123}}', "PACS.zip.sha256 is 123, not a SHA-256"),
    ('{"PACS.zip": {"size": 5}}', "PACS.zip.sha256 is null, not a SHA-256"),
    ('{"PACS.zip": {"sha256": "' + "a" * 64 + '", "size": "abc"}}', 'PACS.zip.size is "abc", not a size'),
])
def test_a_first_use_record_of_the_wrong_shape_gets_one_line(tmp_path, capsys, record, names):
    (tmp_path / RECORD_NAME).write_text(record)
    with pytest.raises((DataError, ConfigError)) as refused:
        download_dataset("pacs", tmp_path, sources={"PACS.zip": {"urls": ["http://127.0.0.1:9/PACS.zip"]}},
                         progress=False)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(str(tmp_path / RECORD_NAME)) and names in message
    assert left_behind(tmp_path) == [RECORD_NAME]


def test_an_uppercase_sha256_is_the_same_checksum(tmp_path, pacs_zip):
    """PowerShell's Get-FileHash prints upper case; the right archive was refused and deleted."""
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        sources = {"PACS.zip": {"urls": [server.url("/PACS.zip")], "sha256": sha(pacs_zip).upper()}}
        done = download_dataset("pacs", tmp_path / "given", sources=sources, progress=False)
        assert done.fresh
        # a first-use record written (or pasted) in upper case holds too, and the archive put in place stays
        (tmp_path / "recorded" / "downloads").mkdir(parents=True)
        (tmp_path / "recorded" / RECORD_NAME).write_text(json.dumps({"PACS.zip": {"sha256": sha(pacs_zip).upper()}}))
        (tmp_path / "recorded" / "downloads" / "PACS.zip").write_bytes(pacs_zip)
        again = download_dataset("pacs", tmp_path / "recorded", keep_archives=True, progress=False,
                                 sources={"PACS.zip": {"urls": [server.url("/PACS.zip")]}})
    assert again.fresh and (tmp_path / "recorded" / "downloads" / "PACS.zip").read_bytes() == pacs_zip
    assert server.behaviour.log == [("/PACS.zip", None)]  # the second used the file in place


def test_an_answer_without_a_length_that_closes_early_is_kept_for_a_resume(tmp_path, pacs_zip):
    """No Content-Length, the published size known, the connection closed half-way: a truncated file to resume,
    not a size mismatch to delete (the known size bounds the transfer both ways)."""
    import fedstyle.data.download.transfer as transfer
    from fedstyle.data.download.table import Archive

    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip[:5000]  # what the server manages before it stops
        server.behaviour.endless["/PACS.zip"] = False
        server.behaviour.stop.set()  # the endless answer ends right after the file's bytes: a close-delimited 5000
        expected = transfer.Expected(sha(pacs_zip), len(pacs_zip), "published")
        with pytest.raises(transfer.SourceFailed, match=f"closed after 5.0 kB of {len(pacs_zip) / 1000:.1f} kB") as failed:
            transfer.fetch_from(server.url("/PACS.zip"), Archive("PACS.zip", ()), tmp_path, False, 5, expected)
    assert failed.value.kept is not None and failed.value.kept.stat().st_size == 5000
