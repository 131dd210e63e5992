"""Keep freed tensor memory in the process: glibc's malloc tuned so a training step reuses its blocks.

glibc serves an allocation above its mmap threshold (32 MiB at most, by default) with a fresh ``mmap`` and gives it
back to the kernel on ``free``. A training step allocates and frees activations of that size many times: the ConvNet
at batch 256 (FedGCA's four views of 64 images) writes 64 MiB per layer. Each one then costs a page fault for every
4 KiB page it touches. On this project's 2-core EPYC a FedGCA round spent 22 of its 59 seconds in the kernel
(docs/results/speed.md, "glibc keeps freed tensor memory"). :func:`keep_freed_memory` raises glibc's mmap and trim
thresholds with ``mallopt``, so such blocks come from the heap and return to it. The same round then takes 35 s, and
the numbers do not change: an allocator enters no arithmetic.

It costs memory: the process keeps its peak heap instead of returning it (the round above: 0.97 GB of peak resident
memory became 1.05 to 1.20 GB). ``FEDSTYLE_MALLOC=system`` keeps glibc's defaults. PyTorch's CPU tuning guide gets
the same effect by preloading jemalloc or tcmalloc; ``mallopt`` needs no extra library and works on a process
already running (a sweep's worker, a Flower site). Outside glibc (macOS, musl) it does nothing.

Called where training starts: the runner's round loop (the simulator's and the Flower ServerApp's) and the Flower
ClientApp.
"""

from __future__ import annotations

import ctypes
import os
import platform
import warnings

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4

#: the largest value ``mallopt`` takes (an ``int``). Blocks below it that the main thread allocates come from the
#: heap; larger ones (a dataset's cache, say) are still mapped, and unmapped when freed. A block another thread
#: allocates above its arena's 64 MiB is mapped whatever the threshold (torch allocates in the calling thread).
THRESHOLD = 2**31 - 1

#: ``FEDSTYLE_MALLOC=system`` leaves glibc's defaults; ``tuned`` or unset tunes (another value: a warning, tuned)
ENV = "FEDSTYLE_MALLOC"
MODES = ("", "tuned", "system")

#: what the first call decided (None: not called yet)
_tuned: bool | None = None


def _mallopt():
    libc = ctypes.CDLL(None)  # the process's own symbols: glibc's malloc, whichever file it came from
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`THRESHOLD` in this process, once.

    A glibc older than about 2.26 refuses an mmap threshold above 32 MiB: there, mmap is turned off instead
    (``M_MMAP_MAX`` = 0), which keeps every block in the heap. True when the process keeps its freed blocks (now
    or by an earlier call); False under ``FEDSTYLE_MALLOC=system``, outside glibc, or when ``mallopt`` refuses.
    Never raises: a slower process is no reason to stop a run."""
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    mode = os.environ.get(ENV, "").strip().lower()
    if mode not in MODES:
        warnings.warn(f"{ENV}={os.environ[ENV]!r} is none of {', '.join(m for m in MODES if m)}: glibc's malloc is "
                      f"tuned; set {ENV}=system to keep its defaults", stacklevel=2)
    if mode == "system" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = _mallopt()
        mapped_kept = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) or bool(mallopt(M_MMAP_MAX, 0))
        trimmed_kept = bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
    except (OSError, AttributeError, ctypes.ArgumentError):
        return False
    _tuned = mapped_kept and trimmed_kept
    return _tuned
