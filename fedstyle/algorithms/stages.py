"""Hyperparameters that name backbone stages (StableFDG's ``share_stage`` / ``explore_stages``,
StyleDDG's ``stages``): parsing a comma list, and the stage names any known backbone has (to refuse
a misspelt stage when the hyperparameters are resolved, before a model is built)."""

from __future__ import annotations

from fedstyle.errors import ConfigError
from fedstyle.models.base import Backbone


def parse_stages(text: object) -> list[str]:
    """``"layer1, layer2,"`` -> ``["layer1", "layer2"]``: comma-separated names, blanks dropped."""
    return [s.strip() for s in str(text).split(",") if s.strip()]


def known_stage_names() -> set[str]:
    """Every stage name of the backbones fedstyle knows (to reject a misspelt stage before building)."""
    names: set[str] = set()
    pending = list(Backbone.__subclasses__())
    while pending:
        cls = pending.pop()
        names.update(cls.stage_names)
        pending.extend(cls.__subclasses__())
    return names


def check_known_stages(stages: list[str], options: str) -> None:
    """Refuse a stage no known backbone has, naming the hyperparameter(s) ``options`` and the known stages."""
    for stage in stages:
        if stage not in known_stage_names():
            raise ConfigError(f"unknown backbone stage {stage!r} in {options}; stages are "
                              f"{', '.join(sorted(known_stage_names()))}")
