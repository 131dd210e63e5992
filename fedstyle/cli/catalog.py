"""The names the command line answers with before any work starts, without importing torch.

Importing torch takes seconds, so ``fedstyle methods``, ``fedstyle data list`` and every refusal of a
bad name read this catalog instead: ``catalog.json`` beside this file, generated from the real
registries (:data:`fedstyle.algorithms.METHODS`, :data:`fedstyle.data.DATASETS`,
:data:`fedstyle.models.registry.BACKBONES`) by ``python -m fedstyle.cli.catalog``. The registries stay
the single source of truth: ``tests/test_cli_catalog.py`` rebuilds the catalog from them and fails, naming
that command, when the file differs (a method added, a hyperparameter renamed or a default changed).
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

CATALOG_FILE = Path(__file__).with_name("catalog.json")
REBUILD = "python -m fedstyle.cli.catalog"


def short_cite(paper: str) -> str:
    """"Chen et al., Federated domain ... transfer, WACV 2023" -> "Chen et al., WACV 2023": the first
    author and the venue, for one-line listings."""
    parts = [p.strip() for p in paper.split(", ") if p.strip()]
    if not parts:
        return ""
    venue = parts[-1]
    if re.fullmatch(r"\d{4}", venue) and len(parts) > 2:  # "arXiv 2111.10487, 2021"
        venue = f"{parts[-2]}, {venue}"
    first = parts[0]
    if ":" in first:  # the paper's title, no authors given
        return venue
    author = first if "et al." in first else f"{first.split()[0]} et al."
    return f"{author}, {venue}"


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def method_entry(cls) -> dict[str, Any]:
    """One method's catalog entry, from its registered class."""
    reason = cls.batching_support(cls.resolve({}))  # --client-batching with the default hyperparameters
    return {
        "label": cls.label or cls.name,
        "family": cls.family,
        "paper": cls.paper,
        "cite": short_cite(cls.paper),
        "shares": cls.shares,
        "summary": cls.summary,
        "topologies": list(cls.topologies),
        "batching": reason,
        "hparams": [{"name": h.name, "default": _json_value(h.default),
                     "choices": None if h.choices is None else [_json_value(c) for c in h.choices],
                     "describe": h.describe()} for h in cls.declared_hparams()],
    }


def build() -> dict[str, Any]:
    """The catalog from the real registries (imports torch and every method)."""
    from fedstyle.algorithms import METHODS
    from fedstyle.data import DATASETS
    from fedstyle.models.registry import BACKBONES

    methods = {name: method_entry(cls) for name, cls in METHODS.items()}
    datasets = {name: {"description": entry.description,
                       "domains": None if entry.domains is None else list(entry.domains)}
                for name, entry in DATASETS.items()}
    return {"methods": methods, "datasets": datasets, "backbones": BACKBONES.names()}


def render(catalog: dict[str, Any]) -> str:
    return json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@lru_cache(maxsize=1)
def stored() -> dict[str, Any]:
    """The stored catalog (no torch)."""
    return json.loads(CATALOG_FILE.read_text(encoding="utf-8"))


def load() -> dict[str, Any]:
    """The stored catalog, plus any method registered at run time by a program that has imported the method
    registry already (its own method, registered in-process before it calls the command line): that costs no
    import, and a fresh `fedstyle` process, which has not imported it, answers from the file alone."""
    catalog = stored()
    registry = sys.modules.get("fedstyle.algorithms.registry")
    if registry is None:
        return catalog
    extra = {name: method_entry(cls) for name, cls in registry.METHODS.items() if name not in catalog["methods"]}
    return {**catalog, "methods": {**catalog["methods"], **extra}} if extra else catalog


def method_names() -> list[str]:
    return sorted(load()["methods"])


def dataset_names() -> list[str]:
    return sorted(load()["datasets"])


if __name__ == "__main__":
    CATALOG_FILE.write_text(render(build()), encoding="utf-8")
    print(f"wrote {CATALOG_FILE}")
