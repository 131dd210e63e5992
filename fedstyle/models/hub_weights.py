"""torchvision's ImageNet ResNet files found in the torch hub cache, checked as torchvision checks them.

``torch.hub.load_state_dict_from_url`` (what ``torchvision.models.resnet18(weights=...)`` calls)
keeps a downloaded file as ``<hub dir>/checkpoints/<file name>``; the hub dir is
``torch.hub.get_dir()``: ``$TORCH_HOME/hub``, with ``TORCH_HOME`` defaulting to
``$XDG_CACHE_HOME/torch`` and that to ``~/.cache/torch``. A file that is there is used by
``--pretrained`` without ``--weights``; fedstyle never downloads it itself.

The check is torchvision's ``check_hash``: the hex digits after the last ``-`` of the file name
(``resnet18-f37072fd.pth``: ``f37072fd``, ``torch.hub.HASH_REGEX``) must begin the file's SHA-256.
Eight hex digits tell a damaged or foreign file from the real one; they are not a full checksum.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import torch.hub

from fedstyle.errors import ConfigError
from fedstyle.io import not_a_readable_file
from fedstyle.models.resnet import RESNET18_URL, RESNET50_URL

#: backbone -> (torchvision's file name, its official URL: the IMAGENET1K_V1 weights)
TORCHVISION_FILES = {
    "resnet18": (RESNET18_URL.rpartition("/")[2], RESNET18_URL),
    "resnet50": (RESNET50_URL.rpartition("/")[2], RESNET50_URL),
}


def hub_checkpoints_dir() -> Path:
    """Where torch.hub keeps downloaded weights (``$TORCH_HOME/hub/checkpoints``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def fetch_command(filename: str, url: str) -> str:
    """The one line that puts torchvision's file where torch.hub (and fedstyle) look for it."""
    return f"curl -L --create-dirs -o {shlex.quote(str(hub_checkpoints_dir() / filename))} {url}"


def check_hash_prefix(path: Path, url: str) -> None:
    """Refuse ``path`` unless its SHA-256 begins with the hash prefix in its name (torchvision's check)."""
    match = torch.hub.HASH_REGEX.search(path.name)
    if match is None or not match.group(1):
        return
    prefix = match.group(1)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if not digest.hexdigest().startswith(prefix):
        raise ConfigError(f"{path}: its SHA-256 begins {digest.hexdigest()[:len(prefix)]}, not {prefix} as its name "
                          f"says (torchvision's check): the file is damaged or not torchvision's; delete it and fetch "
                          f"it again: {fetch_command(path.name, url)}")


def cached_torchvision_weights(backbone: str) -> Path:
    """torchvision's ImageNet file for ``backbone`` from the torch hub cache, its hash prefix checked;
    a ConfigError with the command that fetches it when it is not there."""
    filename, url = TORCHVISION_FILES[backbone]
    path = hub_checkpoints_dir() / filename
    problem = not_a_readable_file(path)
    if problem:
        where = "is not there" if problem == "does not exist" else problem
        raise ConfigError(f"--pretrained {backbone} loads torchvision's {filename} from the torch hub cache, and "
                          f"{path} {where}; fetch it with `{fetch_command(filename, url)}` (or give "
                          "--weights FILE; TORCH_HOME moves the cache)")
    check_hash_prefix(path, url)
    return path
