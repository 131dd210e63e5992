"""Why fine-tuning the pretrained track's EfficientNet-Lite0 with batch statistics collapsed (issue 35
section 3), and which recipe makes it work.

Same setting as benchmarks/pretrained_setup.py: fashion4's photo domain, 60 images per class (500 to
train, 100 to validate), 64 px, crop + flip, seed 0, batches of 32, SGD momentum 0.9, weight decay 5e-4.

``probe``: before any fine-tuning, how well the ImageNet features separate the classes under each way of
normalising them: ImageNet's running statistics (eval mode), each batch's own statistics (train mode),
and running statistics re-estimated on the 500 training images (AdaBN, Li et al. 2016). A logistic
regression on the pooled 1280-d features (train 500, validate 100), plus how far the batch statistics
sit from ImageNet's at each stage (|mean shift| / ImageNet std, and the variance ratio).

``finetune``: N steps per recipe; the validation accuracy three ways: with the running statistics the
run ends with (what a run selects on), with each validation batch's own statistics (what the weights
learned, free of the running statistics), and with running statistics re-estimated on the training
images after training (``recalibrate``). Recipes are ``mode:momentum:lr[:warmup[:head_lr_multiplier]]`` strings
(warm-up: linear over that many steps).

    PYTHONPATH=. python benchmarks/batchnorm_diagnosis.py probe
    PYTHONPATH=. python benchmarks/batchnorm_diagnosis.py finetune --steps 30 --recipes train:0.01:0.001 eval:0.01:0.001
    PYTHONPATH=. python benchmarks/batchnorm_diagnosis.py checkpoint RUN_DIR

``checkpoint``: a finished star run's last global model evaluated four ways (see :func:`checkpoint`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedstyle.data import BatchTransform, load_dataset
from fedstyle.models import build_model
from fedstyle.models.batchnorm import BATCHNORM_TYPES, batch_statistics
from fedstyle.models.efficientnet import LITE_MEAN, LITE_STD


def photo_split(data_root: str | None):
    data = load_dataset("fashion4", data_root=data_root, resolution=64, progress=False).subset_per_class(60)
    images, labels = data.images["photo"], data.labels["photo"]
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    return images, labels, order[:500], order[500:], data.num_classes


@torch.no_grad()
def recalibrate(model, images, transform, batches=16, batch=32) -> None:
    """Re-estimate every BatchNorm layer's running statistics on ``batches`` training batches (cumulative
    average: momentum None), weights untouched."""
    layers = [m for m in model.modules() if isinstance(m, BATCHNORM_TYPES)]
    saved = [(m.momentum, m.training) for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    draw = torch.Generator().manual_seed(7)
    for _ in range(batches):
        pick = torch.randint(0, len(images), (batch,), generator=draw)
        model(transform(images[pick], train=True, generator=draw))
    for m, (momentum, training) in zip(layers, saved):
        m.momentum = momentum
        m.train(training)


@torch.no_grad()
def predict(model, x, batch_stats: bool, batch=32):
    model.eval()
    out = []
    for start in range(0, len(x), batch):
        if batch_stats:
            with batch_statistics(model):
                out.append(model(x[start:start + batch]))
        else:
            out.append(model(x[start:start + batch]))
    return torch.cat(out)


@torch.no_grad()
def features(model, x, batch_stats: bool, batch=32):
    model.eval()
    out = []
    for start in range(0, len(x), batch):
        if batch_stats:
            with batch_statistics(model):
                out.append(model.features(x[start:start + batch]))
        else:
            out.append(model.features(x[start:start + batch]))
    return torch.cat(out)


def logistic_probe(train_x, train_y, val_x, val_y, classes, steps=300) -> tuple[float, float]:
    """Multinomial logistic regression (LBFGS, weight decay 1e-4) on standardised features: val accuracy
    and train accuracy."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    tx, vx = (train_x - mean) / std, (val_x - mean) / std
    w = torch.zeros(tx.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(tx @ w + b, train_y) + 1e-4 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return ((vx @ w + b).argmax(1) == val_y).float().mean().item(), ((tx @ w + b).argmax(1) == train_y).float().mean().item()


@torch.no_grad()
def stat_shift(model, x) -> list[tuple[str, float, float]]:
    """Per backbone stage's last BatchNorm: median over channels of |batch mean - running mean| /
    sqrt(running var + eps) and of batch var / running var (channels with running var > 1e-3)."""
    rows = []
    names = {"stem": "backbone._bn0", "layer1": "backbone._blocks.2._bn2", "layer2": "backbone._blocks.4._bn2",
             "layer3": "backbone._blocks.10._bn2", "layer4": "backbone._blocks.15._bn2", "head": "backbone._bn1"}
    modules = dict(model.named_modules())
    captured = {}
    hooks = [modules[n].register_forward_hook(lambda m, i, o, n=n: captured.__setitem__(n, i[0])) for n in names.values()]
    model.eval()
    model(x)
    for h in hooks:
        h.remove()
    for stage, name in names.items():
        m, inp = modules[name], captured[name]
        mean, var = inp.mean((0, 2, 3)), inp.var((0, 2, 3))
        keep = m.running_var > 1e-3
        shift = ((mean - m.running_mean).abs() / (m.running_var + m.eps).sqrt())[keep].median().item()
        ratio = (var / m.running_var)[keep].median().item()
        rows.append((stage, shift, ratio))
    return rows


def probe(args) -> None:
    images, labels, train, val, classes = photo_split(args.data_root)
    transform = BatchTransform(LITE_MEAN, LITE_STD, "crop_flip")
    torch.manual_seed(0)
    model = build_model("efficientnet_lite0", classes, 64, pretrained=True)
    tx, vx = transform(images[train], train=False), transform(images[val], train=False)
    print("| stage | median abs(batch mean - ImageNet mean) / ImageNet std | median batch var / ImageNet var |")
    print("|---|--:|--:|")
    for stage, shift, ratio in stat_shift(model, tx[:256]):
        print(f"| {stage} | {shift:.2f} | {ratio:.3g} |")
    print("\n| features normalised with | mean feature norm | probe val acc | probe train acc |\n|---|--:|--:|--:|")
    for label, batch_stats, adabn in (("ImageNet running statistics (eval mode)", False, False),
                                      ("each batch's statistics (train mode)", True, False),
                                      ("running statistics re-estimated on the 500 images (AdaBN)", False, True)):
        if adabn:
            recalibrate(model, images[train], transform)
        ftr, fva = features(model, tx, batch_stats), features(model, vx, batch_stats)
        acc, tr = logistic_probe(ftr, labels[train], fva, labels[val], classes)
        print(f"| {label} | {ftr.norm(dim=1).mean():.1f} | {acc:.2f} | {tr:.2f} |", flush=True)


def finetune(args) -> None:
    images, labels, train, val, classes = photo_split(args.data_root)
    transform = BatchTransform(LITE_MEAN, LITE_STD, "crop_flip")
    vx, vy = transform(images[val], train=False), labels[val]
    print(f"\n| BatchNorm | BN momentum | lr | warm-up | head lr x | train loss (last 5) | val acc, running stats | "
          f"val acc, batch stats | val acc, recalibrated | s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for recipe in args.recipes:
        parts = recipe.split(":")
        mode, bn_momentum, lr = parts[0], float(parts[1]), float(parts[2])
        warmup = int(parts[3]) if len(parts) > 3 else 0
        head_mult = float(parts[4]) if len(parts) > 4 else 1.0
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        draw = torch.Generator().manual_seed(args.seed + 1)
        model = build_model("efficientnet_lite0", classes, 64, pretrained=True)
        for module in model.modules():
            if isinstance(module, BATCHNORM_TYPES):
                module.momentum = bn_momentum
        model.set_batchnorm(mode)
        model.train()
        head = list(model.head.parameters())
        body = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in head)]
        opt = torch.optim.SGD([{"params": body, "scale": 1.0}, {"params": head, "scale": head_mult}],
                              lr=lr, momentum=0.9, weight_decay=5e-4)
        losses = []
        for step in range(args.steps):
            for group in opt.param_groups:
                group["lr"] = group["scale"] * lr * (min(1.0, (step + 1) / warmup) if warmup else 1.0)
            batch = train[torch.randint(0, len(train), (32,), generator=draw)]
            opt.zero_grad()
            loss = F.cross_entropy(model(transform(images[batch], train=True, generator=draw)), labels[batch])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        running = (predict(model, vx, False).argmax(1) == vy).float().mean().item()
        batch_acc = (predict(model, vx, True).argmax(1) == vy).float().mean().item()
        recalibrate(model, images[train], transform)
        recal = (predict(model, vx, False).argmax(1) == vy).float().mean().item()
        last = sum(losses[-5:]) / 5
        print(f"| {mode} | {bn_momentum} | {lr:g} | {warmup} | {head_mult:g} | {last:.2f} | {running:.2f} | {batch_acc:.2f} | "
              f"{recal:.2f} | {time.perf_counter() - start:.0f} |", flush=True)


