"""glibc's malloc, tuned (fedstyle.allocator) or left alone: one command's wall, CPU and kernel seconds, page
faults and peak memory in each mode, and whether the two summaries agree.

Each case is a `fedstyle run` of one round in a fresh process, once with ``FEDSTYLE_MALLOC=system`` (glibc's
defaults) and once without (the thresholds raised), alternating for ``--repeats`` pairs. The summaries of a
pair are compared field by field, leaving out the timings and the environment record.

    OMP_NUM_THREADS=1 python benchmarks/allocator.py [--repeats 2] [--only fedgca-single-source] [--scratch DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: name -> the `fedstyle run` flags of a leaderboard row's run, one round (benchmarks/leaderboard/*.toml)
CASES = {
    "fedavg-multi-source": ["--method", "fedavg", "--dataset", "digits4", "--target", "mnist"],
    "fedgca-single-source": ["--method", "fedgca", "--dataset", "digits4", "--protocol", "single_source",
                             "--source", "mnist", "--partition", "label_dirichlet", "--alpha", "0.3",
                             "--clients", "10"],
}
COMMON = ["--rounds", "1", "--local-steps", "15", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9",
          "--backbone", "convnet", "--selection", "source_val", "--eval-every", "1", "--target-eval", "end",
          "--device", "cpu", "--quiet"]
#: summary.json fields that differ between any two runs (time, where it ran)
VOLATILE = ("seconds", "environment")


def run_once(case: str, system: bool, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FEDSTYLE_MALLOC" and not k.startswith("MALLOC_")}
    if system:
        env["FEDSTYLE_MALLOC"] = "system"
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "fedstyle.cli.main", "run", *CASES[case], *COMMON,
                              "--out", str(out)], env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own counters (RUSAGE_CHILDREN's peak is all children's)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if child.returncode:
        raise SystemExit(f"{case}: fedstyle run exited with {child.returncode}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall": wall, "user": usage.ru_utime, "sys": usage.ru_stime, "faults": usage.ru_minflt,
            "maxrss_gb": usage.ru_maxrss / 2**20,
            "summary": {k: v for k, v in summary.items() if k not in VOLATILE}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs per case (default 2)")
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="these cases (default: all)")
    parser.add_argument("--scratch", type=Path, help="where the runs go (default: a temporary folder, removed)")
    args = parser.parse_args()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="fedstyle-allocator-"))
    print("| case | malloc | wall s | user s | sys s | minor faults | peak RSS GB | summaries equal |")
    print("|:--|:--|--:|--:|--:|--:|--:|:--|")
    try:
        for case in args.only or sorted(CASES):
            for repeat in range(args.repeats):
                pair = {}
                for system in (True, False):
                    mode = "glibc defaults" if system else "tuned"
                    out = scratch / f"{case}-{repeat}-{'system' if system else 'tuned'}"
                    shutil.rmtree(out, ignore_errors=True)
                    pair[mode] = run_once(case, system, out)
                same = pair["glibc defaults"]["summary"] == pair["tuned"]["summary"]
                for mode, m in pair.items():
                    print(f"| {case} | {mode} | {m['wall']:.1f} | {m['user']:.1f} | {m['sys']:.1f} | "
                          f"{m['faults']:,} | {m['maxrss_gb']:.2f} | {'yes' if same else 'NO'} |", flush=True)
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
