"""Hugging Face datasets as fedstyle datasets: ``--dataset hf:OWNER/NAME`` (``pip install 'fedstyle[hf]'``).

Any image dataset on the Hub with an image column, a domain-like column and a label column loads as a
:class:`~fedstyle.data.contract.DomainDataset`: one domain per value of the domain column, classes from the
label column (a ``ClassLabel``'s names in its order, else the sorted values), and every split of the
dataset pooled. Flower's FedDG sets have known columns and map onto fedstyle's folder benchmarks (same
domain names, classes, resolution and normalisation): ``flwrlabs/pacs`` is ``pacs`` and
``flwrlabs/office-home`` is ``officehome``. A copy of either under another name (``hf:DIR``, a local
folder; or a mirror on the Hub) is recognised by its schema (:func:`recognise_benchmark`): the default
columns, the benchmark's domains (ignoring case, spaces, ``-`` and ``_``, so ``Real World`` is
``Real_World``) and its classes. Other datasets name their columns with ``image_column`` /
``domain_column`` / ``label_column`` (CLI ``--image-column`` ...; defaults ``image``, ``domain``, ``label``).

Where the data comes from is the ``datasets`` library's business, so its cache and offline mode hold:
``datasets.load_dataset(NAME)`` reads ``HF_DATASETS_CACHE`` (under ``HF_HOME``) and, with ``HF_HUB_OFFLINE=1``
(or ``HF_DATASETS_OFFLINE=1``), never touches the network and takes the cached copy. Offline, a dataset that
is only in the hub cache (``hf download NAME --repo-type dataset`` fills ``HF_HUB_CACHE``) is read from that
snapshot. ``hf:DIR`` reads a local folder of data files or a ``save_to_disk`` folder. Without
offline mode, one connection to the Hub's host (3 s at most) comes first: where it fails, the load runs
offline at once (cache or snapshot), since the library would retry every request with back-off for about
26 s before reading the same cache. Behind a proxy (``HTTPS_PROXY``, ``ALL_PROXY``) the probe is skipped.

Images are decoded once into fedstyle's uint8 cache like every folder dataset (the same decoder: RGB,
antialiased bilinear resize to ``resolution``), keyed by the Hugging Face fingerprint of every split (the
cached version's identity) and the columns. Within a domain, images are ordered by (label, file name in the
image's ``path``, split, row), the order of the folder layout when paths are file names. A dataset with
several splits (``train``, ``validation``/``val``/``valid``, ``test``) carries them as official splits.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import torch

from fedstyle.data.cache import ArrayWriter, DecodedArrays, cached_dataset
from fedstyle.data.contract import DomainDataset, check_build_options
from fedstyle.data.folder import (BENCHMARKS, IMAGENET_MEAN, IMAGENET_STD, check_no_class_emptied, check_skipped,
                                  decode_domain)
from fedstyle.errors import ConfigError, DataError

RECIPE_VERSION = 1
INSTALL_HINT = "pip install -c constraints.txt 'fedstyle[hf]' (the Hugging Face datasets library)"
#: a Hub split's role among fedstyle's official splits
SPLIT_ROLES = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}
REPO_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


@dataclass(frozen=True)
class HubDefaults:
    """A known Hub dataset: the folder benchmark it is (domains, classes, statistics) and its columns."""

    benchmark: str
    image: str = "image"
    domain: str = "domain"
    label: str = "label"


KNOWN_DATASETS = {
    "flwrlabs/pacs": HubDefaults("pacs"),
    "flwrlabs/office-home": HubDefaults("officehome"),
}


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"--dataset hf:... needs {INSTALL_HINT}") from None
    return datasets


@contextlib.contextmanager
def _quiet(datasets, progress: bool):
    """Without progress, silence the library's bars and notes ("Using the latest cached version ...")."""
    if progress:
        yield
        return
    verbosity, bars_off = datasets.logging.get_verbosity(), datasets.are_progress_bars_disabled()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if not bars_off:
            datasets.enable_progress_bars()


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _cached_snapshot(repo: str) -> str | None:
    """The hub-cache snapshot folder of dataset ``repo`` (``hf download``), or None; never downloads."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=repo, repo_type="dataset", local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and its kin: not cached
        return None


PROBE_SECONDS = 3.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable(endpoint: str, seconds: float = PROBE_SECONDS) -> str | None:
    """Why the Hub at ``endpoint`` cannot be reached (its host does not resolve, or refuses or ignores a
    connection within ``seconds``), or None when a connection opens or a proxy is set (a proxy reaches
    hosts this machine cannot, so a direct connection says nothing)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    parts = urlsplit(endpoint)
    if not parts.hostname:
        return None  # not a URL this probe understands: let the library try
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((parts.hostname, port), timeout=seconds).close()
    except OSError as err:  # gaierror (no such host), refused, timed out
        return f"{parts.hostname}:{port}: {_one_line(err) or type(err).__name__}"
    return None


