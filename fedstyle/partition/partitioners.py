"""Client partitioners: how the training indices of a :class:`Split` are dealt to FL clients.

Every partitioner is disjoint and complete with respect to ``split.train``: each training index
lands in exactly one client. A partitioner computes, for each group of samples (a source domain,
or a class for ``label_dirichlet``), how many samples each client receives; the group's indices are
then shuffled with the seeded generator and sliced sequentially in client order.

* ``domain``: one client per source domain (CCST, StyleDDG; StableFDG Appendix C).
* ``per_domain``: ``num_clients / D`` single-domain clients per source domain, each domain split
  evenly at random (StableFDG's single-domain setting: 30 clients, 10 per domain).
* ``dirichlet``: per source domain, proportions over all clients ~ Dirichlet(alpha) (StableFDG's
  multi-domain setting: 30 clients, alpha = 0.5).
* ``lambda``: domain-based heterogeneity lambda of Bai et al. (ICLR'24), used by PARDON.
* ``label_dirichlet``: one source domain, per class proportions ~ Dirichlet(alpha) (FedGCA:
  10 clients, alpha = 0.3).

``copies`` = K > 1 (``--data-copies``) deals K copies of every training index instead of one: each
source domain's indices are repeated K times before the partitioner counts and the shuffle deals
them, so every partitioner works unchanged on K times the samples. Each index then lands in
exactly K client slots — in up to K clients, possibly twice in one — which is resampling with
replacement across clients (for thousands of clients on a small dataset); K = 1 is the disjoint
partition above, bit for bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.errors import ConfigError, brief
from fedstyle.partition.protocols import Split
from fedstyle.registry import Registry

MAX_DIRICHLET_DRAWS = 100
DEFAULT_MIN_SIZE = 10  # a client must fill at least a few mini-batches; small enough for tiny datasets


@dataclass
class ClientSpec:
    """The data of one client: source domain -> sorted int64 indices into ``dataset.labels[domain]``
    (a subset of ``split.train[domain]``). Domains the client holds no sample of are left out."""

    indices: dict[str, torch.Tensor]

    @property
    def size(self) -> int:
        return sum(int(t.numel()) for t in self.indices.values())

    @property
    def domains(self) -> list[str]:
        return [d for d, t in self.indices.items() if t.numel() > 0]

    def domain_counts(self) -> dict[str, int]:
        return {d: int(t.numel()) for d, t in self.indices.items() if t.numel() > 0}


@dataclass(frozen=True)
class PartitionParams:
    """Options shared by the partitioners; each uses only the ones it needs."""

    num_clients: int | None = None
    alpha: float = 0.5
    lam: float = 0.1
    min_size: int = DEFAULT_MIN_SIZE


@dataclass
class _Group:
    """Samples dealt out together: ``indices`` (into ``domain``) are shuffled, then sliced."""

    domain: str
    indices: np.ndarray


# A partitioner returns the groups and a (clients x groups) matrix of sample counts.
Partitioner = Callable[[Split, DomainDataset, PartitionParams, np.random.Generator], tuple[list[_Group], np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partitioner")


def _domain_groups(split: Split) -> list[_Group]:
    return [_Group(d, split.train[d].detach().cpu().numpy()) for d in split.sources]


def _require_clients(name: str, params: PartitionParams) -> int:
    if params.num_clients is None:
        raise ConfigError(f"partitioner {name!r} needs --clients (the number of clients)")
    return params.num_clients


def _require_alpha(name: str, alpha: float) -> None:
    if not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"partitioner {name!r} needs --alpha > 0 (Dirichlet concentration), got {alpha}")


@PARTITIONERS.register("domain")
def _domain_partition(split, dataset, params, rng):
    groups = _domain_groups(split)
    if params.num_clients not in (None, len(groups)):
        raise ConfigError(
            f"partitioner 'domain' makes one client per source domain ({len(groups)}: {', '.join(split.sources)}), "
            f"but --clients is {params.num_clients}; drop --clients or use --partition per_domain/dirichlet/lambda"
        )
    return groups, np.diag([len(g.indices) for g in groups]).astype(np.int64)


@PARTITIONERS.register("per_domain")
def _per_domain_partition(split, dataset, params, rng):
    groups = _domain_groups(split)
    num_clients, num_domains = _require_clients("per_domain", params), len(groups)
    if num_clients % num_domains:
        raise ConfigError(
            f"partitioner 'per_domain' splits each of the {num_domains} source domains into the same number of "
            f"clients, so --clients must be a multiple of {num_domains}, got {num_clients}"
        )
    per = num_clients // num_domains
    counts = np.zeros((num_clients, num_domains), dtype=np.int64)
    for j, g in enumerate(groups):
        n = len(g.indices)
        counts[j * per : (j + 1) * per, j] = n // per + (np.arange(per) < n % per)
    return groups, counts


def dirichlet_counts(
    group_sizes: Sequence[int], num_clients: int, alpha: float, min_size: int, rng: np.random.Generator, what: str
) -> np.ndarray:
    """(clients x groups) counts: each group's samples split by proportions ~ Dirichlet(alpha · 1_C).

    A draw whose smallest client has fewer than ``min_size`` samples is redrawn from the same
    generator, at most ``MAX_DIRICHLET_DRAWS`` times.
    """
    sizes = np.asarray(group_sizes, dtype=np.int64)
    fix = (
        f"raise --alpha (now {alpha}), lower --clients (now {num_clients}), "
        f"lower --min-client-size (now {min_size}) or deal copies of the samples with --data-copies"
    )
    if sizes.sum() < num_clients * min_size:
        raise ConfigError(
            f"{what}: {sizes.sum()} training samples cannot give {num_clients} clients {min_size} each; {fix}"
        )
    smallest = 0
    for _ in range(MAX_DIRICHLET_DRAWS):
        proportions = rng.dirichlet(np.full(num_clients, float(alpha)), size=len(sizes))  # groups x clients
        if not np.isfinite(proportions).all():
            continue
        # Cut points of each group's shuffled indices; the last one pinned to the group size.
        cuts = np.floor(np.cumsum(proportions, axis=1) * sizes[:, None]).astype(np.int64)
        cuts = np.minimum(cuts, sizes[:, None])
        cuts[:, -1] = sizes
        counts = np.diff(cuts, axis=1, prepend=0).T
        smallest = int(counts.sum(axis=1).min())
        if smallest >= min_size:
            return counts
    raise ConfigError(
        f"{what}: no Dirichlet(alpha={alpha}) draw in {MAX_DIRICHLET_DRAWS} gave every client at least {min_size} "
        f"samples (last draw's smallest client: {smallest}); {fix}"
    )


@PARTITIONERS.register("dirichlet")
def _dirichlet_partition(split, dataset, params, rng):
    groups = _domain_groups(split)
    num_clients = _require_clients("dirichlet", params)
    _require_alpha("dirichlet", params.alpha)
    sizes = [len(g.indices) for g in groups]
    what = "partitioner 'dirichlet' (per source domain)"
    return groups, dirichlet_counts(sizes, num_clients, params.alpha, params.min_size, rng, what)


@PARTITIONERS.register("label_dirichlet")
def _label_dirichlet_partition(split, dataset, params, rng):
    if len(split.sources) != 1:
        raise ConfigError(
            f"partitioner 'label_dirichlet' skews labels inside ONE source domain, but the split has "
            f"{len(split.sources)} ({', '.join(split.sources)}); use --protocol single_source --source DOMAIN"
        )
    num_clients = _require_clients("label_dirichlet", params)
    _require_alpha("label_dirichlet", params.alpha)
    (domain,) = split.sources
    train = split.train[domain].detach().cpu().numpy()
    labels = dataset.labels[domain].detach().cpu().numpy()[train]
    groups = [_Group(domain, train[labels == c]) for c in np.unique(labels)]
    sizes = [len(g.indices) for g in groups]
    what = "partitioner 'label_dirichlet' (per class)"
    return groups, dirichlet_counts(sizes, num_clients, params.alpha, params.min_size, rng, what)


def lambda_counts(domain_sizes: Sequence[int], num_clients: int, lam: float) -> np.ndarray:
    """(clients x domains) counts of Bai et al.'s domain-heterogeneity lambda (FedDG benchmark, ICLR'24).

    C >= D: every domain gets one main client, each further client goes to the domain with the
    largest N_d / S_d (ties: first domain); clients are ordered by main domain, and client i with
    main domain d_i receives n_{i,d} = N_d · [(1 − lambda) · 1{d = d_i} / S_d + lambda / C].
    C < D: whole domains go to the currently smallest client (largest domain first), then
    n_{i,d} = lambda · N_d / C + (1 − lambda) · greedy_{i,d}.
    Counts are floored and each domain's remainder goes, one each, to the first clients with a
    positive share of it. (The public code gives it to the first clients regardless, which puts
    other domains' samples into lambda = 0 clients; here lambda = 0 stays single-domain.)
    """
    sizes = np.asarray(domain_sizes, dtype=np.int64)
    num_domains, n = len(sizes), sizes.astype(np.float64)
    if num_clients >= num_domains:
        clients_per_domain = np.ones(num_domains, dtype=np.int64)
        for _ in range(num_clients - num_domains):
            clients_per_domain[np.argmax(n / clients_per_domain)] += 1
        main_domain = np.repeat(np.arange(num_domains), clients_per_domain)
        is_main = main_domain[:, None] == np.arange(num_domains)[None, :]
        share = n * ((1.0 - lam) * is_main / clients_per_domain + lam / num_clients)
    else:
        greedy = np.zeros((num_clients, num_domains))
        for d in np.argsort(-sizes, kind="stable"):
            greedy[np.argmin(greedy.sum(axis=1)), d] = n[d]
        share = lam * n / num_clients + (1.0 - lam) * greedy
    # The tolerance keeps exact integers (e.g. 60 · 0.5/3 = 10) from flooring to one less.
    counts = np.floor(share + 1e-9).astype(np.int64)
    for d in range(num_domains):
        if counts[:, d].sum() > sizes[d]:  # only if a share lies within 1e-9 below an integer
            counts[:, d] = np.floor(share[:, d]).astype(np.int64)
        eligible = np.flatnonzero(share[:, d] > 0)
        counts[eligible[: sizes[d] - counts[:, d].sum()], d] += 1
    return counts


@PARTITIONERS.register("lambda")
def _lambda_partition(split, dataset, params, rng):
    groups = _domain_groups(split)
    num_clients = _require_clients("lambda", params)
    if not (0.0 <= params.lam <= 1.0):
        raise ConfigError(
            f"partitioner 'lambda' needs --lam in [0, 1] (0: single-domain clients, 1: same mixture), got {params.lam}"
        )
    return groups, lambda_counts([len(g.indices) for g in groups], num_clients, params.lam)


def _deal(groups: list[_Group], counts: np.ndarray, rng: np.random.Generator) -> list[ClientSpec]:
    """Shuffle each group's indices and slice them sequentially by ``counts[:, group]``."""
    pieces: list[dict[str, list[np.ndarray]]] = [{} for _ in range(counts.shape[0])]
    for j, group in enumerate(groups):
        shuffled = rng.permutation(group.indices)
        for i, part in enumerate(np.split(shuffled, np.cumsum(counts[:, j])[:-1])):
            if len(part):
                pieces[i].setdefault(group.domain, []).append(part)
    domain_order = list(dict.fromkeys(g.domain for g in groups))
    return [
        ClientSpec({d: torch.from_numpy(np.sort(np.concatenate(p[d]))).long() for d in domain_order if d in p})
        for p in pieces
    ]


def make_partition(
    name: str,
    split: Split,
    dataset: DomainDataset,
    num_clients: int | None = None,
    alpha: float = 0.5,
    lam: float = 0.1,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = 0,
    copies: int = 1,
) -> list[ClientSpec]:
    """Deal ``split.train`` to clients with the partitioner ``name`` (see :data:`PARTITIONERS`).

    Args:
        num_clients: number of clients (``domain``: optional, must equal the number of sources).
        alpha: Dirichlet concentration (``dirichlet``, ``label_dirichlet``).
        lam: Bai et al.'s heterogeneity in [0, 1] (``lambda``).
        min_size: smallest allowed client for the Dirichlet partitioners (redrawn otherwise);
            every partitioner rejects empty clients.
        seed: seed of the Dirichlet draws and of the shuffles.
        copies: how many copies of every training index are dealt (see the module docstring).

    Raises:
        ConfigError: unknown name, invalid option, or a partition that would leave a client empty.
    """
    partitioner = PARTITIONERS.get(name)
    if num_clients is not None:
        if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
            raise ConfigError(f"--clients must be a positive integer, got {num_clients}")
    if int(min_size) != min_size or min_size < 1:
        raise ConfigError(f"--min-client-size must be a positive integer, got {min_size}")
    for d in split.sources:
        if d not in split.train or split.train[d].numel() == 0:
            raise ConfigError(f"source domain {d!r} has no training samples; lower --val-fraction or drop the domain")
    if isinstance(copies, bool) or int(copies) != copies or copies < 1:
        raise ConfigError(f"--data-copies must be a positive integer, got {copies}")
    if copies > 1:
        split = dataclasses.replace(split, train={d: idx.repeat(int(copies)) for d, idx in split.train.items()})
    params = PartitionParams(None if num_clients is None else int(num_clients), float(alpha), float(lam), int(min_size))
    rng = np.random.default_rng(seed)
    groups, counts = partitioner(split, dataset, params, rng)
    sizes = counts.sum(axis=1)
    if (sizes == 0).any():
        empty = np.flatnonzero(sizes == 0).tolist()
        raise ConfigError(
            f"partitioner {name!r} leaves client(s) {brief(empty)} of {len(sizes)} without samples "
            f"({int(sizes.sum())} training samples); use fewer --clients or more --data-copies"
            + (" or a larger --lam" if name == "lambda" else "")
        )
    return _deal(groups, counts, rng)
