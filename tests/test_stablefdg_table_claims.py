"""benchmarks/stablefdg_table.py's claim lines: each link of StableFDG > DSU >= MixStyle > FedAvg read by the rule,
printed with the verdict's text (its mean difference, interval and pairs), not an object's repr."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stablefdg_table.py"


def _script():
    spec = importlib.util.spec_from_file_location("stablefdg_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(label: str, accuracies: list[float]):
    by_seed = {seed: {"mnistm": acc} for seed, acc in enumerate(accuracies)}
    return SimpleNamespace(label=label, cell_accuracies=lambda dataset: {
        (f"{dataset} → {d}", s): a for s, ds in by_seed.items() for d, a in ds.items()})


def test_each_link_is_printed_with_the_rules_numbers():
    table = SimpleNamespace(rows=[_row("StableFDG", [40.0, 41.0, 42.0]), _row("DSU", [30.0, 30.5, 31.5]),
                                  _row("MixStyle", [30.0, 31.0, 31.0]), _row("FedAvg", [35.0, 36.0, 37.0])])
    lines = _script().claim_lines(table, "digits4")
    assert len(lines) == 3 and not any("bound method" in line for line in lines), lines
    assert lines[0].startswith("claim stablefdg > dsu: **holds** (+10.3 points, 95 % CI")
    assert "digits4 → mnistm" in lines[0] and "seeds 0, 1, 2" in lines[0]
    assert lines[2].startswith("claim mixstyle > fedavg: **fails**")
