"""Device names -> torch devices, one rule for the runner, the style backends and the tools.

It sits at the package's bottom (torch and fedstyle.errors only) so every subpackage can import it.
"""

from __future__ import annotations

import os
import warnings
from typing import Iterable

import torch

from fedstyle.errors import ConfigError


def parse_device_name(name: str) -> torch.device | None:
    """The device ``name`` names (None for ``auto``), checked as a name only: whether this machine has it is
    :func:`resolve_device`'s question. A plan made here for a GPU machine (a sweep's ``--dry-run --device
    cuda``) is a valid plan; ``banana`` or ``xpu`` is refused before any run is planned."""
    if name == "auto":
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {name!r} is not a device; use cpu, cuda, cuda:N, mps or auto") from None
    if device.type not in ("cpu", "cuda", "mps"):  # xpu, meta, ...: torch knows them; fedstyle's runs are not for them
        raise ConfigError(f"--device {name}: fedstyle runs on cpu, cuda, cuda:N or mps (auto picks one)")
    return device


def require_devices(names: Iterable[str]) -> None:
    """Each device a batch of runs names is on this machine (:func:`resolve_device`): a sweep refuses a missing GPU
    once, before any run, instead of failing every run the same way."""
    for name in sorted(set(names)):
        resolve_device(name)


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto`` -> CUDA, else MPS, else CPU; a name is checked (CUDA asked for but absent is an error).

    A ``torch.device`` is returned unchanged.
    """
    if isinstance(name, torch.device):
        return name
    device = parse_device_name(name)
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name} asked for CUDA but this torch sees no GPU; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                              f"cuda:{torch.cuda.device_count() - 1}")
    elif device.type == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise ConfigError(f"--device {name} asked for Apple's MPS, which this machine or torch lacks; use "
                              "--device cpu or auto")
    return device


#: images per gradient-free forward pass (evaluation) on the CPU. Small batches keep a pass's maps in the
#: caches: 512 images' first ConvNet maps (64 x 32 x 32 floats) are 134 MB, past glibc's 32 MB mmap threshold
#: too (fresh pages that fault on every touch). Measured (``python benchmarks/eval_batch.py``, eval mode, the
#: 2-core CPU, ms per image at batch 32 / the largest): ConvNet 32 px 0.54 / 1.13 (512) on one thread,
#: 0.44 / 0.74 on two; EfficientNet-Lite0 64 px 3.1 / 7.2 (256) and 2.0 / 5.4; ResNet-18 64 px 6.1 / 7.7 and
#: 3.4 / 3.4. The logits were the same to the bit at every batch size.
CPU_INFERENCE_BATCH = 32


def inference_batch(device: str | torch.device, accelerator_batch: int) -> int:
    """Images per gradient-free forward pass on ``device``: ``accelerator_batch`` on a GPU (or MPS), where a
    small model's pass is launch-bound; at most :data:`CPU_INFERENCE_BATCH` on the CPU, where it is
    compute- and cache-bound from a few dozen images on."""
    if torch.device(device).type == "cpu":
        return min(accelerator_batch, CPU_INFERENCE_BATCH)
    return accelerator_batch


#: cuBLAS's workspace setting that makes its matrix products repeat bit for bit (CUDA >= 10.2; NVIDIA's cuBLAS
#: documentation, "Results reproducibility"); read when cuBLAS starts, so it is set before the first product
CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


#: torch's switches as they were before a ``--deterministic`` run turned them on in this process, and whether it
#: set CUBLAS_WORKSPACE_CONFIG; None: not on
_BEFORE_DETERMINISTIC: tuple[bool, bool, bool, bool, bool] | None = None


def set_deterministic_kernels(enabled: bool) -> None:
    """Make this process's torch pick deterministic kernels, or not (``--deterministic``), so that a GPU run repeats
    bit for bit on the same machine, at some cost in speed (not yet checked on a GPU:
    ``benchmarks/deterministic_check.py``).

    On: ``torch.use_deterministic_algorithms(True, warn_only=True)``, so an op without a deterministic kernel warns
    (naming itself) instead of stopping the run; cuDNN's benchmark autotuner off (it may pick another convolution
    algorithm per run); ``CUBLAS_WORKSPACE_CONFIG`` set unless it is (cuBLAS reads it when it starts: a warning says
    so if CUDA already started in this process; a caller's own strict mode stays strict). The CPU's kernels are
    deterministic already: a CPU run's results are the same either way (tested). Off: the switches this function
    turned on, and the variable it set, go back to what they were, so a later run of a process that runs several
    (a sweep's worker, a Flower site) does not inherit them, and a caller's own setting is left alone. Every
    process of a run (the simulator, each Flower site) sets it itself, from the run's config (``build_experiment``).
    """
    global _BEFORE_DETERMINISTIC
    if not enabled:
        if _BEFORE_DETERMINISTIC is not None:
            algorithms, warn_only, cudnn_deterministic, benchmark, set_cublas = _BEFORE_DETERMINISTIC
            torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_deterministic, benchmark
            if set_cublas:  # child processes of a later run (flower-sim's Ray workers) inherit the environment
                os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
            _BEFORE_DETERMINISTIC = None
        return
    set_cublas = "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    if _BEFORE_DETERMINISTIC is None:
        _BEFORE_DETERMINISTIC = (torch.are_deterministic_algorithms_enabled(),
                                 torch.is_deterministic_algorithms_warn_only_enabled(),
                                 torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, set_cublas)
    if set_cublas:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            warnings.warn("--deterministic: CUDA started in this process before CUBLAS_WORKSPACE_CONFIG was set, so "
                          "cuBLAS may not repeat bit for bit; set CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting "
                          "Python", stacklevel=2)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC_WORKSPACE
    # a caller's own strict mode (errors, not warnings) stays strict
    strict = torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
