"""Tiny Hugging Face datasets on disk, offline (not collected): parquet files with flwrlabs/pacs's schema, put
where ``datasets.load_dataset(NAME)`` finds them with no network.

Two places a Hub dataset lives after it was fetched once, both reproduced here in their real layout:

* the datasets cache (``HF_DATASETS_CACHE``): ``OWNER___NAME/default/0.0.0/<hash>/`` holding
  ``dataset_info.json`` and ``NAME-<split>.arrow``, what an online ``load_dataset(NAME)`` leaves; offline,
  ``load_dataset(NAME)`` reads it through its ``CachedDatasetModuleFactory``;
* the hub cache (``HF_HUB_CACHE``): ``datasets--OWNER--NAME/snapshots/<commit>/data/*.parquet`` with
  ``refs/main``, what ``hf download NAME --repo-type dataset`` leaves.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


def offline_hf(monkeypatch, home: Path) -> None:
    """Point the Hugging Face libraries at an empty cache under ``home`` and forbid the network.

    The environment is set for processes a test starts; the libraries' module constants (read once, at
    import) are patched for this process.
    """
    import datasets
    import huggingface_hub.constants as hub_constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(home / "hub"))


def encode(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def tiny_pacs_rows(per_class: int = 2, size: int = 12, seed: int = 0) -> list[dict]:
    """Rows of a tiny PACS: every domain x class, ``per_class`` images, PNG and JPEG alternating; file names
    ``<domain>_<class>_<k>.png|jpg`` (unique, so a folder tree can hold the same files)."""
    rng = np.random.default_rng(seed)
    rows = []
    for d, domain in enumerate(PACS_DOMAINS):
        for c, name in enumerate(PACS_CLASSES):
            for k in range(per_class):
                pixels = np.clip(rng.normal(40 + 50 * d, 20, (size, size, 3)) + 10 * c, 0, 255).astype(np.uint8)
                fmt, suffix = ("PNG", "png") if (c + k) % 2 == 0 else ("JPEG", "jpg")
                rows.append({"image": {"bytes": encode(pixels, fmt), "path": f"{domain}_{name}_{k}.{suffix}"},
                             "domain": domain, "label": c})
    return rows


def pacs_features(classes=PACS_CLASSES, label_as="class_label"):
    from datasets import ClassLabel, Features, Image as HFImage, Value

    label = ClassLabel(names=list(classes)) if label_as == "class_label" else Value(label_as)
    return Features({"image": HFImage(), "domain": Value("string"), "label": label})


def write_parquet(folder: Path, splits: dict[str, list[dict]], features=None) -> dict[str, Path]:
    """``folder/data/<split>-00000-of-00001.parquet`` per split, the Hub's file naming; returns the files."""
    import datasets

    features = features or pacs_features()
    (folder / "data").mkdir(parents=True, exist_ok=True)
    files = {}
    for split, rows in splits.items():
        columns = {name: [row[name] for row in rows] for name in features}
        files[split] = folder / "data" / f"{split}-00000-of-00001.parquet"
        datasets.Dataset.from_dict(columns, features=features).to_parquet(str(files[split]))
    return files


def cache_as_hub(repo: str, files: dict[str, Path], config_hash: str = "0123456789abcdef") -> Path:
    """Put ``files`` (split -> parquet) in the datasets cache as an online ``load_dataset(repo)`` would."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    owner, name = repo.split("/")
    with tempfile.TemporaryDirectory() as scratch:
        # small record batches: the table has many chunks, as a real dataset's has
        builder = Parquet(cache_dir=scratch, dataset_name=name, config_name="default", hash=config_hash,
                          data_files={split: [str(path)] for split, path in files.items()}, writer_batch_size=5)
        builder.download_and_prepare()
        target = Path(datasets.config.HF_DATASETS_CACHE) / f"{owner}___{name}" / "default" / "0.0.0" / config_hash
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(builder.cache_dir, target)
    return target


def snapshot_as_hub(repo: str, files: dict[str, Path], commit: str = "a" * 40) -> Path:
    """Put ``files`` in the hub cache as ``hf download repo --repo-type dataset`` would."""
    import huggingface_hub.constants as hub_constants

    root = Path(hub_constants.HF_HUB_CACHE) / ("datasets--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit / "data"
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for path in files.values():
        shutil.copy(path, snapshot / path.name)
    return snapshot.parent


def write_folder(root: Path, rows: list[dict]) -> Path:
    """The same rows as an image-folder tree ``root/<domain>/<class>/<file>``."""
    for row in rows:
        folder = root / row["domain"] / PACS_CLASSES[row["label"]]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / row["image"]["path"]).write_bytes(row["image"]["bytes"])
    return root
