"""The leaderboard's tables: plain sweep files (benchmarks/leaderboard/<table>.toml, `fedstyle sweep` runs them as
they are) whose rows are completed from the method registry, and benchmarks/leaderboard/tables.toml, what the
leaderboard needs beside them (each table's title, CSV, topology, exclusions, kind of cell).

A sweep file ends with the registry's section, below :data:`REGISTRY_MARKER`: one ``[[variant]]`` row per method
of :data:`fedstyle.algorithms.METHODS` whose ``topologies`` include the table's topology, with the method's
defaults (name = the method, label = its class's ``label``), except the methods with a row of their own above
the marker (their paper's or preset's settings, e.g. FedCCRL's step) and those tables.toml excludes with a
reason. :func:`registry_section` writes it; ``fedstyle leaderboard grid --write`` puts it in the files, and
``fedstyle leaderboard run`` always uses the registry's current rows, so a newly registered method joins the
tables without an edit (a test says when the committed files lag behind).

The sweep machinery (grid parsing, planning, validation, execution) is used as it is.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fedstyle.errors import ConfigError

#: the repository's folders (an editable install or a checkout); an installed wheel has none: pass --grid-dir
REPO_ROOT = Path(__file__).resolve().parents[3]
GRID_DIR = REPO_ROOT / "benchmarks" / "leaderboard"
CSV_DIR = REPO_ROOT / "benchmarks" / "per_seed"
META_FILE = "tables.toml"
#: the line above which a sweep file is written by hand, below which by `fedstyle leaderboard grid --write`
REGISTRY_MARKER = "# ------------------------------------------------------------------ rows from the registry"
CELL_KINDS = ("target", "source")
#: tables.toml's entries that are not tables
NOT_TABLES = ("datasets", "budget")


@dataclass
class Table:
    """One leaderboard table: its sweep file with the registry's current rows, and its tables.toml entry."""

    key: str
    path: Path
    title: str
    csv: str
    cell: str
    text: str
    data: dict[str, Any]
    topology: str | None = None
    #: method -> why it has no row
    excluded: dict[str, str] = field(default_factory=dict)
    #: the methods the registry's section has rows for
    added: list[str] = field(default_factory=list)

    def grid(self, overrides=(), device: str | None = None):
        """The table as a :class:`~fedstyle.experiments.grid.Grid` (``--set`` overrides, ``--device``)."""
        from fedstyle.experiments.grid import parse_grid

        overrides = list(overrides) + ([("device", device)] if device else [])
        return parse_grid(self.data, str(self.path), overrides=overrides)

    @property
    def stale(self) -> bool:
        """Whether the file on disk lacks the registry's current rows."""
        return self.path.read_text() != self.text

    def rows(self) -> list[tuple[str, str, str]]:
        """(variant, method, label) of every row, in the file's order."""
        return [(v["name"], v["method"], str(v.get("label", v["name"]))) for v in self.data["variant"]]


