"""Speed of fedstyle's simulator against a straightforward reference-style loop.

Job: FedAvg on digits4, leave MNIST out, 30 clients (10 single-domain clients per source domain),
10 sampled per round, ConvNet, batch 32, one local epoch. Measured in the same process:

1. fedstyle's in-process star simulator (one model object, uint8 tensors in memory, batched transforms);
2. a straightforward loop in the style of the public reference code: ``copy.deepcopy`` of the global
   model per client, images decoded from PNG files per sample in a ``Dataset.__getitem__`` and
   batched by a ``DataLoader`` (num_workers=0: this machine has 2 cores, both used by training),
   state-dict averaging in Python;
3. the training FLOP/s fedstyle reaches (forward FLOPs of convolutions and linear layers counted by
   hooks, times 3 for forward + backward) against this machine's measured float32 matmul FLOP/s.

    python benchmarks/speed.py [--rounds 3] [--device cpu] [--runtimes] [--style-ops] [--client-batching]

With ``--runtimes`` (or ``--only-runtimes``) the same run also times the job as whole runs under
4. fedstyle's in-process simulator, Flower's simulation engine (``--backend flower-sim``, Ray) and a
   loopback Flower deployment (``fedstyle deploy``: SuperLink + 30 SuperNodes, TLS), in seconds per
   round and as ratios to the simulator.

With ``--style-ops`` (or ``--only-style-ops``) it times the cost of the feature-level style ops:
5. FedAvg, local MixStyle and local DSU (p = 0.5 after layer1-3) on digits4 with one client per
   source domain, 50 local steps of batch 64 per client per round, evaluation included, rounds of the
   three interleaved so that load on the machine hits them alike; seconds per round and the ratios
   to FedAvg (aim: <= 1.2x).

With ``--client-batching`` (or ``--only-client-batching``) it times the batched client executor:
6. FedAvg rounds (training only, no evaluation) at 10, 30 and 100 sampled clients per round
   (``--batching-clients``), 102 single-domain clients, 5 local steps of batch 32 each, sequential
   (``--client-batching off``) against batched (``on``) on ``--device``: rounds per second of each, the
   ratio, and the fraction of the matmul rate each reaches (FLOPs counted as in 3.). On a 2-core CPU
   batching loses (vmap trained 350 samples/s against 1,000-1,500); on a GPU the sequential path is
   launch-bound, which is where it should pay.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from fedstyle.experiments.build import build_experiment
from fedstyle.experiments.config import RunConfig

JOB = RunConfig(method="fedavg", dataset="digits4", targets=["mnist"], partition="per_domain", clients=30,
                clients_per_round=10, rounds=1000, batch_size=32, local_epochs=1, lr=0.05, lr_schedule="constant",
                seed=0)


def forward_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-adds x 2 of every Conv2d and Linear for one sample (BatchNorm, ReLU, pooling ignored)."""
    total = 0

    def conv_hook(module, inputs, output):
        nonlocal total
        k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
        total += 2 * k * output[0].numel()

    def linear_hook(module, inputs, output):
        nonlocal total
        total += 2 * module.in_features * module.out_features

    hooks = [m.register_forward_hook(conv_hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    hooks += [m.register_forward_hook(linear_hook) for m in model.modules() if isinstance(m, nn.Linear)]
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, *input_shape, device=next(model.parameters()).device))
    for h in hooks:
        h.remove()
    return total


def matmul_flops_per_second(device: torch.device, n: int = 2048, repeats: int = 10) -> float:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(2):
        a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_fedstyle(exp, rounds: int) -> tuple[float, int]:
    sim = exp.simulator
    sim.run_round(0)  # warm-up
    _sync(exp.device)
    samples = 0
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        result = sim.run_round(r)
        samples += sum(len(sim.clients[c]) for c in result.clients)  # one local epoch each
    _sync(exp.device)
    return (time.perf_counter() - start) / rounds, samples


