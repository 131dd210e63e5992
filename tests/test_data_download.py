"""`fedstyle data download` end to end against a loopback HTTP server (tests/archive_server.py):
archives in the real layouts, a clean download, a resumed one, a corrupted one, a server that dies
mid-transfer, mirrors in order, first-use checksums, and an extraction killed half-way. No test
touches the network: every source is 127.0.0.1 (or a closed port on it)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from archive_server import ArchiveServer
from fedstyle.cli.main import main
from fedstyle.data import load_dataset
from fedstyle.data.download import DOWNLOADS, RECORD_NAME, download_dataset
from fedstyle.data.download.layout import MARKER
from fedstyle.data.download.table import SOURCES_ENV
from fedstyle.errors import DataError

PACS_DOMAINS = DOWNLOADS.get("pacs").domains
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as handle:
        for name, data in members.items():
            handle.writestr(name, data)
    return out.getvalue()


def tar_gz_bytes(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as handle:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            handle.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture(scope="module")
def pacs_zip() -> bytes:
    """DomainBed's PACS.zip in miniature: kfold/<domain>/<class>/<image>.jpg, 2 images per cell."""
    members, seed = {}, 0
    for domain in PACS_DOMAINS:
        for cls in PACS_CLASSES:
            for k in range(2):
                members[f"kfold/{domain}/{cls}/pic_{k}.jpg"] = jpeg(seed)
                seed += 1
    return zip_bytes(members)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pacs_sources(server: ArchiveServer, *paths: str, digest: str | None = None) -> dict:
    entry = {"urls": [server.url(p) for p in paths]}
    if digest:
        entry["sha256"] = digest
    return {"PACS.zip": entry}


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/PACS.zip"


def nothing_half_done(root: Path, folder: str = "PACS") -> None:
    """No dataset folder and no staging folder that could pass for one."""
    if not root.exists():  # a data root the failed call made is removed again
        return
    assert not (root / folder).exists()
    assert not [p for p in root.iterdir() if p.name.startswith(f".{folder}.")]


def test_clean_download_through_the_cli_reads_as_pacs(tmp_path, monkeypatch, capsys, pacs_zip):
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        sources = tmp_path / "sources.json"
        sources.write_text(json.dumps(pacs_sources(server, "/PACS.zip", digest=sha(pacs_zip))))
        monkeypatch.setenv(SOURCES_ENV, str(sources))
        assert main(["data", "download", "pacs", "--data-root", str(tmp_path / "data"), "--quiet"]) == 0
    out = capsys.readouterr().out
    root = tmp_path / "data"
    assert f"--dataset pacs --data-root {root / 'PACS'}" in out
    assert sorted(p.name for p in (root / "PACS").iterdir() if p.is_dir()) == sorted(PACS_DOMAINS)
    marker = json.loads((root / "PACS" / MARKER).read_text())
    assert marker["archives"]["PACS.zip"]["sha256"] == sha(pacs_zip)
    assert not (root / "downloads" / "PACS.zip").exists()  # archives are deleted once unpacked
    assert not (root / RECORD_NAME).exists()  # a published checksum needs no first-use record
    dataset = load_dataset("pacs", data_root=str(root / "PACS"), resolution=8, progress=False)
    assert list(dataset.domains) == list(PACS_DOMAINS) and dataset.num_classes == 7
    assert all(dataset.size(d) == 14 for d in PACS_DOMAINS)
    # a second call finds the installed folder and downloads nothing
    with ArchiveServer() as server:
        again = download_dataset("pacs", root, sources=pacs_sources(server, "/PACS.zip"), progress=False)
        assert not again.fresh and server.behaviour.log == []


def test_an_interrupted_transfer_resumes_with_range_and_verifies(tmp_path, pacs_zip):
    half = len(pacs_zip) // 2
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        server.behaviour.drop_after["/PACS.zip"] = half
        sources = pacs_sources(server, "/PACS.zip", digest=sha(pacs_zip))
        with pytest.raises(DataError, match="resume the partial download kept in"):
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
        parts = list((tmp_path / "downloads").glob("PACS.zip.*.part"))
        assert len(parts) == 1 and parts[0].stat().st_size == half
        nothing_half_done(tmp_path)
        done = download_dataset("pacs", tmp_path, sources=sources, progress=False)
    assert server.behaviour.log == [("/PACS.zip", None), ("/PACS.zip", f"bytes={half}-")]
    assert done.fresh and (tmp_path / "PACS" / MARKER).is_file()
    assert not list((tmp_path / "downloads").glob("PACS.zip*"))


