"""Declared hyperparameters: every method lists its own, with type, default, range and help.

``--hp NAME=VALUE`` on the command line and the ``[hparams]`` table of a TOML config are parsed
and validated against these declarations, so a typo or a bad value fails before training starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from fedstyle.errors import ConfigError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class HParam:
    name: str
    default: Any
    help: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None

    @property
    def type(self) -> type:
        return type(self.default)

    def parse(self, value: Any, method: str = "") -> Any:
        """Convert ``value`` (a string from the CLI or a TOML value) and check it."""
        where = f"hyperparameter {self.name!r}" + (f" of {method}" if method else "")
        kind = self.type
        try:
            if kind is bool:
                if isinstance(value, bool):
                    parsed = value
                elif str(value).strip().lower() in _TRUE:
                    parsed = True
                elif str(value).strip().lower() in _FALSE:
                    parsed = False
                else:
                    raise ValueError
            elif kind is int:
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                parsed = int(str(value).strip()) if isinstance(value, str) else int(value)
            elif kind is float:
                if isinstance(value, bool):
                    raise ValueError
                parsed = float(value)
            else:
                parsed = str(value)
        except (TypeError, ValueError):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise ConfigError(f"{where}: {shown} is not a valid {kind.__name__} (default {self.default!r})") from None
        if kind is float and not math.isfinite(parsed):
            raise ConfigError(f"{where}: {value!r} is not a finite number")
        if self.choices is not None and parsed not in self.choices:
            raise ConfigError(f"{where}: {parsed!r} is not one of {', '.join(map(str, self.choices))}")
        # no flag named: the value may come from --hp, a sweep file's hparams or --set hparams.NAME
        allowed = f"; {self.name} takes values in [{'' if self.low is None else self.low}, " \
                  f"{'' if self.high is None else self.high}]"
        if self.low is not None and parsed < self.low:
            raise ConfigError(f"{where}: {parsed!r} is below the minimum {self.low}{allowed}")
        if self.high is not None and parsed > self.high:
            raise ConfigError(f"{where}: {parsed!r} is above the maximum {self.high}{allowed}")
        return parsed

    def describe(self) -> str:
        rng = ""
        if self.choices is not None:
            rng = " {" + "|".join(map(str, self.choices)) + "}"
        elif self.low is not None or self.high is not None:
            rng = f" [{'' if self.low is None else self.low}, {'' if self.high is None else self.high}]"
        return f"{self.name}={self.default!r}{rng}: {self.help}"


def resolve_hparams(declared: Iterable[HParam], given: Mapping[str, Any], method: str) -> dict[str, Any]:
    """Defaults overridden by ``given``; unknown names raise an error listing the valid ones."""
    table = {h.name: h for h in declared}
    unknown = sorted(set(given) - set(table))
    if unknown:
        from fedstyle.registry import did_you_mean

        valid = ", ".join(sorted(table)) or "(it has none)"
        raise ConfigError(f"unknown hyperparameter {unknown[0]!r} for method {method!r}; "
                          f"{did_you_mean(unknown[0], table)}valid: {valid}")
    return {name: (h.parse(given[name], method) if name in given else h.default) for name, h in table.items()}


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """Parse repeated ``NAME=VALUE`` strings (the ``--hp`` flag)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--hp expects NAME=VALUE, got {item!r} (for example --hp mu=0.01)")
        name, value = name.strip(), value.strip()
        if name in out and out[name] != value:  # the last one silently won
            raise ConfigError(f"--hp {name} is given twice ({out[name]} and {value}); give it once")
        out[name] = value
    return out