@contextlib.contextmanager
def _offline(datasets):
    """Offline mode for this load only: the two libraries read these module constants at call time."""
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _load_named(datasets, repo: str):
    """``load_dataset(repo)``; offline at once where the Hub is unreachable; the hub-cache snapshot last."""
    from huggingface_hub import constants

    unreachable = None if datasets.config.HF_HUB_OFFLINE else hub_unreachable(constants.ENDPOINT)
    try:
        with _offline(datasets) if unreachable else contextlib.nullcontext():
            return datasets.load_dataset(repo)
    except (ConnectionError, FileNotFoundError) as err:
        snapshot = _cached_snapshot(repo)
        if snapshot is None:
            raise DataError(_not_found(datasets, repo, err, unreachable)) from None
        return datasets.load_dataset(snapshot)


def open_hub_dataset(repo: str, progress: bool = True):
    """The ``DatasetDict`` of ``repo`` (Hub name or local folder) through the library's cache and offline mode."""
    datasets = _import_datasets()
    folder = Path(repo).expanduser()
    with _quiet(datasets, progress):
        if folder.is_dir():
            saved = (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()
            try:
                loaded = datasets.load_from_disk(str(folder)) if saved else datasets.load_dataset(str(folder))
            except (ValueError, IndexError) as err:  # what the library raises for a folder with no rows
                raise DataError(_unreadable_folder(repo, err)) from None
        else:
            if not REPO_NAME.match(repo):
                raise ConfigError(f"--dataset hf:{repo}: give hf:OWNER/NAME (a Hugging Face dataset, e.g. "
                                  "hf:flwrlabs/pacs) or hf:DIR (an existing local folder)")
            loaded = _load_named(datasets, repo)
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    if not sum(len(split) for split in loaded.values()):
        raise DataError(f"hf:{repo} has no rows (splits: {', '.join(loaded) or 'none'}); give a dataset with images")
    return loaded


def _unreadable_folder(repo: str, err: BaseException) -> str:
    """One line for a local folder ``datasets`` cannot load: no rows ("Instruction 'train' corresponds to no
    data!", or an IndexError from an empty ``save_to_disk``), or another fault in its files."""
    if isinstance(err, IndexError) or "corresponds to no data" in str(err):
        return f"hf:{repo} has no rows (its data files are empty); give a folder whose data files hold images"
    return (f"hf:{repo} cannot be read by the datasets library ({_one_line(err)}); give a folder of data files "
            "(parquet, arrow, an imagefolder) or one written by save_to_disk")


def _not_found(datasets, repo: str, err: BaseException, unreachable: str | None = None) -> str:
    cache = datasets.config.HF_DATASETS_CACHE
    if unreachable:
        return (f"cannot reach the Hugging Face Hub for hf:{repo} ({unreachable}) and it is not in the cache "
                f"({cache}); check the network (or HF_ENDPOINT, or HTTPS_PROXY), or copy a cache holding it and "
                "point HF_HOME at it")
    if datasets.config.HF_HUB_OFFLINE:
        return (f"hf:{repo} is not in the Hugging Face cache ({cache}) and offline mode is on (HF_HUB_OFFLINE / "
                f"HF_DATASETS_OFFLINE); load it once with the network (unset both and rerun, or run `hf download "
                f"{repo} --repo-type dataset`), or point HF_HOME / HF_DATASETS_CACHE at the cache that holds it")
    if isinstance(err, ConnectionError):
        return (f"cannot reach the Hugging Face Hub for hf:{repo} ({_one_line(err)}) and it is not in the cache "
                f"({cache}); check the network (or HF_ENDPOINT), or copy a cache holding it and set HF_HUB_OFFLINE=1")
    return (f"hf:{repo} was not found on the Hugging Face Hub ({_one_line(err)}); check OWNER/NAME on "
            "huggingface.co/datasets, or log in (`hf auth login`) for a gated or private dataset")


# ----------------------------------------------------------------------------- columns


def _feature_kind(feature) -> str:
    name = type(feature).__name__
    if name == "Value":
        if feature.dtype in ("string", "large_string"):
            return "string"
        return "int" if "int" in feature.dtype else feature.dtype
    return name


def _column(dataset, name: str, option: str, where: str):
    if name not in dataset.column_names:
        raise DataError(f"{where} has no column {name!r} (columns: {', '.join(dataset.column_names)}); "
                        f"pass {option} NAME")
    return dataset.features[name]


def _values(dataset, name: str, feature, option: str, where: str) -> list:
    """A domain or label column as Python values (``ClassLabel`` ids stay ints)."""
    kind = _feature_kind(feature)
    if kind not in ("string", "int", "ClassLabel"):
        raise DataError(f"{where}: column {name!r} is {kind}, not strings, integers or a ClassLabel; pass {option} "
                        "NAME of such a column")
    values = dataset.data.column(name).to_pylist()
    if any(v is None for v in values):
        raise DataError(f"{where}: column {name!r} has empty rows; fill or filter them out, or pass {option} NAME")
    return values


@dataclass
class HubRows:
    """Every row of a dataset's splits: where it is, its domain, label and image file name."""

    splits: list[str]
    split_of: np.ndarray
    row: np.ndarray
    domain: list[str]
    label: np.ndarray
    name: list[str]
    classes: list[str]


def read_rows(data, columns: dict[str, str], where: str) -> HubRows:
    """Domain, label and image file name of every row of ``data``'s splits (no image is decoded)."""
    split_of, row, domain, label, name, classes = [], [], [], [], [], None
    for index, (split, dataset) in enumerate(data.items()):
        if getattr(dataset, "_indices", None) is not None:
            dataset = dataset.flatten_indices()
        image_feature = _column(dataset, columns["image"], "--image-column", where)
        if _feature_kind(image_feature) != "Image":
            raise DataError(f"{where}: column {columns['image']!r} is {_feature_kind(image_feature)}, not an Image; "
                            "pass --image-column NAME of the image column")
        domain_feature = _column(dataset, columns["domain"], "--domain-column", where)
        label_feature = _column(dataset, columns["label"], "--label-column", where)
        domains = _values(dataset, columns["domain"], domain_feature, "--domain-column", where)
        if _feature_kind(domain_feature) == "ClassLabel":
            domains = [domain_feature.names[v] for v in domains]
        labels = _values(dataset, columns["label"], label_feature, "--label-column", where)
        if _feature_kind(label_feature) == "ClassLabel":
            if classes is not None and classes != list(label_feature.names):
                raise DataError(f"{where}: split {split!r} names its classes differently; use one split or fix the "
                                "dataset's ClassLabel")
            classes = list(label_feature.names)
            unlabelled = sum(1 for v in labels if not 0 <= v < len(classes))
            if unlabelled:  # -1 is ClassLabel's "no label", common in a Hub test split; it would fail after decoding
                raise DataError(f"{where}: split {split!r} has {unlabelled} row(s) without a class (label -1 or out of "
                                f"range of {columns['label']!r}); fedstyle needs every image labelled: pass "
                                "--label-column NAME of a labelled column, or give hf:DIR holding the labelled "
                                "splits only")
        # chunk by chunk: combining the column's chunks would copy every image's bytes
        paths = [p for chunk in dataset.data.column(columns["image"]).chunks for p in chunk.field("path").to_pylist()]
        split_of += [index] * len(domains)
        row += range(len(domains))
        domain += [str(d) for d in domains]
        label += labels
        name += [os.path.basename(p) if p else "" for p in paths]
    if classes is None:  # plain values: sorted (numbers as numbers)
        values = sorted(set(label))
        classes = [str(v) for v in values]
        index_of = {v: i for i, v in enumerate(values)}
        label = [index_of[v] for v in label]
    return HubRows(list(data), np.array(split_of, dtype=np.int64), np.array(row, dtype=np.int64), domain,
                   np.array(label, dtype=np.int64), name, classes)


def _loose(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).lower()


def recognise_benchmark(rows: HubRows, columns: dict[str, str]) -> HubDefaults | None:
    """The known dataset whose schema ``rows`` has, for a copy read under another name (``hf:DIR``), or None.

    Recognised: the known dataset's columns, its benchmark's domains (loosely, see :func:`domain_order`) and
    its classes: the names themselves where the benchmark lists them (PACS), else their number (Office-Home's
    65, which fedstyle takes from the folders)."""
    domains = {_loose(d) for d in rows.domain}
    for defaults in KNOWN_DATASETS.values():
        benchmark = BENCHMARKS.get(defaults.benchmark)
        if columns != {"image": defaults.image, "domain": defaults.domain, "label": defaults.label}:
            continue
        if domains != {_loose(d) for d in benchmark.domains}:
            continue
        classes_match = (list(rows.classes) == list(benchmark.classes) if benchmark.classes
                         else len(rows.classes) == benchmark.num_classes)
        if classes_match:
            return defaults
    return None


def domain_order(rows: HubRows, defaults: HubDefaults | None, where: str, column: str) -> dict[str, str]:
    """Domain value -> fedstyle domain name, in dataset order (a known dataset's benchmark names and order)."""
    values = sorted(set(rows.domain))
    if defaults is None:
        return {v: v for v in values}
    benchmark = BENCHMARKS.get(defaults.benchmark)
    key = {_loose(d): d for d in benchmark.domains}
    named = {v: key.get(_loose(v)) for v in values}
    unknown = [v for v, d in named.items() if d is None]
    if unknown:
        raise DataError(f"{where}: column {column!r} holds {unknown[0]!r}, not a domain of {benchmark.name} "
                        f"({', '.join(benchmark.domains)}); pass --domain-column NAME of the domain column")
    return dict(sorted(named.items(), key=lambda item: benchmark.domains.index(item[1])))


def group_rows(rows: HubRows, names: dict[str, str], where: str) -> dict[str, np.ndarray]:
    """fedstyle domain -> its rows (positions in ``rows``) in decoding order; every domain has every class."""
    order = sorted(range(len(rows.domain)), key=lambda i: (rows.label[i], rows.name[i], rows.split_of[i], rows.row[i]))
    groups: dict[str, list[int]] = {names[v]: [] for v in names}
    for i in order:
        groups[names[rows.domain[i]]].append(i)
    groups = {d: np.array(members, dtype=np.int64) for d, members in groups.items()}
    everything = set(range(len(rows.classes)))
    for d, members in groups.items():
        missing = sorted(everything - set(rows.label[members].tolist()))
        if missing:
            shown = ", ".join(rows.classes[c] for c in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise DataError(f"{where}: domain {d!r} has no image of class(es) {shown} that other domains have; every "
                            "domain needs every class: filter those classes out of the dataset, or pass "
                            "--label-column / --domain-column naming other columns")
    return groups


# ----------------------------------------------------------------------------- decoding


class _RowBytes(io.BytesIO):
    """An image's encoded bytes, named in errors by where the row is."""

    def __init__(self, data: bytes, where: str):
        super().__init__(data)
        self.where = where

    def __str__(self) -> str:
        return self.where

    __repr__ = __str__  # PIL names an unreadable file by its repr ("cannot identify image file %r")


class HubImages(Sequence):
    """The encoded images of some rows, fetched from the (memory-mapped) Arrow tables a block at a time."""

    def __init__(self, repo: str, data, image_column: str, rows: HubRows, members: np.ndarray):
        self.repo, self.rows, self.members = repo, rows, members
        self.chunks = [dataset.data.column(image_column).chunks for dataset in data.values()]
        self.starts = [np.cumsum([0] + [len(chunk) for chunk in chunks]) for chunks in self.chunks]

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, item):
        if isinstance(item, slice):
            return [self[i] for i in range(*item.indices(len(self)))]
        i = int(self.members[item])
        split, row = int(self.rows.split_of[i]), int(self.rows.row[i])
        chunk = int(np.searchsorted(self.starts[split], row, side="right")) - 1  # a table has many chunks
        value = self.chunks[split][chunk][row - int(self.starts[split][chunk])].as_py() or {}
        where = f"hf:{self.repo} {self.rows.splits[split]} row {row}"
        where += f" ({value['path']})" if value.get("path") else ""
        if value.get("bytes") is None and value.get("path"):
            return Path(value["path"])  # an image kept as a local file
        return _RowBytes(value.get("bytes") or b"", where)


def _build(writer: ArrayWriter, repo: str, data, image_column: str, rows: HubRows, groups: dict[str, np.ndarray],
           resolution: int, benchmark, skip_bad_images: bool, progress: bool) -> DecodedArrays:
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    images, labels, bad_images, dropped = {}, {}, [], {}
    workers = max(1, min(8, os.cpu_count() or 1))
    total = sum(len(m) for m in groups.values())
    with ThreadPoolExecutor(workers) as executor, tqdm(total=total, desc=f"decoding hf:{repo}", unit="img",
                                                       disable=not progress) as bar:
        for index, (domain, members) in enumerate(groups.items()):
            sources = HubImages(repo, data, image_column, rows, members)
            images[domain], kept, bad = decode_domain(writer, index, sources, resolution, skip_bad_images,
                                                      executor, bar)
            if not kept:
                raise DataError(f"no image of domain {domain!r} of hf:{repo} could be read (first: {bad[0][0]})")
            labels[domain] = rows.label[members][kept]
            check_no_class_emptied(domain, rows.label[members], labels[domain], rows.classes, f"hf:{repo}")
            bad_images += bad
            if bad:
                dropped[domain] = sorted(set(range(len(members))) - set(kept))
    mean, std, augment = ((benchmark.mean, benchmark.std, benchmark.augment) if benchmark
                          else (IMAGENET_MEAN, IMAGENET_STD, "crop_flip"))
    return DecodedArrays(list(groups), rows.classes, images, labels, mean, std, augment,
                         info={"source": f"hf:{repo}", "splits": rows.splits, "skipped_images": len(bad_images),
                               "bad_images": bad_images, "dropped_rows": dropped})


def hub_splits(rows: HubRows, groups: dict[str, np.ndarray], dropped: dict[str, list[int]], where: str
               ) -> dict[str, dict[str, torch.Tensor]]:
    """The dataset's splits as official splits of each domain (none when it has one ``train`` split)."""
    if rows.splits == ["train"]:
        return {}
    unknown = [s for s in rows.splits if s not in SPLIT_ROLES]
    if unknown:
        raise DataError(f"{where}: split {unknown[0]!r} is not train, validation/val/valid or test, so it has no "
                        "place among official splits; pass --no-official-splits to pool every split")
    roles = np.array([SPLIT_ROLES[s] for s in rows.splits])
    out = {}
    for d, members in groups.items():
        kept = np.delete(members, dropped.get(d, []))
        role = roles[rows.split_of[kept]]
        out[d] = {r: torch.from_numpy(np.flatnonzero(role == r).astype(np.int64)) for r in sorted(set(role.tolist()))}
    return out


def load_hub_dataset(repo: str, data_root: str | None = None, resolution: int | None = None,
                     skip_bad_images: bool = False, seed: int = 0, progress: bool = True, official_splits: bool = True,
                     image_column: str | None = None, domain_column: str | None = None,
                     label_column: str | None = None) -> DomainDataset:
    """``hf:repo`` as a DomainDataset, decoded once into the cache (see the module docstring); ``seed`` is unused."""
    where = f"hf:{repo}"
    if data_root is not None:
        raise ConfigError(f"{where} is read from the Hugging Face cache (HF_HOME / HF_DATASETS_CACHE), not "
                          "--data-root; drop --data-root, or give hf:DIR for a local folder")
    if not repo:
        raise ConfigError("--dataset hf: needs a dataset: hf:OWNER/NAME (e.g. hf:flwrlabs/pacs) or hf:DIR")
    defaults = KNOWN_DATASETS.get(repo)
    columns = {"image": image_column or (defaults.image if defaults else "image"),
               "domain": domain_column or (defaults.domain if defaults else "domain"),
               "label": label_column or (defaults.label if defaults else "label")}
    benchmark = BENCHMARKS.get(defaults.benchmark) if defaults else None
    asked = resolution
    resolution = check_build_options(where, resolution, benchmark.resolution if benchmark else 224)
    data = open_hub_dataset(repo, progress)
    rows = read_rows(data, columns, where)
    if defaults is None:  # a copy of a known dataset under another name (hf:DIR): its benchmark by its schema
        defaults = recognise_benchmark(rows, columns)
        if defaults is not None:
            benchmark = BENCHMARKS.get(defaults.benchmark)
            resolution = check_build_options(where, asked, benchmark.resolution)
    groups = group_rows(rows, domain_order(rows, defaults, where, columns["domain"]), where)
    local = Path(repo).expanduser().is_dir()
    recipe = {
        "name": "hf-" + (Path(repo).expanduser().resolve().name if local else repo.replace("/", "--")),
        "version": RECIPE_VERSION, "source": str(Path(repo).expanduser().resolve()) if local else repo,
        "resolution": resolution, "columns": columns, "domains": list(groups), "classes": rows.classes,
        "fingerprints": {split: getattr(dataset, "_fingerprint", None) for split, dataset in data.items()},
    }
    dataset = cached_dataset(recipe, lambda writer: _build(writer, repo, data, columns["image"], rows, groups,
                                                           resolution, benchmark, skip_bad_images, progress), progress)
    splits = hub_splits(rows, groups, dataset.info.get("dropped_rows", {}), where) if official_splits else {}
    check_skipped(dataset, where, skip_bad_images)
    return dataset.with_splits(splits) if splits else dataset
