"""Device names -> torch devices, one rule for the runner, the style backends and the tools.

It sits at the package's bottom (torch and fedstyle.errors only) so every subpackage can import it.
"""

from __future__ import annotations

import torch

from fedstyle.errors import ConfigError


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto`` -> CUDA, else MPS, else CPU; a name is checked (CUDA asked for but absent is an error).

    A ``torch.device`` is returned unchanged.
    """
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name!r} is not a device; use cpu, cuda, cuda:N, mps or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} asked for CUDA but this torch sees no GPU; use --device cpu or auto")
    return device