def test_a_server_that_ignores_range_restarts_the_file(tmp_path, pacs_zip):
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        server.behaviour.drop_after["/PACS.zip"] = 1000
        sources = pacs_sources(server, "/PACS.zip", digest=sha(pacs_zip))
        with pytest.raises(DataError):
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
        server.behaviour.ignore_range = True
        download_dataset("pacs", tmp_path, sources=sources, progress=False)  # 200 instead of 206: written afresh
    assert (tmp_path / "PACS" / MARKER).is_file()


def test_a_corrupted_archive_is_refused_and_nothing_is_left(tmp_path, pacs_zip):
    corrupted = bytearray(pacs_zip)
    corrupted[len(corrupted) // 3] ^= 0xFF
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = bytes(corrupted)
        with pytest.raises(DataError, match="checksum refused") as refused:
            download_dataset("pacs", tmp_path, sources=pacs_sources(server, "/PACS.zip", digest=sha(pacs_zip)),
                             progress=False)
    assert "\n" not in str(refused.value)
    assert f"put it at {tmp_path / 'downloads' / 'PACS.zip'}" in str(refused.value)
    assert not (tmp_path / "downloads").exists()  # no archive, no partial file, no lock file: the folder goes
    nothing_half_done(tmp_path)


def test_a_server_that_dies_mid_transfer_gets_one_line_and_keeps_the_partial(tmp_path, monkeypatch, capsys, pacs_zip):
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        server.behaviour.drop_after["/PACS.zip"] = 4096
        sources = tmp_path / "sources.json"
        sources.write_text(json.dumps(pacs_sources(server, "/PACS.zip")))
        monkeypatch.setenv(SOURCES_ENV, str(sources))
        code = main(["data", "download", "pacs", "--data-root", str(tmp_path), "--quiet"])
        server.stop()  # and it stays down
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("fedstyle: error: could not download PACS.zip")
    assert "broke after" in err or "closed after" in err
    assert "Manual step: download PACS.zip" in err and "resume the partial download" in err
    parts = list((tmp_path / "downloads").glob("PACS.zip.*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == 4096
    nothing_half_done(tmp_path)


def test_sources_are_tried_in_order_until_one_serves_the_archive(tmp_path, pacs_zip):
    notes = []
    with ArchiveServer() as server:
        server.behaviour.files["/good/PACS.zip"] = pacs_zip
        server.behaviour.status["/gone/PACS.zip"] = 404
        server.behaviour.html.add("/quota/PACS.zip")
        sources = {"PACS.zip": {"urls": [closed_port_url(), server.url("/gone/PACS.zip"),
                                         server.url("/quota/PACS.zip"), server.url("/good/PACS.zip"),
                                         server.url("/never/PACS.zip")], "sha256": sha(pacs_zip)}}
        download_dataset("pacs", tmp_path, sources=sources, progress=False, say=notes.append)
    assert [path for path, _ in server.behaviour.log] == ["/gone/PACS.zip", "/quota/PACS.zip", "/good/PACS.zip"]
    assert len(notes) == 3 and "unreachable" in notes[0] and "HTTP 404" in notes[1] and "web page" in notes[2]
    # --mirror bases are tried before the table's sources
    with ArchiveServer() as server:
        server.behaviour.files["/mirror/PACS.zip"] = pacs_zip
        download_dataset("pacs", tmp_path / "second", sources={"PACS.zip": {"urls": [closed_port_url()]}},
                         mirrors=(server.url("/mirror"),), progress=False)
    assert server.behaviour.log == [("/mirror/PACS.zip", None)]


def test_every_source_failing_names_the_manual_step_and_a_hand_placed_file_is_used(tmp_path, pacs_zip):
    with pytest.raises(DataError) as failed:
        download_dataset("pacs", tmp_path, sources={"PACS.zip": {"urls": [closed_port_url()]}}, progress=False)
    message = str(failed.value)
    assert "\n" not in message and "Manual step: download PACS.zip (DomainBed's copy: " in message
    assert f"put it at {tmp_path / 'downloads' / 'PACS.zip'}" in message
    assert f"fedstyle data download pacs --data-root {tmp_path}" in message and "hf:flwrlabs/pacs" in message
    assert not (tmp_path / "downloads").exists()  # nothing kept: the folder and its lock file are gone
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "PACS.zip").write_bytes(pacs_zip)  # the manual step
    done = download_dataset("pacs", tmp_path, sources={"PACS.zip": {"urls": [closed_port_url()]}}, progress=False)
    assert done.fresh and done.recorded == ("PACS.zip",)


def test_first_use_records_the_checksum_and_later_downloads_must_match(tmp_path, pacs_zip):
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        first = download_dataset("pacs", tmp_path, sources=pacs_sources(server, "/PACS.zip"), progress=False,
                                 say=lambda line: None)
        assert first.recorded == ("PACS.zip",)
        record = json.loads((tmp_path / RECORD_NAME).read_text())["PACS.zip"]
        assert record["sha256"] == sha(pacs_zip) and record["url"] == server.url("/PACS.zip")
        # the folder is deleted; the server now serves other (valid) bytes: refused against the record
        import shutil

        shutil.rmtree(tmp_path / "PACS")
        server.behaviour.files["/PACS.zip"] = zip_bytes({"kfold/x.txt": b"another archive"})
        with pytest.raises(DataError, match="first-use record"):
            download_dataset("pacs", tmp_path, sources=pacs_sources(server, "/PACS.zip"), progress=False)
    nothing_half_done(tmp_path)


def test_a_truncated_unverified_archive_is_not_recorded_and_is_deleted(tmp_path, pacs_zip):
    with ArchiveServer() as server:  # no Content-Length check can catch it: the server says the short size
        server.behaviour.files["/PACS.zip"] = pacs_zip[: len(pacs_zip) - 200]
        with pytest.raises(DataError, match="cannot be unpacked .*deleted"):
            download_dataset("pacs", tmp_path, sources=pacs_sources(server, "/PACS.zip"), progress=False)
    assert not (tmp_path / RECORD_NAME).exists() and not (tmp_path / "downloads" / "PACS.zip").exists()
    nothing_half_done(tmp_path)


def test_a_killed_extraction_leaves_nothing_that_looks_complete(tmp_path, monkeypatch, pacs_zip):
    import fedstyle.data.download.layout as layout

    def killed(unpacked, result, entry):
        (result / "art_painting").mkdir(parents=True)  # half arranged when the process dies
        raise KeyboardInterrupt

    monkeypatch.setitem(layout.LAYOUTS, "domain_folders", killed)
    with ArchiveServer() as server:
        server.behaviour.files["/PACS.zip"] = pacs_zip
        sources = pacs_sources(server, "/PACS.zip", digest=sha(pacs_zip))
        with pytest.raises(KeyboardInterrupt):
            download_dataset("pacs", tmp_path, sources=sources, progress=False)
        nothing_half_done(tmp_path)
        # a SIGKILL leaves its staging folder behind: a dead process's staging is cleared by the next run
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        from fedstyle.io import temp_prefix

        # the pid swapped in its own field (a str.replace could also hit the pid's digits in the host name)
        prefix = temp_prefix("PACS")
        assert prefix.endswith(f"-{os.getpid()}.")
        stale = tmp_path / (prefix[: -len(f"{os.getpid()}.")] + f"{dead.stdout.strip()}.")
        (Path(str(stale) + "x.tmp") / "result" / "photo").mkdir(parents=True)
        monkeypatch.undo()
        download_dataset("pacs", tmp_path, sources=sources, progress=False)
    assert (tmp_path / "PACS" / MARKER).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".PACS.")]


