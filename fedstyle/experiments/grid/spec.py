"""What a parsed sweep file is: its crossed keys (:class:`Axis`), its rows (:class:`VariantSpec`) and
the whole grid (:class:`Grid`), and the rule every folder name of a grid follows."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from fedstyle.errors import ConfigError

#: a crossed value, a variant name or a target must be usable as one folder name
_FOLDER_SAFE = re.compile(r"^[A-Za-z0-9._+@-]+$")


# ----------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Axis:
    """A crossed key: its folder name, what it sets, and its values with their folder labels.

    ``kind``: ``setting`` (a RunConfig field), ``hparam`` (a method hyperparameter) or ``bundle``
    (a table of settings and ``hparams.*`` applied together)."""

    name: str
    key: str
    kind: str
    values: tuple
    labels: tuple[str, ...]
    scope: str = "grid"

    def apply(self, mapping: dict[str, Any], index: int) -> None:
        value = self.values[index]
        if self.kind == "setting":
            mapping[self.key] = copy.deepcopy(value)
        elif self.kind == "hparam":
            mapping.setdefault("hparams", {})[self.key] = value
        else:
            for key, item in value.items():
                if key == "name":
                    continue
                if key == "hparams":
                    mapping.setdefault("hparams", {}).update(item)
                elif key == "targets" and isinstance(item, str):
                    mapping["targets"] = [item]
                else:
                    mapping[key] = copy.deepcopy(item)

    def sets(self) -> set[str]:
        """The run settings (``hparams.X`` for hyperparameters) this axis sets."""
        if self.kind == "setting":
            return {self.key}
        if self.kind == "hparam":
            return {f"hparams.{self.key}"}
        keys: set[str] = set()
        for value in self.values:
            for key, item in value.items():
                if key == "hparams":
                    keys |= {f"hparams.{k}" for k in item}
                elif key != "name":
                    keys.add(key)
        return keys


@dataclass(frozen=True)
class VariantSpec:
    """One ``[[variant]]`` row."""

    name: str
    method: str
    label: str
    hparams: dict[str, Any]
    settings: dict[str, Any]
    axes: tuple[Axis, ...] = ()
    seeds: tuple[int, ...] | None = None
    targets: Any = None


@dataclass
class Grid:
    """A parsed sweep file (one scale of a preset), not yet expanded into runs."""

    where: str
    base: dict[str, Any]
    variants: list[VariantSpec]
    axes: list[Axis]
    seeds: list[int] | None = None
    targets: Any = None
    description: str = ""
    title: str = ""
    out: str | None = None
    report_by: list[str] | None = None
    paper: Any = None
    claims: list[Any] = field(default_factory=list)
    scale: str | None = None
    scales: dict[str, str] = field(default_factory=dict)
    name: str = ""
    #: every variant name of the file, also those a scale leaves out (claims may name them)
    all_variants: list[str] = field(default_factory=list)
    #: variant name -> its label, for every variant of the file
    labels: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- names


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _check_folder_name(text: str, what: str, where: str) -> str:
    if not _FOLDER_SAFE.match(text) or text.startswith("."):
        raise _fail(where, f"{what} {text!r} cannot name a folder; use letters, digits and . _ + @ - only"
                    + (" (give a bundle a `name`)" if "=" in text or "/" in text else ""))
    return text
