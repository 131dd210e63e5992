"""Shared fixtures: an isolated dataset cache and a tiny four-domain folder dataset."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

TINY_DOMAINS = ("red", "green", "blue", "grey")
TINY_CLASSES = ("bar", "dot", "cross")
TINY_PER_CLASS = 12
TINY_SIZE = 16


@pytest.fixture(scope="session", autouse=True)
def one_thread_per_worker():
    """Under pytest-xdist (``-n 2``) each worker trains on one thread, so two workers fill two cores
    instead of four threads contending for them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        # processes a test starts (a run killed mid-write, a CLI run) must train with the same thread count
        # as the test's in-process reference, or their float sums differ
        os.environ["OMP_NUM_THREADS"] = "1"
    yield


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Every test writes dataset caches into a temporary folder, never the user's cache."""
    path = tmp_path_factory.mktemp("fedstyle-cache")
    old = os.environ.get("FEDSTYLE_CACHE")
    os.environ["FEDSTYLE_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("FEDSTYLE_CACHE", None)
    else:
        os.environ["FEDSTYLE_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def isolated_site_state(tmp_path_factory):
    """Flower sites started without a state folder (the in-process ClientApp tests) keep their clients'
    state in a temporary folder, never the user's state folder."""
    path = tmp_path_factory.mktemp("fedstyle-site-state")
    old = os.environ.get("FEDSTYLE_SITE_STATE")
    os.environ["FEDSTYLE_SITE_STATE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("FEDSTYLE_SITE_STATE", None)
    else:
        os.environ["FEDSTYLE_SITE_STATE"] = old


def _draw(shape: str, tint: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    img = np.full((TINY_SIZE, TINY_SIZE, 3), 30, dtype=np.float32)
    c = TINY_SIZE // 2 + rng.integers(-2, 3)
    if shape == "bar":
        img[2:-2, c - 2 : c + 2] = 220
    elif shape == "dot":
        img[c - 3 : c + 3, c - 3 : c + 3] = 220
    else:
        img[c - 1 : c + 1, 2:-2] = 220
        img[2:-2, c - 1 : c + 1] = 220
    img = img * tint + rng.normal(0, 12, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """root/<domain>/<class>/<i>.png: 4 domains (colour tints) x 3 shape classes x 12 images of 16x16."""
    root = tmp_path_factory.mktemp("tiny4")
    tints = {"red": (1.0, 0.3, 0.3), "green": (0.3, 1.0, 0.3), "blue": (0.3, 0.3, 1.0), "grey": (0.8, 0.8, 0.8)}
    rng = np.random.default_rng(0)
    for domain in TINY_DOMAINS:
        for cls in TINY_CLASSES:
            folder = root / domain / cls
            folder.mkdir(parents=True)
            for i in range(TINY_PER_CLASS):
                Image.fromarray(_draw(cls, np.asarray(tints[domain]), rng)).save(folder / f"{i}.png")
    return root


@pytest.fixture
def tiny_config(tiny_root):
    """A RunConfig that trains in about a second on the tiny dataset."""
    from fedstyle.experiments.config import RunConfig

    return RunConfig(dataset="folder", data_root=str(tiny_root), resolution=TINY_SIZE, targets=["grey"],
                     rounds=2, batch_size=8, local_steps=2, lr=0.05, min_client_size=2, device="cpu")
