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
import ctypes.util
import os
import platform

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: the largest value ``mallopt`` takes (an ``int``): blocks below 2 GiB come from the heap; larger ones (a
#: dataset's cache, say) are still mapped, and unmapped when freed
THRESHOLD = 2**31 - 1

#: ``FEDSTYLE_MALLOC=system`` leaves glibc's defaults
ENV = "FEDSTYLE_MALLOC"

_state: dict[str, bool] = {}


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`THRESHOLD` in this process, once.

    True when they are raised (now or by an earlier call); False under ``FEDSTYLE_MALLOC=system``, outside
    glibc, or when ``mallopt`` refuses. Never raises: a slower process is no reason to stop a run."""
    if "tuned" in _state:
        return _state["tuned"]
    mode = os.environ.get(ENV, "").strip().lower()
    if mode == "system" or platform.libc_ver()[0] != "glibc":
        _state["tuned"] = False
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        tuned = bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD))
    except (OSError, AttributeError):
        tuned = False
    _state["tuned"] = tuned
    return tuned