def checkpoint(args) -> None:
    """A finished star run's last global model, each source-validation set and target evaluated with the
    running statistics the clients' average ended with, with each evaluation batch's own statistics, with
    statistics re-estimated on the pooled source training images, and on each domain's own."""
    from safetensors.torch import load_file

    from fedstyle.experiments.build import build_experiment
    from fedstyle.experiments.rundir import read_run_config

    run = Path(args.run)
    exp = build_experiment(read_run_config(run), progress=False)
    weights = {k[len("global/"):]: v for k, v in load_file(run / "checkpoint.safetensors").items()
               if k.startswith("global/")}
    model, transform = exp.model, exp.transform
    model.load_state_dict(weights)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    train = {d: exp.dataset.images[d][idx] for d, idx in exp.split.train.items()}
    pooled = torch.cat(list(train.values()))
    sets = {**{f"{d} (val)": s for d, s in exp.source_val.items()}, **{f"{d} (target)": s for d, s in exp.targets.items()}}
    print("| set | running statistics (the run's) | each batch's own | re-estimated on pooled sources | "
          "re-estimated on its own domain |\n|---|--:|--:|--:|--:|")
    for name, data in sets.items():
        x, y = transform(data.images, train=False), data.labels
        model.load_state_dict(saved)
        row = [(predict(model, x, False).argmax(1) == y).float().mean().item(),
               (predict(model, x, True).argmax(1) == y).float().mean().item()]
        recalibrate(model, pooled, transform)
        row.append((predict(model, x, False).argmax(1) == y).float().mean().item())
        domain = name.split(" ")[0]
        model.load_state_dict(saved)
        recalibrate(model, train.get(domain, data.images), transform)
        row.append((predict(model, x, False).argmax(1) == y).float().mean().item())
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("probe", "finetune", "checkpoint"))
    parser.add_argument("run", nargs="?", help="checkpoint: a finished star run's directory")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipes", nargs="+", default=["train:0.01:0.001", "eval:0.01:0.001"])
    parser.add_argument("--data-root")
    args = parser.parse_args()
    torch.set_num_threads(1)
    {"probe": probe, "finetune": finetune, "checkpoint": checkpoint}[args.what](args)


if __name__ == "__main__":
    main()