def test_a_folder_not_made_by_the_command_is_left_alone(tmp_path):
    (tmp_path / "PACS" / "photo").mkdir(parents=True)
    with pytest.raises(DataError, match="was not made by `fedstyle data download`"):
        download_dataset("pacs", tmp_path, sources={"PACS.zip": {"urls": [closed_port_url()]}}, progress=False)


def test_domainnet_six_zips_and_split_lists_make_one_folder_less_domainbeds_duplicates(tmp_path):
    """DomainBed's download.py deletes the 9,431 images of its domain_net_duplicates.txt after unpacking; so does
    this download (two of them are in the miniature zips, by their real paths), and the marker says how many."""
    entry = DOWNLOADS.get("domainnet")
    duplicates = ["clipart/animal_migration/clipart_006_000227.jpg", "sketch/zebra/sketch_344_000133.jpg"]
    files, sources = {}, {}
    for archive in entry.archives:
        if archive.filename.endswith(".zip"):
            domain = archive.filename.removesuffix(".zip")
            members = {f"{domain}/{cls}/{domain}_{cls}_{k}.jpg": jpeg(k)
                       for cls in ("apple", "zebra") for k in range(2)}
            members.update({path: jpeg(9) for path in duplicates if path.startswith(f"{domain}/")})
            data = zip_bytes(members)
        else:
            data = f"{archive.filename.split('_')[0]}/apple/x.jpg 0\n".encode()
        files[f"/{archive.filename}"] = data
    with ArchiveServer() as server:
        server.behaviour.files.update(files)
        sources = {name.lstrip("/"): {"urls": [server.url(name)], "sha256": sha(data), "size": len(data)}
                   for name, data in files.items()}
        download_dataset("domainnet", tmp_path, sources=sources, progress=False)
    root = tmp_path / "domain_net"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(entry.domains)
    assert (root / "clipart_train.txt").read_text() == "clipart/apple/x.jpg 0\n"
    assert len(list(root.glob("*.txt"))) == 12 and len(list((root / "real" / "zebra").iterdir())) == 2
    assert not any((root / path).exists() for path in duplicates)
    assert len(list((root / "sketch" / "zebra").iterdir())) == 2  # the sketch zebras that are no duplicates stay
    assert json.loads((root / MARKER).read_text())["removed"] == {"list": "domain_net_duplicates.txt", "files": 2}


