"""Assemble a run from its config: dataset, protocol split, clients, model, method, simulator."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch

from fedstyle.algorithms import METHODS, Algorithm
from fedstyle.data import BatchTransform, DomainDataset, SamplePool, load_dataset
from fedstyle.devices import resolve_device, set_deterministic_kernels
from fedstyle.errors import ConfigError, DataError
from fedstyle.experiments.config import RunConfig
from fedstyle.data.client import ClientData
from fedstyle.federation.evaluate import EvalSet
from fedstyle.federation.p2p import P2PSimulator
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.federation.states import parse_budget
from fedstyle.federation.topology import build_graph
from fedstyle.models import build_model, input_normalization
from fedstyle.partition import ClientSpec, Split, make_partition, make_split
from fedstyle.seeding import derive_seed, seed_everything

#: data up to this size is moved to the accelerator once, so batches never cross the bus
_DEVICE_DATA_BYTES = 2 << 30


@dataclass
class Experiment:
    config: RunConfig
    dataset: DomainDataset
    split: Split
    client_specs: list[ClientSpec]
    algorithm: Algorithm
    model: torch.nn.Module
    simulator: StarSimulator | P2PSimulator
    transform: BatchTransform
    device: torch.device
    source_val: dict[str, EvalSet] = field(default_factory=dict)
    targets: dict[str, EvalSet] = field(default_factory=dict)
    heldout_val: dict[str, EvalSet] = field(default_factory=dict)
    graph: nx.Graph | None = None

    @property
    def label(self) -> str:
        return type(self.algorithm).display_name(self.algorithm.hp)


def shared_clients(dataset: DomainDataset, split: Split, specs: list[ClientSpec],
                   transform: BatchTransform) -> list[ClientData]:
    """The clients of ``specs`` as rows of one :class:`SamplePool` of the split's training samples.

    The pool holds every source domain's training samples once (source order, each domain's
    ``split.train`` order); a client holds only the pool rows of its samples, in the order of its
    spec (domain by domain), so its batches are the images a per-client copy would give.
    """
    images, labels, domains, position, offset = [], [], [], {}, 0
    for domain in split.sources:
        idx = split.train[domain]
        images.append(dataset.images[domain][idx])
        labels.append(dataset.labels[domain][idx].long())
        domains.append(torch.full((len(idx),), dataset.domains.index(domain), dtype=torch.long))
        where = torch.full((len(dataset.labels[domain]),), -1, dtype=torch.long)
        where[idx] = torch.arange(offset, offset + len(idx))
        position[domain], offset = where, offset + len(idx)
    pool = SamplePool(torch.cat(images), torch.cat(labels), torch.cat(domains))
    clients = []
    for cid, spec in enumerate(specs):
        parts = [position[d][idx] for d, idx in spec.indices.items()] if spec.indices else []
        rows = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        if rows.numel() and int(rows.min()) < 0:
            raise ConfigError(f"client {cid} holds samples outside the training split (a partition bug)")
        clients.append(ClientData.from_pool(pool, rows, transform))
    return clients


#: image side (px) up to which ``--backbone auto`` trains the small ConvNet rather than a ResNet
SMALL_IMAGES = 64


def resolve_config(config: RunConfig, dataset: DomainDataset) -> RunConfig:
    """Fill every 'auto' or unset option with the value actually used."""
    method = METHODS.get(config.method)
    backbone = config.backbone
    input_side = config.input_resolution or dataset.resolution  # what the model sees (--input-resolution)
    if backbone == "auto":  # the small ConvNet below 64 px, unless ImageNet weights are asked for (it has none)
        backbone = "convnet" if input_side <= SMALL_IMAGES and not config.pretrained else "resnet18"
    if config.pretrained and input_side < SMALL_IMAGES and config.resolution is None:
        warnings.warn(f"--pretrained {backbone} at {dataset.resolution} px, the images' own size: ImageNet features "
                      f"are learnt at 224 px; --resolution 224 upsamples to it, or drop --pretrained to train the "
                      f"small ConvNet (--backbone auto) at {dataset.resolution} px", stacklevel=2)
    return config.updated(
        backbone=backbone,
        resolution=dataset.resolution,
        augment=config.augment or dataset.augment,
        hparams=simulation_noise(method.resolve(config.hparams)),
        selection=config.resolved_selection(),
    )


def simulation_noise(hparams: dict[str, Any]) -> dict[str, Any]:
    """``dp_noise_source=auto`` is ``seeded`` here: a run built from a config is a simulation unless its runtime
    says otherwise (``fedstyle deploy`` writes ``os`` before, and a Flower site outside the simulation engine
    forces ``os``; :mod:`fedstyle.style.privacy`), and one process then plays every party."""
    if hparams.get("dp_noise_source") == "auto":
        return {**hparams, "dp_noise_source": "seeded"}
    return hparams


def deployment_noise(config: RunConfig, *, refuse_seeded: bool = True) -> RunConfig:
    """The config a deployment runs: a style defence's noise from the OS CSPRNG (``dp_noise_source=os``), since
    the coordinator it protects against knows the config and the seed. An explicit ``seeded`` is refused
    (``refuse_seeded``) or overridden."""
    method = METHODS.get(config.method)
    if "dp_noise_source" not in {h.name for h in method.HPARAMS}:
        return config
    given = config.hparams.get("dp_noise_source", "auto")
    if given == "seeded" and refuse_seeded:
        raise ConfigError("dp_noise_source=seeded lets the coordinator regenerate and subtract the noise; a "
                          "deployment draws it from the OS CSPRNG: drop the option (or give os)")
    return config.updated(hparams={**config.hparams, "dp_noise_source": "os"})


def check_defence_copies(config: RunConfig, hp: dict[str, Any]) -> None:
    """Refuse ``--data-copies K > 1`` with style noise: one image then sits in up to K clients and may repeat in
    one, so it moves a client's sums by up to 2C times its copies, and the eps the accountant gives (one image,
    one copy, :mod:`fedstyle.style.privacy`) would be understated."""
    if config.data_copies > 1 and hp.get("dp_noise", 0) > 0:
        raise ConfigError(f"--data-copies {config.data_copies} with the style defence (dp_noise={hp['dp_noise']:g}): "
                          "an image then sits in several clients and may repeat in one, so the eps reported would "
                          "be understated; use --data-copies 1 with dp_noise")


def load_config_dataset(config: RunConfig, progress: bool = True) -> DomainDataset:
    """The dataset a run of ``config`` trains and tests on (``per_class``: its fixed subset)."""
    dataset = load_dataset(config.dataset, data_root=config.data_root, resolution=config.resolution,
                           skip_bad_images=config.skip_bad_images, progress=progress,
                           official_splits=config.official_splits, image_column=config.image_column,
                           domain_column=config.domain_column, label_column=config.label_column,
                           per_class=config.per_class)  # a loader that can decodes only the run's pick (issue 54)
    return dataset


def check_source_validation(config: RunConfig, split: Split) -> None:
    """Refuse, before training, a source-validated run whose sources keep no validation image.

    The stratified split keeps at least one image of a class for training, so a class with one image
    per domain (``--per-class 1``, or a tiny folder) gives nothing to validate on; model selection on
    source validation would then average an empty set (NaN) and fail when the checkpoint is written."""
    if config.resolved_selection() != "source_val" or any(len(idx) for idx in split.val.values()):
        return
    cause = (f"--per-class {config.per_class} leaves each class one image per domain, which stays for training"
             if config.per_class == 1 else
             f"the source domains ({', '.join(split.sources)}) hold too few images per class to keep any")
    fix = "raise --per-class to 2 or more" if config.per_class == 1 else "give more images per class"
    raise DataError(f"no source validation image to select the model on (--selection source_val): {cause}; {fix}, "
                    "or pass --selection last")


def check_method_settings(config: RunConfig) -> None:
    """What a run refuses before it loads data: its settings, the method's topology and its defence's copies."""
    config.validate()
    method_cls = METHODS.get(config.method)
    if config.topology not in method_cls.topologies:
        if config.topology == "star":
            fix = f"pass --topology {method_cls.topologies[0]} (a peer-to-peer graph)"
        else:
            p2p = [name for name, cls in METHODS.items() if config.topology in cls.topologies]
            fix = f"for peer-to-peer training use --method {' or '.join(p2p)}, or --topology star"
        raise ConfigError(f"method {config.method!r} runs on {', '.join(method_cls.topologies)}, not --topology "
                          f"{config.topology}; {fix}")
    check_defence_copies(config, method_cls.resolve(config.hparams))  # fail on a bad --hp before loading data


def plan_data(config: RunConfig, progress: bool = True) -> tuple[RunConfig, DomainDataset, Split, list]:
    """The run's data as it trains on it: the dataset, the config with every 'auto' resolved, the protocol's split
    and the partition's clients (the seeds of the run). ``fedstyle run --dry-run`` shows exactly this."""
    dataset = load_config_dataset(config, progress)
    config = resolve_config(config, dataset)
    split = make_split(
        dataset, config.protocol, targets=list(config.targets), val_domain=config.val_domain,
        source=config.source, val_fraction=config.val_fraction, seed=config.seed,
    )
    check_source_validation(config, split)
    specs = make_partition(
        config.partition, split, dataset, num_clients=config.clients, alpha=config.alpha, lam=config.lam,
        min_size=config.min_client_size, seed=derive_seed(config.seed, "partition"), copies=config.data_copies,
    )
    return config, dataset, split, specs


