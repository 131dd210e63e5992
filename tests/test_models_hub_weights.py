"""--pretrained ResNets without --weights: torchvision's file from the torch hub cache, checked by the
hash prefix in its name as torchvision's check_hash does; a missing file gets the command that fetches it."""

from __future__ import annotations

import hashlib

import pytest
import torch

import fedstyle.models.hub_weights as hub_weights
from fedstyle.errors import ConfigError
from fedstyle.models import build_backbone, resnet18
from fedstyle.models.hub_weights import cached_torchvision_weights, hub_checkpoints_dir


def test_the_hub_cache_follows_torch_home_then_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_checkpoints_dir() == tmp_path / "xdg" / "torch" / "hub" / "checkpoints"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    assert hub_checkpoints_dir() == tmp_path / "th" / "hub" / "checkpoints"


def test_a_missing_file_gets_the_one_line_command_that_fetches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as missing:
        build_backbone("resnet18", 224, pretrained=True)
    target = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    message = str(missing.value)
    assert "\n" not in message
    assert (f"`curl -L --create-dirs -o {target} https://download.pytorch.org/models/resnet18-f37072fd.pth`"
            in message)


def test_a_file_whose_hash_does_not_begin_with_its_name_prefix_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    folder = tmp_path / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save(resnet18().state_dict(), folder / "resnet50-0676ba61.pth")  # a file, but not torchvision's
    with pytest.raises(ConfigError, match="not 0676ba61 as its name says .*delete it and fetch it again: curl"):
        build_backbone("resnet50", 224, pretrained=True)


def test_a_file_whose_hash_matches_its_name_is_loaded(tmp_path, monkeypatch):
    """torchvision's real file cannot be made here (its SHA-256 must begin f37072fd), so the table is
    pointed at a file named by its own hash prefix, the way torchvision names its files."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.manual_seed(3)
    state = resnet18().state_dict()
    folder = tmp_path / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    draft = folder / "draft.pth"
    torch.save(state, draft)
    prefix = hashlib.sha256(draft.read_bytes()).hexdigest()[:8]
    named = draft.rename(folder / f"resnet18-{prefix}.pth")
    monkeypatch.setitem(hub_weights.TORCHVISION_FILES, "resnet18", (named.name, "https://example.invalid/x.pth"))
    assert cached_torchvision_weights("resnet18") == named
    backbone = build_backbone("resnet18", 64, pretrained=True)
    assert torch.equal(backbone.layer2[0].conv1.weight, state["layer2.0.conv1.weight"])
    damaged = bytearray(named.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one byte changed: refused
    named.write_bytes(bytes(damaged))
    with pytest.raises(ConfigError, match=f"not {prefix}"):
        build_backbone("resnet18", 64, pretrained=True)


def test_a_pre_0_13_cache_file_is_found_and_checked_against_its_own_prefix(tmp_path, monkeypatch):
    """Older torchvision releases kept resnet18-5c106cde.pth / resnet50-19c8e357.pth; with only such a file there,
    it is the one checked, against 5c106cde (not the current f37072fd), and the fix fetches the current file."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    folder = tmp_path / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    for backbone, old, new in (("resnet18", "5c106cde", "f37072fd"), ("resnet50", "19c8e357", "0676ba61")):
        torch.save({"not": torch.zeros(1)}, folder / f"{backbone}-{old}.pth")  # a small fake under the old name
        with pytest.raises(ConfigError) as refused:
            build_backbone(backbone, 224, pretrained=True)
        message = str(refused.value)
        assert f"{backbone}-{old}.pth: its SHA-256 begins" in message and f"not {old} as its name says" in message
        fetch = f"-o {folder / f'{backbone}-{new}.pth'} https://download.pytorch.org/models/{backbone}-{new}.pth"
        assert fetch in message


def test_a_pre_0_13_file_whose_hash_matches_its_name_is_loaded_and_the_current_name_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    folder = tmp_path / "hub" / "checkpoints"
    folder.mkdir(parents=True)

    def named_by_hash(seed: int) -> tuple:
        torch.manual_seed(seed)
        state = resnet18().state_dict()
        draft = folder / "draft.pth"
        torch.save(state, draft)
        prefix = hashlib.sha256(draft.read_bytes()).hexdigest()[:8]
        return state, draft.rename(folder / f"resnet18-{prefix}.pth")

    old_state, old = named_by_hash(4)
    monkeypatch.setitem(hub_weights.LEGACY_TORCHVISION_FILES, "resnet18", old.name)
    absent = ("resnet18-00000000.pth", "https://example.invalid/x.pth")
    monkeypatch.setitem(hub_weights.TORCHVISION_FILES, "resnet18", absent)
    assert cached_torchvision_weights("resnet18") == old  # the current name is absent: the old file
    assert torch.equal(build_backbone("resnet18", 64, pretrained=True).layer1[0].conv1.weight,
                       old_state["layer1.0.conv1.weight"])
    _, new = named_by_hash(5)
    monkeypatch.setitem(hub_weights.TORCHVISION_FILES, "resnet18", (new.name, "https://example.invalid/x.pth"))
    assert cached_torchvision_weights("resnet18") == new  # both there: the current name first


def test_the_missing_file_message_names_the_old_name_too(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"resnet50-0676ba61\.pth \(or its older name resnet50-19c8e357\.pth\)"):
        build_backbone("resnet50", 224, pretrained=True)
