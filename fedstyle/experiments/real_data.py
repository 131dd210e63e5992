"""A paper's own setting on the real data: ``fedstyle reproduce PAPER --data-root DIR`` (or ``--dataset hf:...``).

Every preset carries one track per dataset of the paper's tables, named ``paper-<dataset>``
(``paper-pacs``, ``paper-officehome``, ``paper-vlcs``), with the paper's backbone, resolution,
schedule and optimiser (its note says which settings the paper leaves open). This module picks
the tracks whose data is there and fills in where it is:

- ``--data-root DIR``: for each paper track, the dataset's folder is ``DIR`` itself when it holds
  the benchmark's domain folders, else ``DIR/<folder>`` as ``fedstyle data download`` lays it out
  (``DIR/PACS``, ``DIR/office_home``, ``DIR/VLCS``), else ``DIR/<dataset>``; tracks without their
  data are named with the command that downloads it, and if none has it that is the error.
- ``--dataset NAME`` (e.g. ``hf:flwrlabs/pacs``): passed through as every run's dataset, for the
  paper track whose dataset the name contains (``pacs``, ``office-home`` ...), or the one ``--track``
  names.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fedstyle.errors import ConfigError, DataError

PAPER_TRACK = "paper-"


@dataclass(frozen=True)
class PaperRun:
    """One paper track to run: the preset's data with the track's dataset and data root filled in."""

    track: str
    dataset: str
    data_root: Path | None
    data: dict[str, Any]


def _loose(text: str) -> str:
    return re.sub(r"[\s_\-]", "", text).lower()


def paper_tracks(data: Mapping[str, Any]) -> dict[str, str]:
    """``paper-<dataset>`` track -> its dataset name."""
    tracks = data.get("tracks", {})
    return {name: name[len(PAPER_TRACK):] for name in tracks if name.startswith(PAPER_TRACK)}


def data_folder(dataset: str, data_root: Path) -> Path | None:
    """The folder under ``data_root`` that holds ``dataset``'s domain folders, or None."""
    from fedstyle.data.download import DOWNLOADS
    from fedstyle.data.folder import BENCHMARKS, find_domain_folders

    benchmark = BENCHMARKS.get(dataset)
    folders = [data_root] + [data_root / e.folder for _, e in DOWNLOADS.items() if e.dataset == dataset]
    for folder in folders + [data_root / dataset]:
        try:
            find_domain_folders(folder, benchmark)
        except DataError:
            continue
        return folder
    return None


def download_folder(dataset: str, data_root: Path) -> Path:
    """Where ``fedstyle data download`` puts ``dataset`` under ``data_root`` (``data_root/<dataset>`` for a
    dataset it does not download)."""
    from fedstyle.data.download import DOWNLOADS

    folders = [data_root / e.folder for _, e in DOWNLOADS.items() if e.dataset == dataset]
    return folders[0] if folders else data_root / dataset


def download_hint(dataset: str, data_root: Path) -> str:
    from fedstyle.data.download import DOWNLOADS

    names = [name for name, e in DOWNLOADS.items() if e.dataset == dataset]
    if names:
        return f"fedstyle data download {names[0]} --data-root {data_root}"
    return f"put {dataset}'s <domain>/<class>/<image> folders in {data_root / dataset}"


def _fill(data: Mapping[str, Any], track: str, dataset: str | None, data_root: Path | None) -> dict[str, Any]:
    """The preset data with the track's runs reading ``dataset`` (if given) from ``data_root`` (if given)."""
    data = copy.deepcopy(dict(data))
    chosen = data["tracks"][track]
    base = chosen.setdefault("base", {})
    if data_root is not None:
        base["data_root"] = str(data_root)
    if dataset is not None:
        base["dataset"] = dataset
        for value in chosen.values():  # bundles that name the dataset (FedGCA's source_domain)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, dict) and "dataset" in item:
                        item["dataset"] = dataset
    return data


