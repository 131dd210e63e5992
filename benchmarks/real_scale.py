"""fedstyle at real scale (issue 54): 224 px, real dataset sizes, offline.

Measured, each in one run so that ratios compare like with like:

1. **Cache build** (in a child process, so its peak RSS is its own): seconds, images per second,
   disk bytes, peak RSS of the builder and of its worker processes. Rows: fashion4 at 224 px with
   ``--per-class 250`` (10,000 images) and in full (70,000 images, 10.5 GB: only with
   ``--max-cache-gb 12`` or more), and a folder of synthetic JPEGs (``--jpeg-sizes``, N images per
   domain, 4 domains) decoded with 1 and with ``--workers`` processes (the cold decode speed-up).
   Sizes beyond what was built (DomainNet's 586,575) are extrapolated linearly from the largest
   measured row, and marked so.
2. **Training img/s** per method (FedAvg, CCST, StableFDG, PARDON, FedCCRL, gPerXAN, MixStyle by
   default) on fashion4 (or the JPEG folder with ``--data synthetic``), next to the bare
   forward-backward-step rate of the same backbone, batch and threads measured in the same run. Per
   method also: its whole passes of the network per image, rows added inside it or partial passes
   (:class:`PassCounter`), the bare rate of its own network, its time against its whole passes alone, and
   the parts it times itself (``ctx.timed``). A token may carry hyperparameters
   (``stablefdg:oversample_ratio=0``), so a method's mechanism can be timed on and off in one run.
3. **Input pipeline**: cache read (random rows of the memory-mapped uint8 cache), crop, flip and
   normalise, in img/s on one thread (per core).

    python benchmarks/real_scale.py --out bench/real_scale.json --markdown bench/real_scale.md
    python benchmarks/real_scale.py --backbone resnet50 --methods fedavg --skip-build   # the ResNet-50 row
    python benchmarks/real_scale.py --quick --out /tmp/q.json      # < 1 minute: checks it runs

The JSON is rewritten after every row, so a run stopped early keeps what it measured. Timings on a
machine shared with other jobs are not worth reporting (``load_average`` is recorded beside them);
peak RSS and bytes are.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedstyle, not an installed one
from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.data.transforms import BatchTransform  # noqa: E402
from fedstyle.models import build_model  # noqa: E402

DEFAULT_METHODS = "fedavg,ccst,stablefdg,pardon,fedccrl,gperxan,mixstyle"
DOMAINNET_IMAGES = 586_575
#: the round metric (``stylize_seconds``) of a one-time cost paid inside the timed rounds
ONE_TIME_PART = "stylize"


# -- small helpers ------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine() -> dict:
    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


class Report:
    """The figures so far, rewritten to ``path`` (JSON) after every row: a run killed keeps its rows."""

    def __init__(self, path: str | None, args: argparse.Namespace):
        self.path = Path(path) if path else None
        self.data = {"args": vars(args), "machine": machine(), "started": time.time()}

    def add(self, section: str, key: str, value) -> None:
        self.data.setdefault(section, {})[key] = value
        self.data["machine"]["load_average"] = os.getloadavg()
        print(f"{section}/{key}: {json.dumps(value, default=str)}", file=sys.stderr, flush=True)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(self.path.suffix + ".partial")
        partial.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(partial, self.path)


# -- 1. cache builds ----------------------------------------------------------------------------
def write_jpegs(root: Path, per_domain: int, side: int, classes: int = 10, seed: int = 0) -> int:
    """``per_domain`` smooth random JPEGs of ``side`` px in each of 4 domains (PACS-like 227 px by default);
    returns the bytes written."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    written = 0
    for domain in ("d0", "d1", "d2", "d3"):
        for c in range(classes):
            (root / domain / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_domain):
            coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            image = Image.fromarray(coarse).resize((side, side), Image.Resampling.BICUBIC)
            path = root / domain / f"c{i % classes}" / f"{i:07d}.jpg"
            image.save(path, quality=90)
            written += path.stat().st_size
    return written