class PngDataset(torch.utils.data.Dataset):
    """Reference-code style: one PNG file per sample, decoded and normalised in __getitem__."""

    def __init__(self, files: list[Path], labels: list[int], mean, std):
        self.files, self.labels = files, labels
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        with Image.open(self.files[i]) as img:
            x = np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255.0
        return torch.from_numpy((x - self.mean) / self.std), self.labels[i]


def write_pngs(exp, folder: Path) -> list[tuple[list[Path], list[int]]]:
    out = []
    for cid, data in enumerate(exp.simulator.clients):
        files, labels = [], []
        for i in range(len(data)):
            path = folder / f"c{cid}_{i}.png"
            Image.fromarray(data.images[i].permute(1, 2, 0).cpu().numpy()).save(path)
            files.append(path)
            labels.append(int(data.labels[i]))
        out.append((files, labels))
    return out


def time_reference_loop(exp, pngs, rounds: int) -> float:
    cfg = exp.config
    # the reference code keeps PyTorch's default NCHW layout
    global_model = copy.deepcopy(exp.model).to(device=exp.device, memory_format=torch.contiguous_format)
    mean, std = exp.dataset.mean, exp.dataset.std

    def one_round(r: int) -> None:
        chosen = exp.simulator.sample_clients(r)
        states, sizes = [], []
        for cid in chosen:
            local = copy.deepcopy(global_model)
            local.train()
            opt = torch.optim.SGD(local.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
            files, labels = pngs[cid]
            loader = torch.utils.data.DataLoader(PngDataset(files, labels, mean, std), batch_size=cfg.batch_size,
                                                 shuffle=True, num_workers=0, drop_last=False)
            for x, y in loader:
                if len(y) < 2:
                    continue
                x, y = x.to(exp.device), y.to(exp.device)
                loss = F.cross_entropy(local(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            states.append(local.state_dict())
            sizes.append(len(files))
        total = sum(sizes)
        avg = {}
        for key in states[0]:
            if states[0][key].is_floating_point():
                avg[key] = sum(s[key] * (n / total) for s, n in zip(states, sizes))
            else:
                avg[key] = states[0][key]
        global_model.load_state_dict(avg)

    one_round(0)
    _sync(exp.device)
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        one_round(r)
    _sync(exp.device)
    return (time.perf_counter() - start) / rounds


def steady_seconds_per_round(run_dir: Path) -> float:
    """Seconds per round after the first, from metrics.jsonl (training + the evaluation each round)."""
    seconds = [r["seconds"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "event" not in r]
    return (seconds[-1] - seconds[0]) / (len(seconds) - 1)


def time_runtimes(rounds: int, device: str, folder: Path) -> dict[str, float]:
    """The same FedAvg job, as whole runs, under fedstyle's simulator, Flower's simulation engine and a
    loopback deployment (SuperLink + one SuperNode per client, TLS): steady seconds per round
    (the first round, which includes start-up, is left out) and each run's total wall time."""
    from fedstyle.experiments.runner import run_experiment, start_run_dir
    from fedstyle.runtimes.flower.certs import make_certificates
    from fedstyle.runtimes.flower.deployment import DeploySettings, deploy_run

    job = JOB.updated(rounds=rounds + 1, device=device, eval_every=1)
    out: dict[str, float] = {}
    for name, config in (("simulator", job), ("flower_sim", job.updated(backend="flower-sim"))):
        start = time.perf_counter()
        run_experiment(config, folder / name, quiet=True)
        out[f"{name}_wall_seconds"] = time.perf_counter() - start
        out[f"{name}_seconds_per_round"] = steady_seconds_per_round(folder / name)
    make_certificates(folder / "certs")
    sites = len(build_experiment(job, progress=False).client_specs)
    start = time.perf_counter()
    start_run_dir(job, folder / "deploy", quiet=True)
    # one torch thread per site process (the sites share this machine's cores, as Ray's actors do)
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        deploy_run(folder / "deploy", DeploySettings(sites=sites, certs=str(folder / "certs"), min_sites=sites),
                   quiet=True, rounds=job.rounds)
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    out["deployment_wall_seconds"] = time.perf_counter() - start
    out["deployment_seconds_per_round"] = steady_seconds_per_round(folder / "deploy")
    for name in ("flower_sim", "deployment"):
        out[f"{name}_over_simulator"] = out[f"{name}_seconds_per_round"] / out["simulator_seconds_per_round"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per variant (after one warm-up)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--runtimes", action="store_true",
                        help="also time the job as whole runs under the simulator, --backend flower-sim and "
                        "`fedstyle deploy` on loopback (needs fedstyle[flower-sim]; several minutes)")
    parser.add_argument("--only-runtimes", action="store_true", help="time only the runtimes (implies --runtimes)")
    parser.add_argument("--style-ops", action="store_true",
                        help="also time FedAvg vs local MixStyle vs local DSU per round (the style ops' cost)")
    parser.add_argument("--only-style-ops", action="store_true", help="time only the style ops")
    parser.add_argument("--client-batching", action="store_true",
                        help="also time sequential vs batched FedAvg rounds (--client-batching off / on)")
    parser.add_argument("--only-client-batching", action="store_true", help="time only the client batching")
    parser.add_argument("--batching-clients", default="10,30,100",
                        help="clients per round for --client-batching, comma-separated (default: 10,30,100)")
    args = parser.parse_args()
    counts = [int(c) for c in args.batching_clients.split(",") if c.strip()]
    if args.only_client_batching:
        _print_figures({"threads": torch.get_num_threads(), **time_client_batching(args.rounds, args.device, counts)},
                       args.json)
        return
    if args.only_style_ops:
        _print_figures({"device": args.device, "threads": torch.get_num_threads(),
                        **time_style_ops(args.rounds, args.device)}, args.json)
        return
    if args.only_runtimes:
        with tempfile.TemporaryDirectory() as tmp:
            figures = time_runtimes(args.rounds, args.device, Path(tmp))
        _print_figures(figures, args.json)
        return

    exp = build_experiment(JOB.updated(device=args.device), progress=False)
    device = exp.device
    res = exp.dataset.resolution
    fedstyle_s, samples = time_fedstyle(exp, args.rounds)
    samples_per_s = samples / (fedstyle_s * args.rounds)
    flops = forward_flops(exp.model, (3, res, res))
    train_flops_per_s = 3 * flops * samples_per_s
    peak = matmul_flops_per_second(device)
    with tempfile.TemporaryDirectory() as tmp:
        pngs = write_pngs(exp, Path(tmp))
        reference_s = time_reference_loop(exp, pngs, args.rounds)

    figures = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "fedstyle_seconds_per_round": fedstyle_s,
        "fedstyle_train_samples_per_second": samples_per_s,
        "reference_loop_seconds_per_round": reference_s,
        "speedup_vs_reference": reference_s / fedstyle_s,
        "forward_mflops_per_sample": flops / 1e6,
        "training_gflops_per_second": train_flops_per_s / 1e9,
        "matmul_gflops_per_second": peak / 1e9,
        "fraction_of_matmul_rate": train_flops_per_s / peak,
    }
    if args.runtimes:
        with tempfile.TemporaryDirectory() as tmp:
            figures.update(time_runtimes(args.rounds, args.device, Path(tmp)))
    if args.style_ops:
        figures.update(time_style_ops(args.rounds, args.device))
    if args.client_batching:
        figures.update(time_client_batching(args.rounds, args.device, counts))
    _print_figures(figures, args.json)


STYLE_JOB = RunConfig(method="fedavg", dataset="digits4", targets=["mnist"], partition="domain", rounds=1000,
                      batch_size=64, local_steps=50, lr=0.05, lr_schedule="constant", seed=0)


def time_style_ops(rounds: int, device: str) -> dict[str, float]:
    """Seconds per round (training + evaluation) of FedAvg, MixStyle and DSU, rounds interleaved."""
    from fedstyle.experiments.summary import evaluate_round

    variants = {"fedavg": {}, "mixstyle": {"style": "mixstyle"}, "dsu": {"style": "dsu"}}
    exps = {name: build_experiment(STYLE_JOB.updated(device=device, hparams=hp), progress=False)
            for name, hp in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds + 1):  # round 0 warms up
        for name, exp in exps.items():
            _sync(exp.device)
            start = time.perf_counter()
            result = exp.simulator.run_round(r)
            evaluate_round(exp, r + 1, result.train_loss, 0.0)
            _sync(exp.device)
            if r:
                times[name].append(time.perf_counter() - start)
    out = {f"style_ops_{name}_seconds_per_round": float(np.median(t)) for name, t in times.items()}
    for name in ("mixstyle", "dsu"):
        out[f"style_ops_{name}_over_fedavg"] = out[f"style_ops_{name}_seconds_per_round"] / \
            out["style_ops_fedavg_seconds_per_round"]
    return out


BATCHING_JOB = RunConfig(method="fedavg", dataset="digits4", targets=["mnist"], partition="per_domain", clients=102,
                         rounds=1000, batch_size=32, local_steps=5, lr=0.05, lr_schedule="constant", seed=0)


def local_samples(data, batch_size: int, steps: int) -> int:
    """Samples one client trains on in ``steps`` steps (its epochs' batches, the short last one included)."""
    full, rest = divmod(len(data), batch_size)
    epoch = [batch_size] * full + ([rest] if rest >= 2 or (rest == 1 and full == 0) else [])
    return sum(epoch[i % len(epoch)] for i in range(steps))


def time_client_batching(rounds: int, device: str, counts: list[int]) -> dict[str, float]:
    """Rounds per second (training phase and aggregation) of FedAvg with the clients trained one after
    another (off) and as one batched computation (on), per clients-per-round count; each variant gets a
    warm-up round, then ``rounds`` timed rounds."""
    out: dict[str, float] = {}
    peak = flops = None
    for m in counts:
        job = BATCHING_JOB.updated(device=device, clients=max(BATCHING_JOB.clients, 3 * -(-m // 3)), clients_per_round=m)
        for mode, name in (("off", "sequential"), ("on", "batched")):
            exp = build_experiment(job.updated(client_batching=mode), progress=False)
            sim = exp.simulator
            if peak is None:
                peak = matmul_flops_per_second(exp.device)
                flops = forward_flops(exp.model, (3, exp.dataset.resolution, exp.dataset.resolution))
                out.update(device=str(exp.device), matmul_gflops_per_second=peak / 1e9)
            sim.run_round(0)  # warm-up (and the batching decision)
            if mode == "on":
                assert sim.batching().trainer is not None, sim.batching().reason
            _sync(exp.device)
            samples = 0
            start = time.perf_counter()
            for r in range(1, rounds + 1):
                result = sim.run_round(r)
                samples += sum(local_samples(sim.clients[c], job.batch_size, job.local_steps) for c in result.clients)
            _sync(exp.device)
            seconds = time.perf_counter() - start
            out[f"batching_{m}_{name}_rounds_per_second"] = rounds / seconds
            out[f"batching_{m}_{name}_fraction_of_matmul_rate"] = 3 * flops * samples / seconds / peak
        out[f"batching_{m}_batched_over_sequential"] = (out[f"batching_{m}_batched_rounds_per_second"]
                                                        / out[f"batching_{m}_sequential_rounds_per_second"])
    return out


def _print_figures(figures: dict, json_path: str | None) -> None:
    for k, v in figures.items():
        print(f"{k:36s} {v:.3f}" if isinstance(v, float) else f"{k:36s} {v}")
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
