"""The leaderboard's tables as sweep files: benchmarks/leaderboard/<table>.toml, each a sweep file
(:mod:`fedstyle.experiments.grid`) plus a ``[leaderboard]`` table, completed by the method registry.

``[leaderboard]`` holds:

- ``table``: the table's title (``"multi-source star"``);
- ``csv``: the per-seed file its runs go to, ``benchmarks/per_seed/<csv>.csv``;
- ``topology`` (optional): every method of :data:`fedstyle.algorithms.METHODS` whose ``topologies`` include it
  gets a row with its own defaults (name = the method, label = its class's ``label``), unless a ``[[variant]]``
  of the file has the method's name (its own settings, e.g. FedCCRL's step) or ``[leaderboard.exclude]`` names it
  with the reason. So a newly registered method joins the table without an edit; the registry, not a list,
  decides the rows.

The sweep machinery (grid parsing, planning, validation, execution) is used as it is: :func:`table_grid` only
adds the rows and hands the data to :func:`~fedstyle.experiments.grid.parse_grid`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fedstyle.errors import ConfigError

#: the repository's folders (an editable install or a checkout); an installed wheel has none: pass --grid-dir
REPO_ROOT = Path(__file__).resolve().parents[3]
GRID_DIR = REPO_ROOT / "benchmarks" / "leaderboard"
CSV_DIR = REPO_ROOT / "benchmarks" / "per_seed"
#: the tables, in the order they are run and shown (their file names without .toml)
TABLES = ("multi_source", "p2p", "single_source")


@dataclass
class Table:
    """One leaderboard table: its sweep file's data with the registry's rows added."""

    key: str
    path: Path
    title: str
    csv: str
    data: dict[str, Any]
    #: method -> why it has no row
    excluded: dict[str, str] = field(default_factory=dict)
    #: the rows the registry added (method names)
    added: list[str] = field(default_factory=list)

    def grid(self, overrides=(), device: str | None = None):
        """The table as a :class:`~fedstyle.experiments.grid.Grid` (``--set`` overrides, ``--device``)."""
        from fedstyle.experiments.grid import parse_grid

        overrides = list(overrides) + ([("device", device)] if device else [])
        return parse_grid(self.data, str(self.path), overrides=overrides)

    @property
    def out(self) -> str:
        return str(self.data.get("out", f"runs/leaderboard/{self.key}"))


def _registry_rows(meta: Mapping[str, Any], variants: list[Mapping[str, Any]], where: str
                   ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The rows the registry adds to a table (see the module docstring) and the excluded methods."""
    from fedstyle.algorithms import METHODS

    excluded = dict(meta.get("exclude", {}) or {})
    for method, reason in excluded.items():
        if method not in METHODS:
            raise ConfigError(f"{where}: [leaderboard.exclude] names {method!r}, which is no registered method; "
                              f"choose from {', '.join(METHODS.names())}")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"{where}: [leaderboard.exclude] {method} needs the reason as text")
    topology = meta.get("topology")
    if topology is None:
        return [], excluded
    named = {v.get("name") for v in variants}
    rows = []
    for name in METHODS.names():
        cls = METHODS.get(name)
        if topology not in cls.topologies or name in excluded or name in named:
            continue
        rows.append({"name": name, "label": cls.label or name, "method": name})
    return rows, excluded


def _in_registry_order(rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rows sorted by their method's place in the registry (alphabetical), a method's rows in file order:
    a table reads the same whichever rows the file spells out."""
    from fedstyle.algorithms import METHODS

    order = {name: i for i, name in enumerate(METHODS.names())}
    return sorted(rows, key=lambda row: order.get(row.get("method"), len(order)))  # stable: file order kept


def load_table(key: str, grid_dir: Path = GRID_DIR) -> Table:
    """``grid_dir/<key>.toml`` as a :class:`Table` (rows from the registry added)."""
    from fedstyle.experiments.grid import read_toml

    path = Path(grid_dir) / f"{key}.toml"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in Path(grid_dir).glob("*.toml"))) or "none"
        raise ConfigError(f"no leaderboard table {path} (tables there: {have}); pass --grid-dir to the folder of "
                          "the leaderboard's sweep files (benchmarks/leaderboard in a checkout)")
    data = read_toml(path)
    meta = data.pop("leaderboard", None)
    if not isinstance(meta, Mapping) or not meta.get("table") or not meta.get("csv"):
        raise ConfigError(f"{path}: needs a [leaderboard] table with `table` (its title) and `csv` (its per-seed "
                          "file's name)")
    variants = list(data.get("variant", []))
    rows, excluded = _registry_rows(meta, variants, str(path))
    data = copy.deepcopy(data)
    data["variant"] = _in_registry_order(rows + variants)
    return Table(key=key, path=path, title=str(meta["table"]), csv=str(meta["csv"]), data=data,
                 excluded=excluded, added=[r["name"] for r in rows])


def load_tables(only: list[str] | None = None, grid_dir: Path = GRID_DIR) -> list[Table]:
    """The tables named in ``only`` (default: :data:`TABLES`), in that order."""
    keys = list(only) if only else list(TABLES)
    unknown = [k for k in keys if k not in TABLES and not (Path(grid_dir) / f"{k}.toml").is_file()]
    if unknown:
        raise ConfigError(f"--only {unknown[0]}: no such leaderboard table; choose from {', '.join(TABLES)}")
    return [load_table(k, grid_dir) for k in keys]