def _read_meta_file(grid_dir: Path) -> dict[str, Any]:
    path = Path(grid_dir) / META_FILE
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; pass --grid-dir to the folder of the leaderboard's sweep files "
                          "(benchmarks/leaderboard in a checkout)")
    return read_toml(path)


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file of the leaderboard's folder; bad TOML is a ConfigError naming the file and the place. (Not
    fedstyle.experiments.grid's read_toml: importing that package loads every method and torch, and `leaderboard
    show` answers without them.)"""
    try:
        return tomllib.loads(Path(path).read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file; give a TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}; mend it (`git diff {path}` shows what changed)") from None


def read_datasets(grid_dir: Path = GRID_DIR) -> dict[str, dict[str, Any]]:
    """tables.toml's [datasets]: dataset -> {classes, domains}."""
    return dict(_read_meta_file(grid_dir).get("datasets", {}))


def read_budget(grid_dir: Path = GRID_DIR) -> dict[str, Any]:
    """tables.toml's [budget]: the rule that chose the rounds, and the CSV of its runs."""
    return dict(_read_meta_file(grid_dir).get("budget", {}))


def read_meta(grid_dir: Path = GRID_DIR) -> dict[str, dict[str, Any]]:
    """tables.toml: table key -> its entry, in the file's order (the order tables are run and shown)."""
    path = Path(grid_dir) / META_FILE
    meta = {k: v for k, v in _read_meta_file(grid_dir).items() if k not in NOT_TABLES}
    for key, entry in meta.items():
        if not isinstance(entry, Mapping) or not entry.get("title") or not entry.get("csv"):
            raise ConfigError(f"{path}: [{key}] needs `title` and `csv`")
        if entry.get("cell", "target") not in CELL_KINDS:
            raise ConfigError(f"{path}: [{key}] cell must be one of {', '.join(CELL_KINDS)}")
    return meta


def registry_section(topology: str | None, own: set[str], excluded: Mapping[str, str]) -> tuple[str, list[str]]:
    """The text below :data:`REGISTRY_MARKER` and the methods it has rows for (see the module docstring)."""
    from fedstyle.algorithms import METHODS

    lines = [REGISTRY_MARKER,
             "# Written by `fedstyle leaderboard grid --write` from the method registry: one row per method whose",
             f"# topologies include {json.dumps(topology)}, with its defaults, except the methods with a row above and",
             "# those benchmarks/leaderboard/tables.toml excludes. Not to be edited: `fedstyle leaderboard run` uses",
             "# the registry's rows of the moment, and a test fails when this section lags behind them.", ""]
    added = []
    if topology is not None:
        for name in METHODS.names():
            cls = METHODS.get(name)
            if topology not in cls.topologies or name in own or name in excluded:
                continue
            added.append(name)
            lines += ["[[variant]]", f"name = {json.dumps(name)}", f"label = {json.dumps(cls.label or name)}",
                      f"method = {json.dumps(name)}", ""]
    else:
        lines += ["# (none: this table has no topology in tables.toml, its rows are the file's own)", ""]
    return "\n".join(lines).rstrip("\n") + "\n", added


def load_table(key: str, grid_dir: Path = GRID_DIR, meta: Mapping[str, Any] | None = None) -> Table:
    """``grid_dir/<key>.toml`` as a :class:`Table`, its registry section as the registry has it now."""
    from fedstyle.algorithms import METHODS

    meta = read_meta(grid_dir) if meta is None else meta
    path = Path(grid_dir) / f"{key}.toml"
    if key not in meta or not path.is_file():
        raise ConfigError(f"no leaderboard table {key!r} in {grid_dir} (its tables: {', '.join(meta)}); pass "
                          "--grid-dir to the folder of the leaderboard's sweep files")
    entry = meta[key]
    excluded = dict(entry.get("exclude", {}) or {})
    for method, reason in excluded.items():
        if method not in METHODS:
            raise ConfigError(f"{grid_dir / META_FILE}: [{key}.exclude] names {method!r}, which is no registered "
                              f"method; choose from {', '.join(METHODS.names())}")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"{grid_dir / META_FILE}: [{key}.exclude] {method} needs the reason as text")
    text = path.read_text()
    hand = text.split(REGISTRY_MARKER)[0].rstrip("\n") + "\n\n"
    try:
        own = {v.get("name") for v in tomllib.loads(hand).get("variant", [])}
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    section, added = registry_section(entry.get("topology"), own, excluded)
    text = hand + section
    return Table(key=key, path=path, title=str(entry["title"]), csv=str(entry["csv"]),
                 cell=str(entry.get("cell", "target")), text=text, data=tomllib.loads(text),
                 topology=entry.get("topology"), excluded=excluded, added=added)


def load_tables(only: list[str] | None = None, grid_dir: Path = GRID_DIR) -> list[Table]:
    """The tables named in ``only`` (default: every table of tables.toml), in that order."""
    meta = read_meta(grid_dir)
    keys = list(only) if only else list(meta)
    unknown = [k for k in keys if k not in meta]
    if unknown:
        raise ConfigError(f"--only {unknown[0]}: no such leaderboard table; choose from {', '.join(meta)}")
    return [load_table(k, grid_dir, meta) for k in keys]


def write_tables(grid_dir: Path = GRID_DIR) -> list[Path]:
    """Write each sweep file's registry section as the registry has it now; returns the files changed."""
    from fedstyle.io import atomic_write_text

    changed = []
    for table in load_tables(grid_dir=grid_dir):
        if table.stale:
            atomic_write_text(table.path, table.text)
            changed.append(table.path)
    return changed
