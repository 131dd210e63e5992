"""torchvision's ImageNet ResNet files found in the torch hub cache, checked as torchvision checks them.

``torch.hub.load_state_dict_from_url`` (what ``torchvision.models.resnet18(weights=...)`` calls)
keeps a downloaded file as ``<hub dir>/checkpoints/<file name>``; the hub dir is
``torch.hub.get_dir()``: ``$TORCH_HOME/hub``, with ``TORCH_HOME`` defaulting to
``$XDG_CACHE_HOME/torch`` and that to ``~/.cache/torch``. A file that is there is used by
``--pretrained`` without ``--weights``; fedstyle downloads it only when asked (``--download``:
:func:`download_torchvision_weights`), otherwise the error names the one ``curl`` line that fetches it.

The check is torchvision's ``check_hash``: the hex digits after the last ``-`` of the file name
(``resnet18-f37072fd.pth``: ``f37072fd``, ``torch.hub.HASH_REGEX``) must begin the file's SHA-256.
Eight hex digits tell a damaged or foreign file from the real one; they are not a full checksum.

Older torchvision releases fetched the ImageNet weights under older names (``resnet18-5c106cde.pth``,
``resnet50-19c8e357.pth``, in their ``model_urls``); the files were later re-published under new
names and hashes. A cache filled by such a torchvision holds only the old file, so it is accepted
too, checked against the prefix in its own name. The current name is looked for first.
"""

from __future__ import annotations

import hashlib
import shlex
import urllib.error
from pathlib import Path

import torch.hub

from fedstyle.errors import ConfigError
from fedstyle.models.resnet import RESNET18_URL, RESNET50_URL

#: backbone -> (torchvision's file name, its official URL: the IMAGENET1K_V1 weights)
TORCHVISION_FILES = {
    "resnet18": (RESNET18_URL.rpartition("/")[2], RESNET18_URL),
    "resnet50": (RESNET50_URL.rpartition("/")[2], RESNET50_URL),
}
#: backbone -> the file name older torchvision releases gave its ImageNet weights (their resnet.py model_urls)
LEGACY_TORCHVISION_FILES = {
    "resnet18": "resnet18-5c106cde.pth",
    "resnet50": "resnet50-19c8e357.pth",
}


def hub_checkpoints_dir() -> Path:
    """Where torch.hub keeps downloaded weights (``$TORCH_HOME/hub/checkpoints``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def fetch_command(filename: str, url: str) -> str:
    """The one line that puts torchvision's file where torch.hub (and fedstyle) look for it."""
    return f"curl -L --create-dirs -o {shlex.quote(str(hub_checkpoints_dir() / filename))} {url}"


def check_hash_prefix(path: Path, url: str, fetched_as: str | None = None) -> None:
    """Refuse ``path`` unless its SHA-256 begins with the hash prefix in its name (torchvision's check).

    ``fetched_as``: the name under which ``url`` is kept (default ``path.name``); a bad file of an older name is
    replaced by the current one, never by the current bytes under the old name (which would fail again)."""
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
                          f"it again: {fetch_command(fetched_as or path.name, url)}")


def cached_torchvision_weights(backbone: str) -> Path:
    """torchvision's ImageNet file for ``backbone`` from the torch hub cache, its hash prefix checked;
    a ConfigError with the command that fetches it when it is not there."""
    filename, url = TORCHVISION_FILES[backbone]
    path = hub_checkpoints_dir() / filename
    legacy = LEGACY_TORCHVISION_FILES.get(backbone)
    if not path.is_file() and legacy and (hub_checkpoints_dir() / legacy).is_file():
        path = hub_checkpoints_dir() / legacy  # a cache from an older torchvision, checked against its own hash
    if not path.is_file():
        older = f" (or its older name {legacy})" if legacy else ""
        raise ConfigError(f"--pretrained {backbone} loads torchvision's {filename}{older} from the torch hub cache, "
                          f"and {path} is not there; add --download to fetch it, or fetch it with "
                          f"`{fetch_command(filename, url)}` (or give --weights FILE; TORCH_HOME moves the cache)")
    check_hash_prefix(path, url, fetched_as=filename)
    return path


def download_torchvision_weights(backbone: str, progress: bool = True) -> Path:
    """Fetch torchvision's ImageNet file for ``backbone`` from its official URL into the torch hub cache (a file
    already there is checked and kept), the hash prefix in its name checked before it lands: a file that fails
    the check, or a transfer that breaks, leaves nothing behind.

    torch's own ``torch.hub.download_url_to_file`` does the transfer: it is what torchvision calls, writes a
    temporary file beside the target, checks the SHA-256 prefix and only then renames the file into place.
    """
    if backbone not in TORCHVISION_FILES:
        raise ConfigError(f"--download fetches torchvision's ImageNet weights of {', '.join(TORCHVISION_FILES)}; "
                          f"backbone {backbone!r} needs none (drop --download)")
    filename, url = TORCHVISION_FILES[backbone]
    path = hub_checkpoints_dir() / filename
    if path.is_file():
        check_hash_prefix(path, url)
        return path
    match = torch.hub.HASH_REGEX.search(filename)
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(url, str(path), hash_prefix=match.group(1) if match else None,
                                       progress=progress)
    except (RuntimeError, OSError, urllib.error.URLError) as err:
        for folder in made:  # the folders this call created, if the failure left them empty
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        reason = getattr(err, "reason", None) or str(err).splitlines()[0][:160]
        raise ConfigError(f"cannot fetch {url} into {path} ({reason}); nothing was kept; fetch it by hand with "
                          f"`{fetch_command(filename, url)}`") from None
    return path

