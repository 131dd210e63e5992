"""Evaluation protocols: which domains train, which validate, which are tested.

* ``lodo`` (leave-one-domain-out, the protocol of CCST, StableFDG and PARDON's Table II): one or
  more target domains are tested whole; every other domain is a source.
* ``ltdo`` (leave-two-domains-out, Bai et al. ICLR'24, PARDON's Table I): one target domain and
  one validation domain are held out whole; the rest are sources (PACS "ac-p-s": train A, C;
  validation domain P; test domain S).
* ``single_source`` (FedGCA): one source domain; every other domain (or the given ones) is a target.
* ``all``: every domain is a source and none is held out: the model to deploy once a protocol above has chosen
  the method. It is selected on source validation (or the last round); no target accuracy is measured.

Each source domain is split into train / in-domain validation indices, stratified per class with
a seeded generator of its own (seed, domain name), so a domain's split is the same in every fold.

Where the dataset carries official splits (``DomainDataset.splits``: PACS's k-fold lists, DomainNet's
train/test lists, Camelyon17-WILDS's metadata), they are used as the papers use them: a source domain
trains on its ``train`` list and validates on its ``val`` list (with no ``val`` list, ``val_fraction``
of its ``train`` list, stratified and seeded as above); a held-out domain is tested on its ``test``
list (with none, on all its images).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import ConfigError, DataError
from fedstyle.registry import Registry


@dataclass
class Split:
    """Domains and sample indices of one evaluation fold.

    Attributes:
        sources: training domains (dataset order).
        targets: test domains, used whole.
        val_domain: the held-out validation domain (``ltdo`` only), used whole.
        train, val: source domain -> sorted int64 indices into ``dataset.labels[domain]``;
            disjoint, and together all indices of that domain.
        heldout: target or validation domain -> its test indices (all its indices without an official test list).
        protocol: the protocol name that produced it.
        official: the domains whose train / val / test indices came from the dataset's official splits.
    """

    sources: list[str]
    targets: list[str]
    val_domain: str | None
    train: dict[str, torch.Tensor] = field(default_factory=dict)
    val: dict[str, torch.Tensor] = field(default_factory=dict)
    heldout: dict[str, torch.Tensor] = field(default_factory=dict)
    protocol: str = ""
    official: list[str] = field(default_factory=list)

    @property
    def num_train(self) -> int:
        return sum(int(t.numel()) for t in self.train.values())


# A protocol maps (domains, targets, val_domain, source) to (sources, targets, val_domain).
Resolver = Callable[[list[str], list[str], Optional[str], Optional[str]], tuple[list[str], list[str], Optional[str]]]
PROTOCOLS: Registry[Resolver] = Registry("protocol")


def _reject(option: str, value: object, protocol: str, used_by: str) -> None:
    if value:
        raise ConfigError(f"{option} {value!r} is not used by protocol {protocol!r} (only by {used_by}); remove it")


@PROTOCOLS.register("lodo")
def _lodo(domains, targets, val_domain, source):
    _reject("--val-domain", val_domain, "lodo", "ltdo")
    _reject("--source", source, "lodo", "single_source")
    if not targets:
        raise ConfigError(f"protocol 'lodo' needs --target (one or more of: {', '.join(domains)})")
    return [d for d in domains if d not in targets], targets, None


@PROTOCOLS.register("ltdo")
def _ltdo(domains, targets, val_domain, source):
    _reject("--source", source, "ltdo", "single_source")
    if len(targets) != 1 or val_domain is None:
        raise ConfigError(
            "protocol 'ltdo' needs exactly one --target and one --val-domain "
            f"(two different domains of: {', '.join(domains)}), got targets={targets} val_domain={val_domain!r}"
        )
    if val_domain in targets:
        raise ConfigError(f"--val-domain {val_domain!r} must differ from --target {targets[0]!r}")
    return [d for d in domains if d not in targets and d != val_domain], targets, val_domain


@PROTOCOLS.register("single_source")
def _single_source(domains, targets, val_domain, source):
    _reject("--val-domain", val_domain, "single_source", "ltdo")
    if source is None:
        raise ConfigError(f"protocol 'single_source' needs --source (one of: {', '.join(domains)})")
    if source in targets:
        raise ConfigError(f"--target {source!r} is also the --source; choose other target domains")
    if not targets:
        targets = [d for d in domains if d != source]
    return [source], targets, None


@PROTOCOLS.register("all")
def _all(domains, targets, val_domain, source):
    _reject("--val-domain", val_domain, "all", "ltdo")
    _reject("--source", source, "all", "single_source")
    if targets:
        raise ConfigError(f"protocol 'all' trains on every domain and holds none out; drop --target "
                          f"{' '.join(targets)} (or use --protocol lodo to test on it)")
    return list(domains), [], None


def _check_names(dataset: DomainDataset, names: Sequence[str], option: str) -> None:
    for name in names:
        if name not in dataset.domains:
            valid = ", ".join(dataset.domains)
            raise ConfigError(f"{option} {name!r} is not a domain of {dataset.name}; choose from: {valid}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{option} lists a domain twice: {list(names)}")


def stratified_val_counts(class_counts: np.ndarray, val_fraction: float) -> np.ndarray:
    """Validation samples per class: ``round(f * n_c)`` (half up), at least 1 when ``n_c >= 2`` and
    ``f > 0``, and at most ``n_c - 1`` so that every class present keeps a training sample."""
    n = np.asarray(class_counts, dtype=np.int64)
    k = np.floor(val_fraction * n + 0.5).astype(np.int64)
    if val_fraction > 0:
        k = np.where(n >= 2, np.maximum(k, 1), k)
    return np.minimum(k, np.maximum(n - 1, 0))


def _domain_rng(seed: int, domain: str) -> np.random.Generator:
    # Keyed by the domain's name so its split does not depend on which other domains are sources.
    return np.random.default_rng([int(seed), zlib.crc32(domain.encode())])


def _stratified_split(labels: np.ndarray, num_classes: int, val_fraction: float, rng: np.random.Generator):
    """Seeded per-class train/val split of one domain; returns sorted (train, val) index arrays."""
    perm = rng.permutation(labels.shape[0])
    order = perm[np.argsort(labels[perm], kind="stable")]  # grouped by class, random within class
    counts = np.bincount(labels, minlength=num_classes)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sorted_labels = labels[order]
    rank_in_class = np.arange(order.shape[0]) - starts[sorted_labels]
    is_val = rank_in_class < stratified_val_counts(counts, val_fraction)[sorted_labels]
    return np.sort(order[~is_val]), np.sort(order[is_val])


def make_split(
    dataset: DomainDataset,
    protocol: str,
    targets: Sequence[str] = (),
    val_domain: str | None = None,
    source: str | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> Split:
    """Resolve ``protocol`` on ``dataset`` and split each source domain into train / validation.

    Args:
        targets: test domains (``lodo``: required, one or more; ``ltdo``: exactly one;
            ``single_source``: optional, default all domains but the source).
        val_domain: held-out validation domain (``ltdo`` only).
        source: the one source domain (``single_source`` only).
        val_fraction: in-domain validation fraction per source domain and class, in [0, 1).
        seed: seed of the train/validation split.
    """
    resolve = PROTOCOLS.get(protocol)
    targets = [targets] if isinstance(targets, str) else list(targets or ())
    _check_names(dataset, targets, "--target")
    _check_names(dataset, [d for d in (val_domain, source) if d is not None], "--val-domain/--source")
    if not (0.0 <= float(val_fraction) < 1.0):
        raise ConfigError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    sources, targets, val_domain = resolve(list(dataset.domains), targets, val_domain, source)
    if not sources:
        raise ConfigError(
            f"protocol {protocol!r} leaves no source domain of {dataset.name} for training; hold out fewer domains"
        )
    split = Split(sources, list(targets), val_domain, protocol=protocol)
    for d in sources:
        official = dataset.splits.get(d, {})
        if "train" in official:
            split.official.append(d)
        if "train" in official and "val" in official:
            split.train[d], split.val[d] = official["train"].clone(), official["val"].clone()
        else:
            pool = official["train"].numpy() if "train" in official else np.arange(dataset.size(d))
            labels = dataset.labels[d].detach().cpu().numpy()[pool]
            if labels.shape[0] == 0:
                where = "official train list" if "train" in official else "source domain"
                raise DataError(f"{dataset.name}/{d}: {where} has no samples; train on other domains")
            train, val = _stratified_split(labels, dataset.num_classes, float(val_fraction), _domain_rng(seed, d))
            split.train[d] = torch.from_numpy(pool[train]).long()
            split.val[d] = torch.from_numpy(pool[val]).long()
        if len(split.train[d]) == 0:
            raise DataError(f"{dataset.name}/{d}: source domain has no training samples")
    for d in split.targets + ([val_domain] if val_domain else []):
        official = dataset.splits.get(d, {})
        if "test" in official and d not in split.official:
            split.official.append(d)
        split.heldout[d] = official["test"].clone() if "test" in official else torch.arange(dataset.size(d))
        if len(split.heldout[d]) == 0:
            raise DataError(f"{dataset.name}/{d}: held-out domain has no samples to evaluate on")
    return split
