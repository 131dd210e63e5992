"""``fedstyle run --dry-run``: what a run would train on, read before it trains (issue 51's new-user read).

It loads the dataset (decoded once and cached, as a run does), resolves every ``auto`` setting, builds the
protocol's split and the partition exactly as the run will (the same seeds), and says what it found. It builds no
model, trains nothing and writes nothing: a long job's backbone, domains and clients can be checked first.
"""

from __future__ import annotations

from fedstyle.experiments.build import check_method_settings, plan_data
from fedstyle.experiments.config import RunConfig


def preview_run(config: RunConfig, progress: bool = True) -> str:
    """The text ``fedstyle run --dry-run`` prints for ``config``: settings, split, partition. It refuses what the
    run refuses before training (:func:`check_method_settings`, the runtime, the device), and builds the data with
    the run's own step (:func:`~fedstyle.experiments.build.plan_data`)."""
    from fedstyle.algorithms import METHODS
    from fedstyle.algorithms.base import Algorithm
    from fedstyle.devices import resolve_device
    from fedstyle.experiments.runner import check_backend
    from fedstyle.partition import format_partition_table

    check_method_settings(config)
    check_backend(config)
    resolve_device(config.device)
    method = METHODS.get(config.method)
    hparams = method.resolve(config.hparams)
    config, dataset, split, clients = plan_data(config, progress)
    steps = f"{config.local_steps} local steps" if config.local_steps else \
        f"{config.local_epochs} local epoch{'s' if config.local_epochs > 1 else ''}"
    side = config.input_resolution or dataset.resolution
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
        lines.append(f"  targets: none (--protocol all: every domain trains; selection {config.resolved_selection()})")
    if split.val_domain:
        lines.append(f"  validation domain: {split.val_domain} {len(split.heldout[split.val_domain])}")
    copies = f", each image {config.data_copies} times" if config.data_copies > 1 else ""
    lines += [f"  partition {config.partition} ({len(clients)} clients, {config.topology} topology{copies}):",
              *("    " + line for line in format_partition_table(clients, dataset).splitlines())]
    return "\n".join(lines)