def build_experiment(config: RunConfig, progress: bool = True) -> Experiment:
    check_method_settings(config)
    method_cls = METHODS.get(config.method)
    device = resolve_device(config.device)
    set_deterministic_kernels(config.deterministic)  # before any kernel runs: cuBLAS reads its setting when it starts
    config, dataset, split, specs = plan_data(config, progress)
    mean, std = dataset.mean, dataset.std
    if config.pretrained:
        norm = input_normalization(config.backbone)
        if norm is not None:
            mean, std = norm
    transform = BatchTransform(mean, std, config.augment, output_size=config.input_resolution)

    seed_everything(derive_seed(config.seed, "model-init"))
    model = build_model(config.backbone, dataset.num_classes, config.input_resolution or dataset.resolution,
                        config.pretrained, config.weights)
    algorithm = method_cls(config.hparams, num_classes=dataset.num_classes, num_clients=len(specs))
    algorithm.configure_model(model)
    # after configure_model: a method's neck may add BatchNorm layers
    model.set_batchnorm(config.batchnorm, config.batchnorm_momentum, config.batchnorm_fix_round)
    model.to(device=device, memory_format=torch.channels_last)  # matches BatchTransform's NHWC output

    clients = shared_clients(dataset, split, specs, transform)
    source_val = {d: EvalSet(dataset.images[d][idx], dataset.labels[d][idx]) for d, idx in split.val.items() if len(idx)}
    targets = {d: EvalSet(dataset.images[d][split.heldout[d]], dataset.labels[d][split.heldout[d]]) for d in split.targets}
    heldout_val = {}
    if split.val_domain is not None:
        idx = split.heldout[split.val_domain]
        heldout_val[split.val_domain] = EvalSet(dataset.images[split.val_domain][idx], dataset.labels[split.val_domain][idx])

    if device.type != "cpu":
        total = clients[0].pool.nbytes + sum(s.images.numel() for s in [*source_val.values(), *targets.values()])
        if total <= _DEVICE_DATA_BYTES:
            clients = [c.to(device) for c in clients]
            for sets in (source_val, targets, heldout_val):
                for name, s in sets.items():
                    sets[name] = EvalSet(s.images.to(device), s.labels.to(device))

    settings = FederationSettings(
        rounds=config.rounds, lr=config.lr, lr_schedule=config.lr_schedule, batch_size=config.batch_size,
        local_epochs=config.local_epochs, local_steps=config.local_steps, optimizer=config.optimizer,
        momentum=config.momentum, weight_decay=config.weight_decay, fraction=config.fraction,
        clients_per_round=config.clients_per_round, head_lr_scale=config.head_lr_scale,
    )
    graph = None
    if config.topology == "star":
        simulator = StarSimulator(algorithm, model, clients, settings, config.seed, device,
                                  state_budget=parse_budget(config.state_budget), client_batching=config.client_batching)
    else:
        graph = build_graph(config.topology, len(clients), derive_seed(config.seed, "graph"), config.radius, config.edge_prob)
        simulator = P2PSimulator(algorithm, model, clients, settings, graph, config.seed, device)
    return Experiment(config, dataset, split, specs, algorithm, model, simulator, transform, device,
                      source_val, targets, heldout_val, graph)
