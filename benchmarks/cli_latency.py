"""How long the command line takes to answer without doing work (issue 53): the median wall time of five
fresh processes for each command, beside a bare ``python -c pass`` and ``import torch`` for scale.

    python benchmarks/cli_latency.py [--repeat 5]

Each command runs as ``python -m fedstyle.cli.main ARGS`` with this checkout first on PYTHONPATH; the figures go
to docs/cli.md with the machine they were measured on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "fedstyle run --method typo": ["-m", "fedstyle.cli.main", "run", "--method", "typo", "--out", "never"],
    "fedstyle methods": ["-m", "fedstyle.cli.main", "methods"],
    "fedstyle --version": ["-m", "fedstyle.cli.main", "--version"],
    "fedstyle data list": ["-m", "fedstyle.cli.main", "data", "list"],
    "fedstyle reproduce --list": ["-m", "fedstyle.cli.main", "reproduce", "--list"],
    "fedstyle run --round 1 (refused)": ["-m", "fedstyle.cli.main", "run", "--round", "1"],
    "python -c pass (interpreter start)": ["-c", "pass"],
    "python -c 'import torch' (for scale)": ["-c", "import torch"],
}


def wall_seconds(args: list[str], repeat: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        times.append(time.perf_counter() - start)
    return times


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per command (default 5)")
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
          f"{load}; median of {args.repeat} runs (min-max)")
    for name, argv in COMMANDS.items():
        times = wall_seconds(argv, args.repeat)
        print(f"  {name:<40} {statistics.median(times):6.2f} s  ({min(times):.2f}-{max(times):.2f})")


if __name__ == "__main__":
    main()
