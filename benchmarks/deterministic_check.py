"""Does a run repeat bit for bit on this device, with and without ``--deterministic``? And what does it cost?

Each method runs a short fashion4 job (ResNet-18 at 32 px, 3 clients, 2 rounds of 10 steps) twice with
``--deterministic`` and twice without, each in a fresh process (torch's switch is process-wide), and compares the
two final global models tensor by tensor. On the CPU both pairs should be equal (its kernels are deterministic).
On a GPU the plain pair may differ (cuDNN's autotuner, atomics in backward passes); the deterministic pair
should not. The warnings a deterministic run printed name the ops that lack a deterministic kernel.

    python benchmarks/deterministic_check.py --device cuda --out det.json     # on a GPU (benchmarks/gpu_check.sh)
    python benchmarks/deterministic_check.py --device cpu --rounds 1          # CPU: that it works (~2 min)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

NONDETERMINISTIC = "does not have a deterministic implementation"


def run_once(args, method: str, deterministic: bool, out: Path) -> tuple[float, list[str]]:
    """One run in a fresh process; its wall seconds and the ops its deterministic warnings named."""
    command = [sys.executable, "-m", "fedstyle.cli.main", "run", "--dataset", "fashion4", "--target", "sketch",
               "--method", method, "--backbone", "resnet18", "--resolution", "32", "--partition", "per_domain",
               "--clients", "3", "--rounds", str(args.rounds), "--local-steps", "10", "--batch-size", "32",
               "--device", args.device, "--quiet", "--out", str(out)]
    if deterministic:
        command.append("--deterministic")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    ops = sorted({line.split(NONDETERMINISTIC)[0].strip().split()[-1]
                  for line in done.stderr.splitlines() if NONDETERMINISTIC in line})
    return seconds, ops


def same_weights(a: Path, b: Path) -> tuple[bool, int]:
    """Whether the two runs' final global models are equal to the bit; how many tensors differ."""
    wa, wb = (load_file(str(p / "checkpoint.safetensors")) for p in (a, b))
    keys = [k for k in wa if k.startswith("global/")]
    differ = sum(not torch.equal(wa[k], wb[k]) for k in keys)
    return differ == 0, differ


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "mixstyle"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    result = {"device": args.device, "torch": torch.__version__, "rows": rows,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None}
    with tempfile.TemporaryDirectory() as tmp:
        run_once(args, args.methods[0], False, Path(tmp) / "warm-up")  # builds the dataset's cache: not timed
        for method in args.methods:
            for deterministic in (False, True):
                name = f"{method}-{'det' if deterministic else 'plain'}"
                s1, ops = run_once(args, method, deterministic, Path(tmp) / f"{name}-1")
                s2, _ = run_once(args, method, deterministic, Path(tmp) / f"{name}-2")
                same, differ = same_weights(Path(tmp) / f"{name}-1", Path(tmp) / f"{name}-2")
                rows.append({"method": method, "deterministic": deterministic, "repeats_bitwise": same,
                             "tensors_differing": differ, "seconds": [round(s1, 1), round(s2, 1)],
                             "ops_without_deterministic_kernel": ops})
                print(json.dumps(rows[-1]), flush=True)
                if args.out:  # after every row: a caller's time limit may kill this script
                    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
