"""``--pretrained --download``: torchvision's ResNet file fetched into the torch hub cache, its hash prefix
checked before it lands; a file that fails the check leaves nothing behind. Served from 127.0.0.1 only."""

from __future__ import annotations

import hashlib

import pytest

import fedstyle.models.hub_weights as hub_weights
from archive_server import ArchiveServer
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.models.hub_weights import cached_torchvision_weights, download_torchvision_weights

BODY = b"not really a ResNet, but bytes with a known SHA-256" * 100
PREFIX = hashlib.sha256(BODY).hexdigest()[:8]


@pytest.fixture
def server():
    with ArchiveServer() as running:
        yield running


def point_at(server, monkeypatch, name: str, body: bytes = BODY) -> str:
    server.behaviour.files[f"/{name}"] = body
    url = server.url(f"/{name}")
    monkeypatch.setitem(hub_weights.TORCHVISION_FILES, "resnet18", (name, url))
    return url


def test_the_official_url_is_torchvisions():
    filename, url = hub_weights.TORCHVISION_FILES["resnet18"]
    assert url == "https://download.pytorch.org/models/resnet18-f37072fd.pth" and filename == "resnet18-f37072fd.pth"


def test_download_lands_in_the_hub_cache_with_its_hash_checked(server, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    point_at(server, monkeypatch, f"resnet18-{PREFIX}.pth")
    path = download_torchvision_weights("resnet18", progress=False)
    assert path == tmp_path / "torch" / "hub" / "checkpoints" / f"resnet18-{PREFIX}.pth"
    assert path.read_bytes() == BODY and cached_torchvision_weights("resnet18") == path
    assert download_torchvision_weights("resnet18", progress=False) == path  # there already: not fetched again
    assert len(server.behaviour.log) == 1


def test_a_wrong_hash_is_refused_and_nothing_is_left_behind(server, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    point_at(server, monkeypatch, "resnet18-00000000.pth")  # the name promises a hash the bytes do not have
    with pytest.raises(ConfigError, match="invalid hash value.*nothing was kept.*curl -L"):
        download_torchvision_weights("resnet18", progress=False)
    assert not (tmp_path / "torch").exists()  # no file, no partial file, no folder made for it


def test_an_unreachable_file_is_refused_with_the_curl_line(server, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    (tmp_path / "torch").mkdir()
    monkeypatch.setitem(hub_weights.TORCHVISION_FILES, "resnet18", (f"resnet18-{PREFIX}.pth", server.url("/gone")))
    with pytest.raises(ConfigError, match="cannot fetch .*/gone .*Not Found.*curl -L"):
        download_torchvision_weights("resnet18", progress=False)
    assert list((tmp_path / "torch").iterdir()) == []


def test_run_download_fetches_before_training_and_without_it_names_the_flag(server, tiny_root, tmp_path,
                                                                            monkeypatch, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    point_at(server, monkeypatch, "resnet18-00000000.pth")
    flags = ["run", "--dataset", "folder", "--data-root", str(tiny_root), "--resolution", "24", "--target", "grey",
             "--backbone", "resnet18", "--pretrained", "--rounds", "1", "--device", "cpu", "--quiet"]
    assert main([*flags, "--out", str(tmp_path / "a")]) == 2  # without --download: the curl line, and the flag
    error = capsys.readouterr().err
    assert "add --download to fetch it" in error and "curl -L --create-dirs" in error
    assert main([*flags, "--download", "--out", str(tmp_path / "b")]) == 2  # the fake file fails its hash check
    assert "invalid hash value" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "torch").exists()
    assert len(server.behaviour.log) == 1  # fetched once, by --download


def test_download_without_pretrained_is_refused(tiny_root, tmp_path, capsys):
    code = main(["run", "--dataset", "folder", "--data-root", str(tiny_root), "--target", "grey", "--download",
                 "--out", str(tmp_path / "run")])
    assert code == 2 and "add --pretrained, or drop --download" in capsys.readouterr().err
