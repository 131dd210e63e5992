"""The dataset registry: every loadable dataset by name, with one ``load`` signature.

Built-in datasets (``digits4``, ``fashion4``) are generated offline; named folder benchmarks
(``pacs``, ``officehome``, ``vlcs``, ``domainnet``, ``digits_dg``), the generic ``folder`` and
``camelyon17`` (the WILDS layout) read ``data_root``. A name ``hf:OWNER/NAME`` (or ``hf:DIR``) is a
Hugging Face dataset, read from the Hugging Face cache (:mod:`fedstyle.data.hub`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from fedstyle.data.contract import DomainDataset
from fedstyle.data.folder import BENCHMARKS, FolderBenchmark, load_folder_benchmark
from fedstyle.errors import ConfigError, UnknownNameError
from fedstyle.registry import Registry


@dataclass(frozen=True)
class DatasetEntry:
    """A named dataset: ``load`` builds it on first use and returns the cached copy afterwards."""

    name: str
    description: str
    loader: Callable[..., DomainDataset]
    needs_data_root: bool = False
    #: whether the loader reads official split lists (it then takes ``official_splits``)
    has_official_splits: bool = False
    #: whether the loader decodes only a run's per-class pick (it then takes ``pick_per_class``)
    picks_per_class: bool = False
    #: the domain names when they are known before loading (None: read from the data); the CLI checks
    #: --target against them without loading anything
    domains: tuple[str, ...] | None = None

    def load(
        self,
        data_root: str | None = None,
        resolution: int | None = None,
        skip_bad_images: bool = False,
        seed: int = 0,
        progress: bool = True,
        official_splits: bool = True,
        per_class: int | None = None,
    ) -> DomainDataset:
        """Load the dataset; ``seed`` drives generated datasets, folder datasets ignore it;
        ``official_splits=False`` leaves the dataset's official split lists unread; ``per_class``: the
        dataset's :meth:`~DomainDataset.subset_per_class`, decoded alone where the loader can."""
        extra = {"official_splits": official_splits} if self.has_official_splits else {}
        if per_class is not None and self.picks_per_class:
            extra["pick_per_class"] = per_class
        dataset = self.loader(
            data_root=data_root,
            resolution=resolution,
            skip_bad_images=skip_bad_images,
            seed=seed,
            progress=progress,
            **extra,
        )
        if per_class is not None and not self.picks_per_class:
            dataset = dataset.subset_per_class(per_class)
        return dataset


def _lazy_loader(module: str, function: str) -> Callable[..., DomainDataset]:
    """Import a generator module (scipy, matplotlib, fonts ...) only when its dataset is loaded."""

    def load(**kwargs) -> DomainDataset:
        return getattr(importlib.import_module(module), function)(**kwargs)

    return load


def _folder_loader(benchmark: FolderBenchmark) -> Callable[..., DomainDataset]:
    def load(data_root=None, resolution=None, skip_bad_images=False, seed=0, progress=True,
             official_splits=True, pick_per_class=None) -> DomainDataset:
        return load_folder_benchmark(benchmark, data_root, resolution, skip_bad_images, progress, official_splits,
                                     pick_per_class)

    return load


DATASETS: Registry[DatasetEntry] = Registry("dataset")
DATASETS.add(
    "digits4",
    DatasetEntry(
        "digits4",
        "MNIST / MNIST-M / optdigits / synthetic font digits, 32 x 32, 10 classes (built offline)",
        _lazy_loader("fedstyle.data.digits4", "load_digits4"),
        domains=("mnist", "mnistm", "optdigits", "syn"),  # fedstyle.data.digits4.DOMAINS (a test keeps them equal)
    ),
)
DATASETS.add(
    "fashion4",
    DatasetEntry(
        "fashion4",
        "Fashion-MNIST rendered as photo / art / cartoon / sketch, 32 x 32, 10 classes "
        "(needs the Fashion-MNIST idx files: apt install dataset-fashion-mnist or --data-root)",
        _lazy_loader("fedstyle.data.fashion4", "load_fashion4"),
        picks_per_class=True,
        domains=("photo", "art", "cartoon", "sketch"),  # fedstyle.data.fashion4.DOMAINS (a test keeps them equal)
    ),
)
for _name, _benchmark in BENCHMARKS.items():
    DATASETS.add(_name, DatasetEntry(_name, _benchmark.description, _folder_loader(_benchmark), needs_data_root=True,
                                     has_official_splits=True, picks_per_class=True, domains=_benchmark.domains))
DATASETS.add(
    "camelyon17",
    DatasetEntry(
        "camelyon17",
        "Camelyon17-WILDS (Koh et al., 2021): 5 hospitals, tumour / normal 96 x 96 patches, official splits "
        "(--data-root: the WILDS root holding camelyon17_v1.0/)",
        _lazy_loader("fedstyle.data.camelyon", "load_camelyon17"),
        needs_data_root=True,
        has_official_splits=True,
    ),
)

HUB_PREFIX = "hf:"
#: options only a Hugging Face dataset takes (``load_dataset`` keywords; the CLI's --domain-column ...)
COLUMN_OPTIONS = ("image_column", "domain_column", "label_column")


def load_dataset(name: str, **kwargs) -> DomainDataset:
    """``DATASETS.get(name).load(**kwargs)``; ``hf:OWNER/NAME`` (or ``hf:DIR``) loads a Hugging Face dataset,
    with ``image_column`` / ``domain_column`` / ``label_column`` naming its columns (see :mod:`fedstyle.data.hub`)."""
    if name.startswith(HUB_PREFIX):
        from fedstyle.data.hub import load_hub_dataset

        per_class = kwargs.pop("per_class", None)
        dataset = load_hub_dataset(name[len(HUB_PREFIX):], **kwargs)
        return dataset if per_class is None else dataset.subset_per_class(per_class)
    given = [option for option in COLUMN_OPTIONS if kwargs.pop(option, None) is not None]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} names a column of a Hugging Face dataset "
                          f"(--dataset hf:OWNER/NAME); {name} has no columns: drop it")
    if name not in DATASETS:
        raise UnknownNameError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS.names())}; "
                               "or hf:OWNER/NAME for a Hugging Face dataset")
    return DATASETS.get(name).load(**kwargs)