def test_the_shipped_duplicates_list_is_domainbeds_and_is_package_data():
    """Byte for byte DomainBed's domainbed/misc/domain_net_duplicates.txt (lists/README.md names the commit), and
    matched by pyproject.toml's package-data, so a wheel carries it."""
    import tomllib
    from importlib.resources import files

    import fedstyle.data.download as download_package
    from fedstyle.data.split_lists import shipped_list

    listed = files("fedstyle.data.download").joinpath("lists", "domain_net_duplicates.txt").read_bytes()
    assert sha(listed) == "a52b4ab70203f4f3df381077694dba3e33ff44c26407e1c5faca76919c702770"
    lines = shipped_list("domain_net_duplicates.txt")
    assert len(lines) == len(set(lines)) == 9431
    assert {line.split("/")[0] for line in lines} <= set(DOWNLOADS.get("domainnet").domains)
    project = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package_dir = Path(download_package.__file__).parent
    assert any(package_dir.joinpath("lists", "domain_net_duplicates.txt") in package_dir.glob(g)
               for g in globs["fedstyle.data.download"])


def terra_annotations(files: dict[str, dict]) -> bytes:
    """eccv_18_annotations.tar.gz in miniature: eccv_18_annotation_files/<name>.json, as LILA ships it."""
    return tar_gz_bytes({f"eccv_18_annotation_files/{name}": json.dumps(labels).encode()
                         for name, labels in files.items()})


def test_terra_incognita_follows_domainbeds_june_2024_recipe(tmp_path):
    """DomainBed since 3cf2e20: the images of eccv_18_all_images_sm.tar.gz, labelled by the five files of
    eccv_18_annotations.tar.gz merged key by key; four locations, ten categories, an image under each kept
    category. The made-up labels spread one image's annotations over two files, so only the merge files it."""
    images = {f"eccv_18_all_images_sm/img{i}.jpg": jpeg(i) for i in range(7)}
    categories = [{"id": 1, "name": "bird"}, {"id": 2, "name": "cat"}, {"id": 3, "name": "deer"}]
    files = {
        "cis_test_annotations.json": {
            "info": {"version": "x"}, "categories": categories,
            "images": [{"id": "a", "file_name": "img0.jpg", "location": 38},
                       {"id": "b", "file_name": "img1.jpg", "location": "46"}],
            "annotations": [{"image_id": "a", "category_id": 1}, {"image_id": "b", "category_id": 2}]},
        "cis_val_annotations.json": {
            "info": {}, "categories": categories,
            "images": [{"id": "c", "file_name": "img2.jpg", "location": 100}],
            "annotations": [{"image_id": "c", "category_id": 1}, {"image_id": "a", "category_id": 2}]},
        "train_annotations.json": {
            "info": {}, "categories": categories,
            "images": [{"id": "d", "file_name": "img3.jpg", "location": 43}],
            "annotations": [{"image_id": "d", "category_id": 2}]},
        "trans_test_annotations.json": {
            "info": {}, "categories": categories,
            "images": [{"id": "e", "file_name": "img4.jpg", "location": 7}],  # a location DomainBed leaves out
            "annotations": [{"image_id": "e", "category_id": 1}]},
        "trans_val_annotations.json": {
            "info": {}, "categories": categories,
            "images": [{"id": "f", "file_name": "img5.jpg", "location": 38},
                       {"id": "g", "file_name": "img6.jpg", "location": 46}],
            "annotations": [{"image_id": "f", "category_id": 3},  # a category DomainBed leaves out
                            {"image_id": "g", "category_id": 1}]},
    }
    served = {"/eccv_18_all_images_sm.tar.gz": tar_gz_bytes(images),
              "/eccv_18_annotations.tar.gz": terra_annotations(files)}
    with ArchiveServer() as server:
        server.behaviour.files.update(served)
        sources = {name.lstrip("/"): {"urls": [server.url(name)]} for name in served}
        done = download_dataset("terra_incognita", tmp_path, sources=sources, progress=False, say=lambda line: None)
    root = tmp_path / "terra_incognita"
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*.jpg"))
    assert found == ["location_100/bird/img2.jpg", "location_38/bird/img0.jpg", "location_38/cat/img0.jpg",
                     "location_43/cat/img3.jpg", "location_46/bird/img6.jpg", "location_46/cat/img1.jpg"]
    assert (root / "location_38" / "cat" / "img0.jpg").read_bytes() == images["eccv_18_all_images_sm/img0.jpg"]
    assert set(done.recorded) == {"eccv_18_all_images_sm.tar.gz", "eccv_18_annotations.tar.gz"}


