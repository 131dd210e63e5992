"""Datasets of fedstyle: one multi-domain contract, decoded once and memory-mapped from a cache."""

from fedstyle.data.cache import cache_dir
from fedstyle.data.client import ClientData, SamplePool
from fedstyle.data.contract import DomainDataset
from fedstyle.data.registry import DATASETS, load_dataset
from fedstyle.data.show import save_grid
from fedstyle.data.transforms import AUGMENTATIONS, BatchTransform

__all__ = ["AUGMENTATIONS", "DATASETS", "BatchTransform", "ClientData", "DomainDataset", "SamplePool", "cache_dir", "load_dataset", "save_grid"]
