"""Warm sites against Flower's own per-message ClientApp processes: one local deployment each way.

``fedstyle deploy`` runs each site as fedstyle/runtimes/flower/warm_site.py, which forks every ClientApp task
from a process that imported torch and fedstyle once; ``FEDSTYLE_COLD_SITES=1`` runs plain ``flower-supernode``
sites, whose SuperExec starts a fresh ``flwr-clientapp`` per message (Flower's default). This runs the same
small deployment both ways and prints the wall time and the CPU seconds the whole machine spent (from
/proc/stat: the SuperLink, the sites, every ClientApp and the ServerApp included, so run it on an idle machine)
and the messages the sites answered. The two runs' metrics are compared too (they must be the same).

    python benchmarks/warm_site.py [--sites 3] [--rounds 3] [--local-steps 2] [--repeats 1] [--out DIR]
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


def busy_cpu_seconds() -> float:
    """CPU seconds the machine spent busy since boot (all cores; /proc/stat's user..steal minus idle/iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def deploy(out: Path, args, cold: bool) -> tuple[float, float, int, list]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("FEDSTYLE_COLD_SITES", None)
    if cold:
        env["FEDSTYLE_COLD_SITES"] = "1"
    cmd = [sys.executable, "-c", "import sys; from fedstyle.cli.main import main; sys.exit(main(sys.argv[1:]))", "deploy", "--sites", str(args.sites), "--insecure", "--method", "fedavg",
           "--dataset", "digits4", "--target", "mnist", "--partition", "per_domain", "--clients", str(args.sites),
           "--rounds", str(args.rounds), "--local-steps", str(args.local_steps), "--quiet", "--out", str(out)]
    cpu, wall = busy_cpu_seconds(), time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    wall, cpu = time.perf_counter() - wall, busy_cpu_seconds() - cpu
    messages = sum(p.read_text(errors="replace").count("Receiving:") for p in (out / "flower").glob("site-*.log"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    accuracies = [(r.get("round"), r.get("source_val_acc"), r.get("target_acc")) for r in rows if "train_loss" in r]
    return wall, cpu, messages, accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="warm-site-"))
    results: dict[str, list] = {"cold": [], "warm": []}
    for repeat in range(args.repeats):
        for kind in ("cold", "warm"):
            out = root / f"{kind}-{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            results[kind].append(deploy(out, args, cold=kind == "cold"))
            wall, cpu, messages, _ = results[kind][-1]
            print(f"{kind:4s} sites  wall {wall:6.1f} s  machine CPU {cpu:6.1f} s  messages {messages:3d}  "
                  f"CPU per message {cpu / max(1, messages):5.2f} s", flush=True)
    same = all(c[3] == w[3] for c, w in zip(results["cold"], results["warm"]))
    print(f"metrics the same cold and warm: {same}")
    if args.out is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