def test_terra_incognita_sources_are_domainbeds_current_ones_and_a_missing_label_file_is_named(tmp_path):
    entry = DOWNLOADS.get("terra_incognita")
    base = "https://storage.googleapis.com/public-datasets-lila/caltechcameratraps"
    assert {a.filename: a.urls for a in entry.archives} == {
        "eccv_18_all_images_sm.tar.gz": (f"{base}/eccv_18_all_images_sm.tar.gz",),
        "eccv_18_annotations.tar.gz": (f"{base}/eccv_18_annotations.tar.gz",)}  # lilablobssc is gone
    four = {name: {"categories": [], "images": [], "annotations": []}
            for name in ("cis_test_annotations.json", "cis_val_annotations.json", "train_annotations.json",
                         "trans_test_annotations.json")}
    served = {"/eccv_18_all_images_sm.tar.gz": tar_gz_bytes({"eccv_18_all_images_sm/img0.jpg": jpeg(0)}),
              "/eccv_18_annotations.tar.gz": terra_annotations(four)}
    with ArchiveServer() as server:
        server.behaviour.files.update(served)
        sources = {name.lstrip("/"): {"urls": [server.url(name)]} for name in served}
        with pytest.raises(DataError, match="trans_val_annotations.json is missing: eccv_18_annotations.tar.gz holds"):
            download_dataset("terra_incognita", tmp_path, sources=sources, progress=False, say=lambda line: None)
    nothing_half_done(tmp_path, "terra_incognita")


def test_camelyon17_keeps_the_wilds_layout(tmp_path):
    members = {"RELEASE_v1.0.txt": b"v1.0\n",
               "metadata.csv": b",patient,node,x_coord,y_coord,tumor,slide,center,split\n0,004,4,3328,21792,1,0,0,0\n",
               "patches/patient_004_node_4/patch_patient_004_node_4_x_3328_y_21792.png": jpeg(0)}
    with ArchiveServer() as server:
        server.behaviour.files["/blob/"] = tar_gz_bytes(members)
        sources = {"camelyon17_v1.0.tar.gz": {"urls": [server.url("/blob/")]}}
        download_dataset("camelyon17", tmp_path, sources=sources, progress=False, say=lambda line: None)
    root = tmp_path / "camelyon17_v1.0"
    assert (root / "metadata.csv").read_bytes() == members["metadata.csv"]
    assert (root / "patches" / "patient_004_node_4").is_dir() and (root / "RELEASE_v1.0.txt").is_file()


@pytest.mark.parametrize("tar_filter", ["python's data filter", "by hand (Python < 3.11.4)"])
def test_a_tar_member_that_climbs_out_of_the_folder_is_refused(tmp_path, monkeypatch, tar_filter):
    import tarfile as tar_module

    if tar_filter.startswith("by hand"):
        monkeypatch.delattr(tar_module, "data_filter")
    evil = tar_gz_bytes({"metadata.csv": b"x\n", "patches/a.png": jpeg(0), "../../escaped.txt": b"gotcha"})
    with ArchiveServer() as server:
        server.behaviour.files["/blob/"] = evil
        with pytest.raises(DataError, match="cannot be unpacked|would land outside"):
            download_dataset("camelyon17", tmp_path / "root", progress=False, say=lambda line: None,
                             sources={"camelyon17_v1.0.tar.gz": {"urls": [server.url("/blob/")]}})
    assert not list(tmp_path.rglob("escaped.txt"))
    nothing_half_done(tmp_path / "root", "camelyon17_v1.0")
