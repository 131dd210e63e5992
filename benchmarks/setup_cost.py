"""The one-time style setup of CCST and PARDON against a FedAvg run of the same configuration (issue 27).

Three parts, each printed as a Markdown table (``--part all`` runs them in this order):

* ``runs`` — the issue's yardstick, in one invocation: ``fedstyle run`` of FedAvg, CCST and PARDON
  with their defaults on fashion4, target art, 3 domain clients, 8 rounds x 10 local steps
  (``--rounds``, ``--local-steps``), one after the other as subprocesses with a fresh style cache
  (cold: no client style, no stylized image), then each again on the cache its cold run filled
  (warm: styles loaded, images made by the first run's batches reused). Per run: wall time of the command
  (data loading, setup, training, evaluation), its ratio to FedAvg's, the setup's seconds and share
  of the run, and the stylization done by training batches (``stylize=lazy``) from metrics.jsonl.
  ``--eager`` adds CCST and PARDON with ``stylize=eager`` (every image made at setup; long).
* ``backends`` — the setup alone, in process, per method (CCST, PARDON), backend (lite, fft, adain)
  and client count (3 domain clients; 100 clients of PARDON's lambda = 0.1 partition): setup
  seconds with the default lazy stylization, the style computation's images/s, and the transfer's
  images/s measured by making up to ``--transfer-sample`` images of client 0's generated set.
  ``eager setup (est.)`` = setup + generated images / transfer rate (what ``stylize=eager`` costs,
  estimated from the measured rate, not run). The ``adain`` backend runs with randomly initialised
  VGG-19 / decoder weights written to a temporary folder: its timing is that of the real network
  (same layers, same sizes), its images are meaningless — the public weights cannot be downloaded here.
* ``sample`` — how far the overall style (lite backend, AdaIN statistics) of a class-stratified
  sample of ``style_images`` images lies from the style over every image of a fashion4 domain:
  relative L2 error of [mu, sigma] at 256, 512, 1024 and 2048 images, mean over 3 seeds, beside the
  distance between two domains' styles for scale.

    python benchmarks/setup_cost.py --part all --out docs/results/figures/setup_cost.json
    python benchmarks/setup_cost.py --part runs --eager
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedstyle, not an installed one
from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.data.cache import cache_dir  # noqa: E402
from fedstyle.data.lazy import LazyImages  # noqa: E402
from fedstyle.experiments.build import build_experiment  # noqa: E402
from fedstyle.experiments.config import RunConfig  # noqa: E402
from fedstyle.style.transfer.augment import make_backend, style_sample  # noqa: E402
from fedstyle.style.transfer.stylize import STYLE_CACHE  # noqa: E402

METHODS = ("ccst", "pardon")
BACKENDS = ("lite", "fft", "adain")
SAMPLE_SIZES = (256, 512, 1024, 2048)


# -- part 1: whole runs ---------------------------------------------------------------------------------
def timed_run(method: str, args, out: Path, cache: Path, hp: dict[str, str]) -> dict:
    command = [str(Path(sys.executable).with_name("fedstyle")), "run", "--quiet", "--method", method, "--dataset",
               args.dataset, "--target", args.target, "--rounds", str(args.rounds), "--local-steps",
               str(args.local_steps), "--device", args.device, "--out", str(out)]
    for name, value in hp.items():
        command += ["--hp", f"{name}={value}"]
    env = dict(os.environ, FEDSTYLE_CACHE=str(cache))
    shutil.rmtree(out, ignore_errors=True)  # a new run each time (a finished one would be refused)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    made = [r.get("train_metrics", {}) for r in records if "round" in r and "event" not in r]
    setup = summary.get("setup", {})
    return {"wall_s": wall, "run_s": summary["seconds"], "setup_s": setup.get("setup_seconds", 0.0),
            "style_s": setup.get("style_seconds", 0.0), "style_images": setup.get("style_images", 0.0),
            "augmented_images": setup.get("augmented_images", 0.0), "cached_images": setup.get("cached_images", 0.0),
            "setup_stylized_images": setup.get("stylized_images", 0.0),
            # per-client means per round, summed over rounds (evaluation every round: one record per round)
            "training_stylized_per_client": sum(m.get("stylized_images", 0.0) for m in made),
            "training_stylize_s_per_client": sum(m.get("stylize_seconds", 0.0) for m in made),
            "target_acc": summary["target_avg"]["selected"], "command": "fedstyle " + " ".join(command[1:])}


def part_runs(args, work: Path) -> dict:
    cache = work / "cache"
    if cache.exists():
        shutil.rmtree(cache)
    # the dataset's decoded cache is built once, outside the timings
    subprocess.run([sys.executable, "-c", f"from fedstyle.data import load_dataset; load_dataset({args.dataset!r}, "
                    "progress=False)"], check=True, env=dict(os.environ, FEDSTYLE_CACHE=str(cache)))
    plan = [("fedavg", "cold", {}), ("ccst", "cold", {}), ("ccst", "warm", {}), ("pardon", "cold", {}),
            ("pardon", "warm", {})]
    if args.eager:
        plan += [("ccst", "eager, cold", {"stylize": "eager"}), ("pardon", "eager, cold", {"stylize": "eager"})]
    rows = {}
    for method, kind, hp in plan:
        if kind.endswith("cold") and method != "fedavg":
            for name in (*METHODS, STYLE_CACHE):  # a cold run starts without any client style or stylized image
                shutil.rmtree(cache / name, ignore_errors=True)
        label = f"{method} ({kind})"
        print(f"running {label} ...", file=sys.stderr, flush=True)
        rows[label] = timed_run(method, args, work / "".join(c if c.isalnum() else "-" for c in label), cache, hp)
    base = rows["fedavg (cold)"]["wall_s"]
    print(f"\n{args.dataset}, target {args.target}, 3 domain clients, {args.rounds} rounds x {args.local_steps} local "
          f"steps, device {args.device}, {torch.get_num_threads()} torch threads\n")
    print("| run | wall s | x FedAvg | setup s (share) | style s (images) | generated | made at setup | "
          "made by training batches (per client; s) | target acc |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for label, r in rows.items():
        share = r["setup_s"] / r["wall_s"]
        print(f"| {label} | {r['wall_s']:.0f} | {r['wall_s'] / base:.2f} | {r['setup_s']:.1f} ({100 * share:.0f}%) | "
              f"{r['style_s']:.1f} ({r['style_images']:.0f}) | {r['augmented_images']:.0f} | "
              f"{r['setup_stylized_images']:.0f} | {r['training_stylized_per_client']:.0f}; "
              f"{r['training_stylize_s_per_client']:.1f} | {r['target_acc']:.3f} |")
    return rows


# -- part 2: the setup per backend and client count ------------------------------------------------------
def random_adain_weights(folder: Path) -> dict[str, str]:
    """VGG-19 and decoder files with random weights in the public layout (timing only)."""
    from fedstyle.style.transfer.adain import DECODER_FILE, VGG_FILE, adain_decoder, vgg_normalised

    torch.manual_seed(0)
    torch.save(vgg_normalised().state_dict(), folder / VGG_FILE)
    torch.save(adain_decoder().state_dict(), folder / DECODER_FILE)
    return {"vgg_weights": str(folder / VGG_FILE), "decoder_weights": str(folder / DECODER_FILE)}


def part_backends(args, work: Path) -> dict:
    os.environ["FEDSTYLE_CACHE"] = str(work / "cache")  # this benchmark's cache: its stylized images are removed
    adain = random_adain_weights(work)
    rows = {}
    for clients in args.clients:
        partition = dict(partition="domain") if clients == 3 else dict(partition="lambda", lam=0.1, clients=clients)
        for method in METHODS:
            for backend in args.backends.split(","):
                hp = {"style_backend": backend, **(adain if backend == "adain" else {})}
                for name in (*METHODS, STYLE_CACHE):  # cold: no client style, no stylized image
                    shutil.rmtree(cache_dir() / name, ignore_errors=True)
                config = RunConfig(method=method, hparams=hp, dataset=args.dataset, targets=[args.target],
                                   device=args.device, rounds=1, **partition)
                exp = build_experiment(config, progress=False)
                start = time.perf_counter()
                info = exp.simulator.setup()
                setup_s = time.perf_counter() - start
                data = exp.simulator.clients[0]
                store = next(s for s in (data.pool.images, *data.views.values()) if isinstance(s, LazyImages))
                rows_to_make = torch.randperm(len(store), generator=torch.Generator().manual_seed(0))
                rows_to_make = rows_to_make[: args.transfer_sample]
                start = time.perf_counter()
                store.ensure(rows_to_make)
                made_s = time.perf_counter() - start
                rate = store.count.transferred / made_s if made_s > 0 else float("nan")
                generated = info.get("augmented_images", 0.0)
                label = f"{method} {backend} {clients}"
                rows[label] = {"method": method, "backend": backend, "clients": clients, "setup_s": setup_s,
                               "style_s": info.get("style_seconds", 0.0), "style_images": info.get("style_images", 0.0),
                               "style_images_per_s": info.get("style_images_per_s", float("nan")),
                               "transfer_images_per_s": rate, "transferred": store.count.transferred,
                               "generated": generated, "eager_setup_estimate_s": setup_s + generated / rate}
                print(f"{label}: setup {setup_s:.1f} s, transfer {rate:.0f} img/s", file=sys.stderr, flush=True)
    print(f"\n{args.dataset}, target {args.target}, device {args.device}, {torch.get_num_threads()} torch threads; "
          "adain with random weights (timing only)\n")
    print("| method | backend | clients | setup s (lazy) | style s | style images | style img/s | transfer img/s | "
          "generated images | eager setup s (est.) |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows.values():
        print(f"| {r['method']} | {r['backend']} | {r['clients']} | {r['setup_s']:.1f} | {r['style_s']:.1f} | "
              f"{r['style_images']:.0f} | {r['style_images_per_s']:,.0f} | {r['transfer_images_per_s']:,.0f} | "
              f"{r['generated']:,.0f} | {r['eager_setup_estimate_s']:,.0f} |")
    return rows


# -- part 3: the style of a sample ----------------------------------------------------------------------
def style_vector(style) -> torch.Tensor:
    return torch.cat([style.tensors[k].reshape(-1).double() for k in sorted(style.tensors)])


def part_sample(args, work: Path) -> dict:
    dataset = load_dataset(args.dataset, progress=False)
    backend = make_backend("lite", torch.device(args.device if args.device != "auto" else "cpu"))
    full, rows = {}, {}
    for domain in dataset.domains:
        images, labels = dataset.images[domain], dataset.labels[domain]
        rows[domain] = {}
        full[domain] = style_vector(backend.dataset_style(images[s : s + 256] for s in range(0, len(images), 256)))
        for size in SAMPLE_SIZES:
            if size >= len(images):  # the sample would be every image: no error
                continue
            errors = []
            for seed in range(3):
                picked = images[style_sample(labels, size, seed)]
                estimate = style_vector(backend.dataset_style(picked[s : s + 256] for s in range(0, size, 256)))
                errors.append(float((estimate - full[domain]).norm() / full[domain].norm()))
            rows[domain][size] = statistics.fmean(errors)
        print(f"{domain}: {rows[domain]}", file=sys.stderr, flush=True)
    domains = list(dataset.domains)
    between = [float((full[a] - full[b]).norm() / full[a].norm())
               for i, a in enumerate(domains) for b in domains[i + 1:]]
    print(f"\n{args.dataset}, lite backend: relative L2 error of the overall style [mu, sigma] from a class-stratified "
          f"sample vs all images (mean of 3 seeds)\n")
    print("| domain | images | " + " | ".join(f"{n}" for n in SAMPLE_SIZES) + " |")
    print("|---|--:|" + "--:|" * len(SAMPLE_SIZES))
    for domain in domains:
        print(f"| {domain} | {len(dataset.labels[domain])} | "
              + " | ".join(f"{100 * rows[domain][n]:.2f}%" if n in rows[domain] else "all" for n in SAMPLE_SIZES)
              + " |")
    print(f"\nbetween two domains' overall styles: {100 * min(between):.0f}% to {100 * max(between):.0f}% "
          f"(relative L2, {len(between)} pairs)")
    return {"errors": rows, "between_domains": between}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("runs", "backends", "sample", "all"), default="all")
    parser.add_argument("--dataset", default="fashion4")
    parser.add_argument("--target", default="art")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--eager", action="store_true", help="runs: also CCST and PARDON with stylize=eager (long)")
    parser.add_argument("--transfer-sample", type=int, default=512, help="backends: images made to time a transfer")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="backends: which style backends")
    parser.add_argument("--clients", type=int, nargs="+", default=[3, 100], help="backends: client counts (3: one "
                        "client per source domain; more: PARDON's lambda = 0.1 partition)")
    parser.add_argument("--work", default=None, help="folder for the runs and caches (default: a temporary one)")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="setup-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    parts = ("runs", "backends", "sample") if args.part == "all" else (args.part,)
    report = {"settings": vars(args), "torch_threads": torch.get_num_threads()}
    for part in parts:
        report[part] = {"runs": part_runs, "backends": part_backends, "sample": part_sample}[part](args, work)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