def select_paper_runs(data: Mapping[str, Any], where: str, *, data_root: str | Path | None = None,
                      dataset: str | None = None, track: str | None = None,
                      without_data: bool = False) -> tuple[list[PaperRun], list[str]]:
    """The paper tracks to run on the real data, and a line per paper track left out for want of its data.

    ``without_data`` (a dry run): when none of the tracks' data is there, every track is kept, reading its
    data from where ``fedstyle data download`` would put it; the plan then marks their runs
    (``plan_grid(without_data=True)``).
    """
    tracks = paper_tracks(data)
    if not tracks:
        raise ConfigError(f"{where} has no paper-<dataset> track: it runs on fedstyle's stand-in datasets only")
    if track is not None:
        if track not in tracks:
            raise ConfigError(f"{where} has no paper track {track!r}; its paper tracks: {', '.join(tracks)}")
        chosen = [track]
    elif dataset is not None:
        chosen = [t for t, d in tracks.items() if _loose(d) in _loose(dataset)]
        if len(chosen) != 1:  # a copy under another name (hf:someone/pacs-copy) is a track's data too
            named = "its name matches none of the paper's datasets" if not chosen else "its name matches several"
            raise ConfigError(f"--dataset {dataset}: {named}; if it holds one of them, say which of the paper's "
                              "settings it is: --track " + " or --track ".join(chosen or tracks))
    else:
        chosen = list(tracks)
    root = Path(data_root).expanduser() if data_root is not None else None
    if root is None:
        return [PaperRun(t, dataset or tracks[t], None, _fill(data, t, dataset, None)) for t in chosen], []
    if not root.is_dir() and not without_data:
        raise ConfigError(f"--data-root {root} is not a folder")
    if dataset is not None:  # a dataset named outright reads DIR as it is
        return [PaperRun(t, dataset, root, _fill(data, t, dataset, root)) for t in chosen], []
    runs, missing = [], []
    for name in chosen:
        folder = data_folder(tracks[name], root) if root.is_dir() else None
        if folder is None:
            missing.append(f"{name}: no {tracks[name]} in {root} ({download_hint(tracks[name], root)})")
        else:
            runs.append(PaperRun(name, tracks[name], folder, _fill(data, name, None, folder)))
    if not runs and without_data:  # nothing there yet: list every track, reading where the download would put it
        folders = {name: download_folder(tracks[name], root) for name in chosen}
        return [PaperRun(name, tracks[name], folders[name], _fill(data, name, None, folders[name]))
                for name in chosen], []
    if not runs:
        raise ConfigError(f"{where}: none of the paper's datasets is in {root}; " + "; ".join(missing))
    return runs, missing


def describe_setting(grid) -> str:
    """One line: the backbone, resolution and schedule a paper track's runs use, and their data."""
    base = grid.base
    steps = f"{base['local_steps']} local steps" if base.get("local_steps") else \
        f"{base.get('local_epochs', 1)} local epoch(s)"
    weights = "ImageNet-pretrained " if base.get("pretrained") else ""
    named = [v["dataset"] for a in grid.axes if a.kind == "bundle" for v in a.values if "dataset" in v]
    data = base.get("dataset") or ", ".join(dict.fromkeys(named)) or "the preset's"
    if base.get("data_root"):
        data += f" from {base['data_root']}"
    splits = describe_splits(base, list(dict.fromkeys(named)))
    return (f"{weights}{base.get('backbone', 'auto')} at {base.get('resolution')} px, {base.get('rounds')} rounds x "
            f"{steps} of batch {base.get('batch_size')}, {base.get('optimizer', 'sgd')} lr {base.get('lr')}; data: {data}"
            f"; splits: {splits}")


def describe_splits(base: Mapping[str, Any], named: list[str]) -> str:
    """Which split the runs use: a benchmark's official lists (found where), the seeded rule, or a Hub dataset's."""
    from fedstyle.data.folder import BENCHMARKS
    from fedstyle.data.split_lists import describe_split_source

    dataset = base.get("dataset") or (named[0] if len(named) == 1 else None)
    official = base.get("official_splits", True)
    if dataset is None:
        return "as each run's dataset gives them"
    if dataset.startswith("hf:"):
        return ("the dataset's own train/validation/test splits where it has several, else the seeded per-class "
                "split (--val-fraction)" if official else "seeded per-class split (--val-fraction)")
    root = Path(base["data_root"]) if base.get("data_root") else None
    domains = list(BENCHMARKS.get(dataset).domains or ()) if dataset in BENCHMARKS else None
    return describe_split_source(dataset, root, domains, official)
