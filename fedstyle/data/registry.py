"""The dataset registry: every loadable dataset by name, with one ``load`` signature.

Built-in datasets (``digits4``, ``fashion4``) are generated offline; named folder benchmarks
(``pacs``, ``officehome``, ``vlcs``, ``domainnet``, ``digits_dg``), the generic ``folder`` and
``camelyon17`` (the WILDS layout) read ``data_root``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from fedstyle.data.contract import DomainDataset
from fedstyle.data.folder import BENCHMARKS, FolderBenchmark, load_folder_benchmark
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

    def load(
        self,
        data_root: str | None = None,
        resolution: int | None = None,
        skip_bad_images: bool = False,
        seed: int = 0,
        progress: bool = True,
        official_splits: bool = True,
    ) -> DomainDataset:
        """Load the dataset; ``seed`` drives generated datasets, folder datasets ignore it;
        ``official_splits=False`` leaves the dataset's official split lists unread."""
        extra = {"official_splits": official_splits} if self.has_official_splits else {}
        return self.loader(
            data_root=data_root,
            resolution=resolution,
            skip_bad_images=skip_bad_images,
            seed=seed,
            progress=progress,
            **extra,
        )


def _lazy_loader(module: str, function: str) -> Callable[..., DomainDataset]:
    """Import a generator module (scipy, matplotlib, fonts ...) only when its dataset is loaded."""

    def load(**kwargs) -> DomainDataset:
        return getattr(importlib.import_module(module), function)(**kwargs)

    return load


def _folder_loader(benchmark: FolderBenchmark) -> Callable[..., DomainDataset]:
    def load(data_root=None, resolution=None, skip_bad_images=False, seed=0, progress=True,
             official_splits=True) -> DomainDataset:
        return load_folder_benchmark(benchmark, data_root, resolution, skip_bad_images, progress, official_splits)

    return load


DATASETS: Registry[DatasetEntry] = Registry("dataset")
DATASETS.add(
    "digits4",
    DatasetEntry(
        "digits4",
        "MNIST / MNIST-M / optdigits / synthetic font digits, 32 x 32, 10 classes (built offline)",
        _lazy_loader("fedstyle.data.digits4", "load_digits4"),
    ),
)
DATASETS.add(
    "fashion4",
    DatasetEntry(
        "fashion4",
        "Fashion-MNIST rendered as photo / art / cartoon / sketch, 32 x 32, 10 classes "
        "(needs the Fashion-MNIST idx files: apt install dataset-fashion-mnist or --data-root)",
        _lazy_loader("fedstyle.data.fashion4", "load_fashion4"),
    ),
)
for _name, _benchmark in BENCHMARKS.items():
    DATASETS.add(_name, DatasetEntry(_name, _benchmark.description, _folder_loader(_benchmark), needs_data_root=True,
                                     has_official_splits=True))
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


def load_dataset(name: str, **kwargs) -> DomainDataset:
    """``DATASETS.get(name).load(**kwargs)``."""
    return DATASETS.get(name).load(**kwargs)
