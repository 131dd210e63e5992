"""The first thing to run on a lent GPU (issue 54): fedstyle at 224 px, one command, at most 8 minutes.

Reports, each measured in this one run:

* the bare forward-backward-SGD rate of ResNet-18 (and one ResNet-50 row) at 224 px, batch 32:
  float32 channels-last, float32 contiguous (the effect of channels-last), bf16 autocast;
* img/s of FedAvg, CCST, StableFDG, PARDON, FedCCRL, gPerXAN and MixStyle on fashion4 at 224 px,
  the fraction of the bare rate, and the GPU's busy share of one profiled round (CUDA kernel time
  over wall time, ``torch.profiler``; the rest is the GPU waiting: launches, Python, the pipeline);
* the input pipeline alone (cache read, copy, crop, flip, normalise on the GPU) in img/s: when it
  is well above the bare rate, the pipeline is not what stalls the GPU; also from a cache stored at
  128 px and resized to 224 on the device (``--input-resolution``, the DomainNet format);
* FedAvg with bf16 autocast and with ``--client-batching on``, as img/s and ratio to plain FedAvg.

It stops itself: a watchdog thread writes the JSON and kills the script's whole process group
(``--deadline``, default 450 s; decode workers included) so a call's time limit never loses the output. The JSON
is rewritten after every row; the Markdown section is written at the end (or at the deadline).

    bash benchmarks/gpu_check.sh                      # on the bare GPU machine (wheels, data, then this)
    python benchmarks/gpu_check.py --out gpu.json --markdown gpu.md
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/g.json   # CPU check that it works (< 60 s)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_scale  # noqa: E402  (benchmarks/real_scale.py: the shared measurements)
from real_scale import DEFAULT_METHODS, bare_rate, method_rate, pipeline_rate, run_config, sync  # noqa: E402

from fedstyle.data import load_dataset  # noqa: E402


class Deadline:
    """A watchdog: at ``seconds`` after start, ``on_expiry`` runs (writes what was measured), then the
    whole process group is killed, this process and every worker it started."""

    def __init__(self, seconds: float, on_expiry):
        self.end = time.monotonic() + seconds
        self.on_expiry = on_expiry
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def start(self) -> "Deadline":
        if os.getpid() != os.getpgrp():
            os.setpgrp()  # our own group: the kill below reaches our children, not the caller's shell
        self.timer.start()
        return self

    def left(self) -> float:
        return self.end - time.monotonic()

    def _expire(self) -> None:
        try:
            self.on_expiry()
        finally:
            print("gpu_check: deadline reached; stopped (figures so far are in the JSON)", file=sys.stderr, flush=True)
            os.killpg(os.getpgrp(), signal.SIGKILL)


def busy_share(run_round, device: torch.device) -> float | None:
    """CUDA kernel time of one call of ``run_round`` over its wall time (None off CUDA)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_round()
        sync(device)
    wall = time.perf_counter() - start
    # self time: each kernel counted once (an op's total would count its kernels again)
    kernels = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6  # microseconds -> seconds
    return min(1.0, kernels / wall)


def method_row(config, token: str, args, bare: float, device: torch.device, wrap=None) -> dict:
    """``real_scale.method_rate`` plus the fraction of the bare rate and the GPU's busy share of one more round."""
    row = method_rate(config, token, args.warmup_rounds, args.rounds, wrap=wrap)
    row["fraction_of_bare"] = row["img_per_s"] / bare
    return row