def child_build(args: argparse.Namespace) -> None:
    """Build one cache entry in this (child) process and print its figures as one JSON line."""
    os.environ["FEDSTYLE_DECODE_WORKERS"] = str(args.workers)
    torch.set_num_threads(1)  # one core per decoding process: 1 worker is the 1-core baseline of the speed-up
    start = time.perf_counter()
    dataset = load_dataset(args.dataset, data_root=args.data_root, resolution=args.resolution,
                           per_class=args.per_class or None, progress=False)
    seconds = time.perf_counter() - start
    images = sum(dataset.size(d) for d in dataset.domains)
    entry = Path(dataset.info["cache_dir"])
    stored = sum(f.stat().st_blocks * 512 for f in entry.glob("*.npy"))
    print(json.dumps({"seconds": seconds, "images": images, "img_per_s": images / seconds, "disk_bytes": stored,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                      "workers": args.workers, "resolution": args.resolution}))


def run_build(dataset: str, data_root: str | None, resolution: int, per_class: int, workers: int, cache: Path,
              timeout: float) -> dict:
    command = [sys.executable, __file__, "--child-build", "--dataset", dataset, "--resolution", str(resolution),
               "--per-class", str(per_class), "--workers", str(workers)]
    if data_root:
        command += ["--data-root", data_root]
    env = {**os.environ, "FEDSTYLE_CACHE": str(cache)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def drop_entries(cache: Path, keep_base: bool = True) -> None:
    """Remove the cache's entries except fashion4's 32 px base (so the next build is cold)."""
    for entry in cache.iterdir() if cache.is_dir() else []:
        meta = entry / "meta.json"
        if keep_base and meta.is_file() and json.loads(meta.read_text())["recipe"].get("resolution") == 32:
            continue
        shutil.rmtree(entry, ignore_errors=True)


def measure_builds(args: argparse.Namespace, report: Report, scratch: Path) -> None:
    cache = scratch / "cache"
    budget = args.max_cache_gb * 1e9
    if args.data == "fashion4":
        # the 32 px base (215 MB) first, apart: every 224 px entry is resized from it
        report.add("cache_build", "fashion4 base 32 px (all 70,000)",
                   run_build("fashion4", args.data_root, 32, 0, args.workers, cache, args.build_timeout))
        for per_class in args.fashion_per_class:
            count = 40 * per_class if per_class else 70_000
            if count * 3 * args.resolution**2 > budget:
                report.add("cache_build", f"fashion4 {count} at {args.resolution} px",
                           {"skipped": f"{count * 3 * args.resolution**2 / 1e9:.1f} GB > --max-cache-gb"})
                continue
            for workers in sorted({1, args.workers}):
                drop_entries(cache)
                report.add("cache_build", f"fashion4 {count} at {args.resolution} px, {workers} worker(s)",
                           run_build("fashion4", args.data_root, args.resolution, per_class, workers, cache,
                                     args.build_timeout))
            drop_entries(cache)
    for per_domain in args.jpeg_sizes:
        count = 4 * per_domain
        if count * 3 * args.resolution**2 > budget:
            report.add("cache_build", f"jpeg {count}", {"skipped": "over --max-cache-gb"})
            continue
        root = scratch / f"jpeg{per_domain}"
        jpeg_bytes = write_jpegs(root, per_domain, args.jpeg_side)
        for workers in sorted({1, args.workers}):
            drop_entries(cache, keep_base=False)
            row = run_build("folder", str(root), args.resolution, 0, workers, cache, args.build_timeout)
            row["jpeg_bytes"] = jpeg_bytes
            report.add("cache_build", f"jpeg {count} ({args.jpeg_side} px) at {args.resolution} px, "
                       f"{workers} worker(s)", row)
        drop_entries(cache, keep_base=False)
        shutil.rmtree(root, ignore_errors=True)
    extrapolate(report, args.resolution)


def extrapolate(report: Report, resolution: int) -> None:
    """DomainNet's size from the largest measured decode row (linear: bytes are exact, time per image is
    assumed constant), marked as extrapolated."""
    rows = [(k, v) for k, v in report.data.get("cache_build", {}).items()
            if "images" in v and k.startswith("jpeg") and f"at {resolution} px" in k]
    if not rows:
        return
    key, largest = max(rows, key=lambda kv: (kv[1]["images"], kv[1]["img_per_s"]))
    report.add("cache_build", f"DomainNet {DOMAINNET_IMAGES:,} at {resolution} px (extrapolated)", {
        "from": key, "disk_bytes": DOMAINNET_IMAGES * 3 * resolution**2,
        "seconds": DOMAINNET_IMAGES / largest["img_per_s"], "extrapolated": True})


# -- 2. training rates ---------------------------------------------------------------------------
def bare_rate(backbone: str, resolution: int, batch: int, device: torch.device, steps: int, warmup: int = 2,
              channels_last: bool = True, autocast: torch.dtype | None = None, num_classes: int = 10,
              model: torch.nn.Module | None = None) -> dict:
    """Images per second of a bare forward-backward-SGD step of ``backbone`` (or of ``model``, a method's own
    network) on a fixed random batch."""
    torch.manual_seed(0)
    if model is None:
        model = build_model(backbone, num_classes, resolution)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model.to(device=device, memory_format=layout).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, resolution, resolution, device=device).contiguous(memory_format=layout)
    y = torch.randint(0, num_classes, (batch,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    for _ in range(min(warmup, steps)):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = time.perf_counter() - start
    return {"img_per_s": steps * batch / seconds, "seconds_per_step": seconds / steps, "steps": steps}


def run_config(args: argparse.Namespace, data_root: str | None):
    from fedstyle.experiments.config import RunConfig

    dataset = "fashion4" if args.data == "fashion4" else "folder"
    target = "sketch" if dataset == "fashion4" else "d3"
    return RunConfig(dataset=dataset, data_root=data_root, resolution=args.resolution, per_class=args.per_class,
                     targets=[target], backbone=args.backbone, batch_size=args.batch_size,
                     local_steps=args.local_steps, rounds=args.warmup_rounds + args.rounds, lr=0.01,
                     lr_schedule="constant", device=args.device, seed=0, eval_every=10**6,
                     selection="last")  # no model selection in a speed run: no validation images needed


class PassCounter:
    """Rows of images entering the network's stem (its first convolution) and its classifier (its last
    ``Linear``), each split by whether autograd records them.

    ``stem_grad / images`` is how many whole forward-backward passes a method takes per training image (FedCCRL:
    the image and its 2 views, 3). Rows that reach the classifier without passing the stem were added inside
    the network (StableFDG's oversampled features: the batch doubles after layer1); rows that pass the stem but
    never reach the classifier are partial passes (StableFDG's style query stops at layer1). Neither kind is a
    whole pass, so neither is priced by :func:`inherent_cost`. Passes of other networks (CCST's and PARDON's VGG
    style encoder) are not counted at all: they are the method's style work.

    The hooks are closures, not bound methods: a model deep-copied during the rounds (``ctx.global_model()``)
    copies its hooks, and a bound method would be copied with its counter, its rows lost.
    """

    def __init__(self, model: torch.nn.Module):
        self.rows = {"stem_grad": 0, "stem_nograd": 0, "head_grad": 0, "head_nograd": 0}
        modules = list(model.modules())
        stem = next((m for m in modules if isinstance(m, torch.nn.Conv2d)), None)
        head = next((m for m in reversed(modules) if isinstance(m, torch.nn.Linear)), None)
        self.handles = [module.register_forward_pre_hook(self._counter(place))
                        for place, module in (("stem", stem), ("head", head)) if module is not None]

    def _counter(self, place: str):
        rows = self.rows

        def count(module, inputs) -> None:
            rows[f"{place}_{'grad' if torch.is_grad_enabled() else 'nograd'}"] += inputs[0].shape[0]

        return count

    def reset(self) -> None:
        for key in self.rows:
            self.rows[key] = 0

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def inherent_cost(exp, counter: PassCounter, images: int, seconds: float, args: argparse.Namespace) -> dict:
    """What the method's whole passes alone cost: its stem rows with gradients at the bare forward-backward
    rate of *its own* network (gPerXAN's assembled norms, MixStyle's layers included), measured now on a copy.
    ``time_vs_passes`` is the rest: partial passes, rows added inside the network, style statistics, sampling,
    augmentation, losses, aggregation."""
    rows = counter.rows
    model_rate = bare_rate(args.backbone, args.resolution, args.batch_size, exp.device, args.bare_steps,
                           model=copy.deepcopy(exp.model), num_classes=exp.dataset.num_classes)["img_per_s"]
    passes_seconds = rows["stem_grad"] / model_rate
    return {"passes_per_image": rows["stem_grad"] / images, "head_rows_per_image": rows["head_grad"] / images,
            "nograd_stem_rows_per_image": rows["stem_nograd"] / images,
            "nograd_head_rows_per_image": rows["head_nograd"] / images,
            "model_img_per_s": model_rate, "passes_seconds": passes_seconds,
            "time_vs_passes": seconds / passes_seconds}


def method_rate(config, token: str, warmup: int, rounds: int, wrap=None, args: argparse.Namespace | None = None,
                ) -> dict:
    """Training images per second of a method: its rounds (local training, aggregation; no evaluation).
    With ``args``, also its model passes per image and their inherent cost (:func:`inherent_cost`)."""
    from fedstyle.experiments.build import build_experiment
    from method_cost import parse_method, round_parts, steps_in_round

    method, hp = parse_method(token)
    exp = build_experiment(config.updated(method=method, hparams=hp), progress=False)
    sim = exp.simulator
    context = wrap if wrap is not None else _nothing
    start = time.perf_counter()
    with context():
        sim.setup()
    setup = time.perf_counter() - start
    counter = PassCounter(exp.model)
    seconds, images, parts = 0.0, 0, {}
    for r in range(warmup + rounds):
        if r == warmup:
            counter.reset()  # the warm-up rounds' passes are not timed, so not counted either
        sync(exp.device)
        start = time.perf_counter()
        with context():
            result = sim.run_round(r)
        sync(exp.device)
        if r >= warmup:
            seconds += time.perf_counter() - start
            images += steps_in_round(sim, r, result.clients) * config.batch_size
            for name, part in round_parts(result, sim).items():
                parts[name] = parts.get(name, 0.0) + part
    counter.close()
    row = {"img_per_s": images / seconds, "images": images, "seconds": seconds, "setup_seconds": setup,
           "device": str(exp.device), "parts": parts}
    if args is not None and images and counter.rows["stem_grad"]:
        try:
            row.update(inherent_cost(exp, counter, images, seconds, args))
        except Exception as err:  # the analysis is optional: the measured rate above must survive it
            row["inherent_error"] = f"{type(err).__name__}: {err}"
            return row
        # CCST's and PARDON's style transfers are made once, when a batch first reads an image (stylize=lazy):
        # a cost of the first epoch, not of every step (stylize=eager moves it to the setup)
        once = parts.get(ONE_TIME_PART, 0.0)
        row.update(one_time_seconds=once, steady_vs_passes=(seconds - once) / row["passes_seconds"])
    return row


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measure_training(args: argparse.Namespace, report: Report, data_root: str | None) -> None:
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    config = run_config(args, data_root)
    load_dataset(config.dataset, data_root=data_root, resolution=args.resolution, per_class=args.per_class,
                 progress=False)  # the cache first, not timed with the first method
    # a process's first steps are slow (oneDNN's primitive cache, the allocator): the first bare reading came out
    # 15-30 % below the one after the methods (2026-11-28, ResNet-18 and -50 at 224 px), so one untimed pass first
    bare_rate(args.backbone, args.resolution, args.batch_size, device, max(1, args.bare_steps // 2))
    bare = bare_rate(args.backbone, args.resolution, args.batch_size, device, args.bare_steps)
    report.add("training", f"bare {args.backbone}", bare)
    for token in args.methods.split(","):
        try:
            row = method_rate(config, token, args.warmup_rounds, args.rounds, args=args)
        except Exception as err:  # one method's failure must not lose the others' rows
            row = {"error": f"{type(err).__name__}: {err}"}
        if "img_per_s" in row:
            row["fraction_of_bare"] = row["img_per_s"] / bare["img_per_s"]
        report.add("training", token, row)
    bare_after = bare_rate(args.backbone, args.resolution, args.batch_size, device, args.bare_steps)
    report.add("training", f"bare {args.backbone} (again, after the methods: drift check)", bare_after)
    fedavg = report.data["training"].get("fedavg", {})
    if "img_per_s" in fedavg:
        for token, row in report.data["training"].items():
            if "img_per_s" in row and not token.startswith("bare"):
                row["time_per_step_vs_fedavg"] = fedavg["img_per_s"] / row["img_per_s"]
        report.save()


# -- 3. input pipeline ---------------------------------------------------------------------------
def pipeline_rate(images: torch.Tensor, batch: int, device: torch.device, seconds: float = 3.0,
                  augment: str = "crop_flip", output_size: int | None = None) -> dict:
    """Images per second of: random rows read from the uint8 cache, moved to ``device``, cropped, flipped and
    normalised by fedstyle's :class:`BatchTransform` (and resized to ``output_size``: ``--input-resolution``),
    on the threads torch has now."""
    transform = BatchTransform((0.5,) * 3, (0.5,) * 3, augment, output_size=output_size)
    generator = torch.Generator().manual_seed(0)
    count, done = len(images), 0
    rows = torch.randint(0, count, (batch,), generator=generator)
    transform(images.index_select(0, rows).to(device), True, generator)  # warm-up
    sync(device)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        rows = torch.randint(0, count, (batch,), generator=generator)
        out = transform(images.index_select(0, rows).to(device, non_blocking=True), True, generator)
        done += batch
    sync(device)
    del out
    elapsed = time.perf_counter() - start
    return {"img_per_s": done / elapsed, "threads": torch.get_num_threads(), "device": str(device)}


def measure_pipeline(args: argparse.Namespace, report: Report, data_root: str | None) -> None:
    dataset = load_dataset("fashion4" if args.data == "fashion4" else "folder", data_root=data_root,
                           resolution=args.resolution, per_class=args.per_class, progress=False)
    images = dataset.images[dataset.domains[0]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report.add("pipeline", "cpu, 1 thread (per core)",
                   pipeline_rate(images, args.batch_size, torch.device("cpu"), args.pipeline_seconds))
    finally:
        torch.set_num_threads(threads)
    if args.data == "fashion4" and args.resolution > 128:  # the DomainNet format: stored at 128, resized on device
        small = load_dataset("fashion4", data_root=data_root, resolution=128, per_class=args.per_class, progress=False)
        torch.set_num_threads(1)
        try:
            report.add("pipeline", f"cpu, 1 thread, stored at 128 px, resized to {args.resolution}",
                       pipeline_rate(small.images[small.domains[0]], args.batch_size, torch.device("cpu"),
                                     args.pipeline_seconds, output_size=args.resolution))
        finally:
            torch.set_num_threads(threads)
    if torch.cuda.is_available() and args.device != "cpu":
        report.add("pipeline", "cuda (read and copy on the CPU, transform on the GPU)",
                   pipeline_rate(images, args.batch_size, torch.device("cuda"), args.pipeline_seconds))


# -- report --------------------------------------------------------------------------------------
def markdown(data: dict) -> str:
    lines = [f"Machine: {data['machine']['cpus']} CPUs, torch {data['machine']['torch']}, "
             f"{data['machine']['cuda'] or 'no GPU'}, load average at the end "
             f"{', '.join(f'{v:.1f}' for v in data['machine']['load_average'])}.", ""]
    if data.get("cache_build"):
        lines += ["| cache build | images | seconds | img/s | disk | peak RSS (builder / a worker) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for key, row in data["cache_build"].items():
            if "disk_bytes" not in row:
                lines.append(f"| {key} | {row.get('skipped') or row.get('error')} | | | | |")
                continue
            rss = (f"{row['peak_rss_mb']:,.0f} / {row['worker_peak_rss_mb']:,.0f} MB" if "peak_rss_mb" in row else "")
            rate = f"{row['img_per_s']:,.0f}" if "img_per_s" in row else "(extrapolated)"
            lines.append(f"| {key} | {row.get('images', DOMAINNET_IMAGES):,} | {row['seconds']:,.1f} | "
                         f"{rate} | {row['disk_bytes'] / 1e9:,.2f} GB | {rss} |")
        lines.append("")
    if data.get("training"):
        lines += ["| training | img/s | of bare | time per step vs FedAvg | whole passes per image | rows at the "
                  "classifier per image | partial rows without gradients per image | its network's bare img/s "
                  "| time vs its whole passes | without one-time stylization | the method's timed parts (s) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for key, row in data["training"].items():
            if "img_per_s" not in row:
                lines.append(f"| {key} | {row.get('error')} |" + " |" * 9)
                continue
            fraction = f"{row['fraction_of_bare']:.0%}" if "fraction_of_bare" in row else ""
            ratio = f"{row['time_per_step_vs_fedavg']:.2f}x" if "time_per_step_vs_fedavg" in row else ""
            passes = f"{row['passes_per_image']:.2f}" if "passes_per_image" in row else ""
            head = f"{row['head_rows_per_image']:.2f}" if "head_rows_per_image" in row else ""
            partial = (f"{row['nograd_stem_rows_per_image'] - row['nograd_head_rows_per_image']:.2f}"
                       if "nograd_stem_rows_per_image" in row else "")
            model = f"{row['model_img_per_s']:,.1f}" if "model_img_per_s" in row else ""
            rest = f"{row['time_vs_passes']:.2f}x" if "time_vs_passes" in row else row.get("inherent_error", "")
            steady = f"{row['steady_vs_passes']:.2f}x" if row.get("one_time_seconds") else ""
            timed = ", ".join(f"{name} {sec:.1f}" for name, sec in sorted(row.get("parts", {}).items(),
                                                                          key=lambda kv: -kv[1]))
            lines.append(f"| {key} | {row['img_per_s']:,.1f} | {fraction} | {ratio} | {passes} | {head} | {partial} "
                         f"| {model} | {rest} | {steady} | {timed} |")
        lines.append("")
    if data.get("pipeline"):
        lines += ["| input pipeline (read, crop, flip, normalise) | img/s |", "|---|---:|"]
        lines += [f"| {key} | {row['img_per_s']:,.0f} |" for key, row in data["pipeline"].items()]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, synthetic data: checks the script (< 1 min)")
    parser.add_argument("--data", choices=("fashion4", "synthetic"), default="fashion4",
                        help="fashion4 (needs the Fashion-MNIST idx files) or a folder of synthetic JPEGs")
    parser.add_argument("--data-root", default=None, help="fashion4's idx files (default: the Debian path)")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--methods", default=DEFAULT_METHODS)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--per-class", type=int, default=30, help="training data: images per class and domain")
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per method")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--bare-steps", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decode processes (cold cache)")
    parser.add_argument("--fashion-per-class", type=int, nargs="*", default=[250, 0],
                        help="fashion4 cache builds: per-class sizes (250: 10,000 images; 0: all 70,000)")
    parser.add_argument("--jpeg-sizes", type=int, nargs="*", default=[2500],
                        help="synthetic JPEG folder builds: images per domain (4 domains)")
    parser.add_argument("--jpeg-side", type=int, default=227, help="side of the synthetic JPEGs (PACS: 227)")
    parser.add_argument("--max-cache-gb", type=float, default=3.0, help="skip builds whose cache is larger")
    parser.add_argument("--build-timeout", type=float, default=3600)
    parser.add_argument("--pipeline-seconds", type=float, default=3.0)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--scratch", default=None, help="folder for the caches and JPEGs (default: a temporary one)")
    parser.add_argument("--out", default=None, help="JSON file (rewritten after every row)")
    parser.add_argument("--markdown", default=None, help="also write the tables here")
    parser.add_argument("--child-build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", default="fashion4", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.data, args.resolution, args.batch_size, args.per_class = "synthetic", 32, 4, 1
        args.backbone = "convnet"  # the check is that every part runs, not the figure
        # one warm-up round, as a real run has: the pass counts must leave it out
        args.local_steps, args.rounds, args.warmup_rounds, args.bare_steps = 1, 1, 1, 2
        args.methods = args.methods if args.methods != DEFAULT_METHODS else "fedavg,mixstyle"
        args.fashion_per_class, args.jpeg_sizes, args.jpeg_side = [], [24], 40
        args.pipeline_seconds, args.workers = 0.5, min(args.workers, 2)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.child_build:
        child_build(args)
        return {}
    report = Report(args.out, args)
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="real_scale-"))
    os.environ["FEDSTYLE_CACHE"] = str(scratch / "cache")  # never the user's cache
    try:
        if not args.skip_build:
            measure_builds(args, report, scratch)
        data_root = args.data_root
        if args.data == "synthetic":
            data_root = str(scratch / "train-jpegs")
            write_jpegs(Path(data_root), 10 * max(1, args.per_class), max(args.resolution, 40))
        if not args.skip_training:
            measure_training(args, report, data_root)
        measure_pipeline(args, report, data_root)
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    report.data["finished"] = time.time()
    report.save()
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(report.data))
    print(markdown(report.data))
    return report.data


if __name__ == "__main__":
    main()
