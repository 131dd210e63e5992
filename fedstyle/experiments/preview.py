"""``fedstyle run --dry-run``: what a run would train on, read before it trains (issue 51's new-user read).

It loads the dataset (decoded once and cached, as a run does), resolves every ``auto`` setting, builds the
protocol's split and the partition exactly as the run will (the same seeds), and says what it found. It builds no
model, trains nothing and writes nothing: a long job's backbone, domains and clients can be checked first.
"""

from __future__ import annotations

from fedstyle.experiments.build import check_source_validation, load_config_dataset, resolve_config
from fedstyle.experiments.config import RunConfig


def preview_run(config: RunConfig, progress: bool = True) -> str:
    """The text ``fedstyle run --dry-run`` prints for ``config``: settings, split, partition."""
    from fedstyle.algorithms import METHODS
    from fedstyle.partition import format_partition_table, make_partition, make_split
    from fedstyle.seeding import derive_seed

    config.validate()
    method = METHODS.get(config.method)
    hparams = method.resolve(config.hparams)
    dataset = load_config_dataset(config, progress=progress)
    config = resolve_config(config, dataset)
    split = make_split(dataset, config.protocol, targets=list(config.targets), val_domain=config.val_domain,
                       source=config.source, val_fraction=config.val_fraction, seed=config.seed)
    check_source_validation(config, split)
    clients = make_partition(config.partition, split, dataset, num_clients=config.clients, alpha=config.alpha,
                             lam=config.lam, min_size=config.min_client_size,
                             seed=derive_seed(config.seed, "partition"))
    steps = f"{config.local_steps} local steps" if config.local_steps else \
        f"{config.local_epochs} local epoch{'s' if config.local_epochs > 1 else ''}"
    side = config.input_resolution or dataset.resolution
    from fedstyle.algorithms.base import Algorithm

    # the method's own options, and the options every method has where they differ from their defaults
    common = {h.name: h.default for h in Algorithm.declared_hparams()}
    shown = ", ".join(f"{k}={v}" for k, v in hparams.items() if k not in common or v != common[k])
    lines = [
        f"{config.label or method.display_name(hparams)} ({config.method}) on "
        f"{dataset.name}, protocol {config.protocol}, seed {config.seed}",
        f"  model: {config.backbone}{' (ImageNet weights)' if config.pretrained else ''} at {side} px; "
        f"{dataset.num_classes} classes",
        f"  budget: {config.rounds} rounds x {steps} of batch {config.batch_size}; {config.optimizer} lr {config.lr:g}"
        f" ({config.lr_schedule}); selection {config.resolved_selection()}",
        f"  hyperparameters: {shown or 'none of its own'}",
        "  sources (train / validation images): "
        + ", ".join(f"{d} {len(split.train[d])} / {len(split.val[d])}" for d in split.sources),
    ]
    if split.targets:
        lines.append("  targets (test images): " + ", ".join(f"{d} {len(split.heldout[d])}" for d in split.targets))
    else:
        lines.append("  targets: none (--protocol all: every domain trains; the model is selected on source "
                     "validation)")
    if split.val_domain:
        lines.append(f"  validation domain: {split.val_domain} {len(split.heldout[split.val_domain])}")
    lines += [f"  partition {config.partition} ({len(clients)} clients, {config.topology} topology):",
              *("    " + line for line in format_partition_table(clients, dataset).splitlines())]
    return "\n".join(lines)