def profiled_share(config, token: str, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    from fedstyle.experiments.build import build_experiment
    from method_cost import parse_method

    method, hp = parse_method(token)
    sim = build_experiment(config.updated(method=method, hparams=hp), progress=False).simulator
    sim.setup()
    sim.run_round(0)  # warm-up: kernels chosen, memory allocated
    return busy_share(lambda: sim.run_round(1), device)


def markdown(data: dict) -> str:
    env = data.get("environment", {})
    lines = [f"### GPU check: {env.get('device_name', '?')}, torch {env.get('torch', '?')}, "
             f"{data['args']['resolution']} px, batch {data['args']['batch_size']}",
             "", f"Command: `{data.get('command', '')}`; {data.get('status', 'incomplete')}.", ""]
    bare = data.get("bare", {})
    if bare:
        lines += ["| bare forward-backward step | img/s |", "|---|---:|"]
        lines += [f"| {k} | {v['img_per_s']:,.0f} |" if "img_per_s" in v else f"| {k} | {v.get('error')} |"
                  for k, v in bare.items()]
        lines.append("")
    if data.get("pipeline"):
        lines += ["| input pipeline | img/s |", "|---|---:|"]
        lines += [f"| {k} | {v['img_per_s']:,.0f} |" for k, v in data["pipeline"].items()]
        lines.append("")
    if data.get("methods"):
        lines += ["| method | img/s | of bare | GPU busy (one round) | setup s |", "|---|---:|---:|---:|---:|"]
        for key, row in data["methods"].items():
            if "img_per_s" not in row:
                lines.append(f"| {key} | {row.get('error') or row.get('skipped')} | | | |")
                continue
            busy = f"{row['gpu_busy']:.0%}" if row.get("gpu_busy") is not None else "n/a"
            lines.append(f"| {key} | {row['img_per_s']:,.0f} | {row['fraction_of_bare']:.0%} | {busy} | "
                         f"{row['setup_seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and synthetic data: checks the script")
    parser.add_argument("--data", choices=("fashion4", "synthetic"), default="fashion4")
    parser.add_argument("--data-root", default=None, help="the Fashion-MNIST idx files (default: the Debian path)")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--big-backbone", default="resnet50", help="the one extra bare row ('' to skip)")
    parser.add_argument("--methods", default=None, help=f"comma-separated (default {DEFAULT_METHODS}; --quick: "
                        "fedavg,mixstyle)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--per-class", type=int, default=60, help="images per class and domain (fashion4: 2,400)")
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--bare-steps", type=int, default=30)
    parser.add_argument("--pipeline-seconds", type=float, default=3.0)
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds before the script stops itself (default 450; --quick: 100)")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--markdown", default="gpu_check.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.data, args.resolution, args.backbone, args.big_backbone = "synthetic", 32, "convnet", ""
        args.batch_size, args.per_class, args.local_steps, args.rounds, args.warmup_rounds = 4, 1, 1, 1, 0
        args.bare_steps, args.pipeline_seconds = 1, 0.3
        args.methods = args.methods or "fedavg,mixstyle"
    args.methods = args.methods or DEFAULT_METHODS
    if args.deadline is None:
        args.deadline = 100.0 if args.quick else 450.0  # quick: ~20 s on an idle 2-core machine
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    device = torch.device(args.device)
    out, md = Path(args.out), Path(args.markdown) if args.markdown else None
    data: dict = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                  "status": "running", "args": vars(args)}
    lock = threading.Lock()

    def save(final: str | None = None) -> None:
        with lock:
            if final:
                data["status"] = final
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_suffix(out.suffix + ".partial")
            partial.write_text(json.dumps(data, indent=1, default=str))
            os.replace(partial, out)
            if md is not None and final:
                md.write_text(markdown(data))

    def add(section: str, key: str, value) -> None:
        with lock:
            data.setdefault(section, {})[key] = value
        print(f"{section}/{key}: {json.dumps(value, default=str)}", file=sys.stderr, flush=True)
        save()

    scratch = Path(tempfile.mkdtemp(prefix="gpu_check-"))

    def stop() -> None:
        save(f"stopped at the {args.deadline:.0f} s deadline")
        shutil.rmtree(scratch, ignore_errors=True)

    deadline = Deadline(args.deadline, stop).start()
    data["environment"] = {"torch": torch.__version__, "device": str(device), "cpus": os.cpu_count(),
                           "load_average": os.getloadavg(),
                           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           "bf16": device.type == "cuda" and torch.cuda.is_bf16_supported()}
    save()
    os.environ.setdefault("FEDSTYLE_CACHE", str(scratch / "cache"))
    data_root = args.data_root
    if args.data == "synthetic":
        data_root = str(scratch / "jpegs")
        real_scale.write_jpegs(Path(data_root), 10 * args.per_class, max(args.resolution, 40))
    config = run_config(argparse.Namespace(**{**vars(args), "device": str(device)}), data_root).updated(
        clients_per_round=0)

    # 1. data: the run's pick, cold (the 32 px base too, for fashion4), in decode worker processes
    start = time.perf_counter()
    dataset = load_dataset(config.dataset, data_root=data_root, resolution=args.resolution,
                           per_class=args.per_class, progress=False)
    add("data", config.dataset, {"images": sum(dataset.size(d) for d in dataset.domains),
                                 "cold_build_seconds": time.perf_counter() - start})

    # 2. bare rates: the reference every method is a fraction of
    bare = bare_rate(args.backbone, args.resolution, args.batch_size, device, args.bare_steps)
    add("bare", f"{args.backbone} fp32 channels-last", bare)
    add("bare", f"{args.backbone} fp32 contiguous",
        bare_rate(args.backbone, args.resolution, args.batch_size, device, args.bare_steps, channels_last=False))
    if data["environment"]["bf16"] or device.type == "cpu":
        add("bare", f"{args.backbone} bf16 autocast channels-last",
            bare_rate(args.backbone, args.resolution, args.batch_size, device, args.bare_steps,
                      autocast=torch.bfloat16))
    if args.big_backbone:
        add("bare", f"{args.big_backbone} fp32 channels-last",
            bare_rate(args.big_backbone, args.resolution, args.batch_size, device, max(2, args.bare_steps // 3)))

    # 3. the input pipeline alone
    images = dataset.images[dataset.domains[0]]
    add("pipeline", f"{device.type}: read, copy, crop, flip, normalise",
        pipeline_rate(images, args.batch_size, device, args.pipeline_seconds))
    small_side = max(8, args.resolution * 4 // 7)  # 128 at 224: the format docs/scale.md proposes for DomainNet
    small = load_dataset(config.dataset, data_root=data_root, resolution=small_side, per_class=args.per_class,
                         progress=False)
    add("pipeline", f"{device.type}: stored at {small_side} px, resized to {args.resolution} on the device",
        pipeline_rate(small.images[small.domains[0]], args.batch_size, device, args.pipeline_seconds,
                      output_size=args.resolution))

    # 4. methods, then FedAvg's variants; a row that cannot finish before the deadline is skipped
    per_row = None
    tokens = [(t, None, {}) for t in args.methods.split(",")]
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if data["environment"]["bf16"] else None
    if autocast is not None:
        tokens.append(("fedavg + bf16 autocast", autocast, {}))
    tokens.append(("fedavg + client-batching on", None, {"client_batching": "on"}))
    for label, wrap, changes in tokens:
        if per_row is not None and deadline.left() < 2 * per_row + 10:
            add("methods", label, {"skipped": "not enough time before the deadline"})
            continue
        began = time.perf_counter()
        token = label.split(" + ")[0]
        try:
            row = method_row(config.updated(**changes), token, args, bare["img_per_s"], device, wrap)
            try:
                row["gpu_busy"] = profiled_share(config.updated(**changes), token, device) if wrap is None else None
            except Exception as err:  # the profiler's failure must not lose the row's rate
                row["gpu_busy"], row["gpu_busy_error"] = None, f"{type(err).__name__}: {err}"
            if token != label and "fedavg" in data.get("methods", {}):
                row["vs_fedavg"] = row["img_per_s"] / data["methods"]["fedavg"]["img_per_s"]
        except Exception as err:  # one method's failure must not lose the others' rows
            row = {"error": f"{type(err).__name__}: {err}"}
        add("methods", label, row)
        per_row = max(per_row or 0.0, time.perf_counter() - began)
    add("bare", f"{args.backbone} fp32 channels-last (again: drift check)",
        bare_rate(args.backbone, args.resolution, args.batch_size, device, args.bare_steps))
    deadline.timer.cancel()
    shutil.rmtree(scratch, ignore_errors=True)
    save("complete")
    print(markdown(data))
    return data


if __name__ == "__main__":
    main()
