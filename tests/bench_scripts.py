"""Loading a script of benchmarks/ (not a package) as a module, for the tests of its functions (not collected)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<relative>`` (``"leaderboard/measure_cost.py"``) imported as module ``name`` (default: its stem),
    registered in ``sys.modules`` so that its dataclasses can look their module up."""
    path = BENCHMARKS / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
