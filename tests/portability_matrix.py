"""The parity tests under every thread count and CPU instruction set CI checks (issue 49): not a test module
(pytest does not collect it); ``.ci/run`` runs it after the README's test command.

A float sum's last bits depend on the order of its additions, and that order on the thread count and the vector
width (AVX2 vs AVX-512), so a test that compares such results bitwise, or with a bar within the float32 noise,
passes on one machine and fails on the next. This runs ``pytest tests/test_parity_*.py`` in a fresh process per
cell of threads x instruction set and fails when any cell fails:

* 1, 2, 4 threads: ``torch.set_num_threads`` before pytest starts (torch caps ``OMP_NUM_THREADS`` at the cores it
  sees, so on a 2-core machine the variable alone gives 2 threads for 4), and ``OMP_NUM_THREADS`` /
  ``MKL_NUM_THREADS`` for the processes a test starts;
* ``ONEDNN_MAX_CPU_ISA`` = AVX2 or AVX512_CORE: oneDNN's kernels (convolutions). With AVX2 also
  ``ATEN_CPU_CAPABILITY=avx2`` (ATen's own vectorised kernels: reductions, elementwise) and
  ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's BLAS), where the CPU has AVX2. On a CPU without AVX-512 the AVX512_CORE
  cell runs what the CPU has (the variable only caps), so it repeats the default.

Each cell first reports the instruction sets in effect (oneDNN's, from its verbose line, and ATen's).
Run: ``.venv/bin/python tests/portability_matrix.py`` (``--threads 1,4 --isa AVX2`` for fewer cells; ``-- ARGS``
passes pytest arguments, e.g. ``-- tests/test_parity_stablefdg.py``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREADS = (1, 2, 4)
ISAS = ("AVX2", "AVX512_CORE")
PROBE = """
import os
import torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
    torch.nn.functional.conv2d(torch.randn(2, 8, 16, 16), torch.randn(8, 8, 3, 3))
print("aten:" + torch.backends.cpu.get_cpu_capability(), "threads:" + str(torch.get_num_threads()))
"""
#: pytest in a process whose torch runs on OMP_NUM_THREADS threads
PYTEST = """
import os, sys
import torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def cell_environment(threads: int, isa: str, flags: set[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), ONEDNN_MAX_CPU_ISA=isa,
               DNNL_MAX_CPU_ISA=isa)  # oneDNN's older name
    for name in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"):
        env.pop(name, None)
    if isa == "AVX2" and "avx2" in flags:
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    return env


def probe(env: dict[str, str]) -> str:
    """The instruction sets in effect: oneDNN's (its verbose line) and ATen's, and torch's thread count."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    isa = re.search(r"isa:([^,\n]*)", out.stdout + out.stderr)
    threads = re.search(r"nthr:(\d+)", out.stdout + out.stderr)
    rest = (out.stdout.strip().splitlines() or ["?"])[-1]
    return f"onednn:{isa.group(1).strip() if isa else '?'} onednn-threads:{threads.group(1) if threads else '?'} {rest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=",".join(map(str, THREADS)), help="thread counts (default 1,2,4)")
    parser.add_argument("--isa", default=",".join(ISAS), help="oneDNN's ISA caps (default AVX2,AVX512_CORE)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the parity tests)")
    args = parser.parse_args(argv)
    tests = args.pytest_args or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_parity_*.py"))
    flags, failed, start = cpu_flags(), [], time.perf_counter()
    print(f"portability: CPU has {'AVX-512' if 'avx512f' in flags else 'no AVX-512'}, "
          f"{'AVX2' if 'avx2' in flags else 'no AVX2'}; {len(tests)} test files", flush=True)
    for threads in [int(t) for t in args.threads.split(",")]:
        for isa in args.isa.split(","):
            env = cell_environment(threads, isa, flags)
            cell = time.perf_counter()
            run = subprocess.run([sys.executable, "-c", PYTEST, "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
                                 cwd=ROOT, env=env, capture_output=True, text=True)
            lines = run.stdout.strip().splitlines()
            summary = lines[-1] if lines else run.stderr.strip()[-300:]
            print(f"portability: threads={threads} isa={isa} ({probe(env)}): {summary} "
                  f"[{time.perf_counter() - cell:.0f} s]", flush=True)
            if run.returncode != 0:
                failed.append(f"threads={threads} isa={isa}")
                print("\n".join(line for line in lines if line.startswith(("FAILED", "ERROR"))), flush=True)
    print(f"portability: {'FAILED in ' + ', '.join(failed) if failed else 'every cell passed'} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
