"""Comparing runs: metrics.jsonl records without what legitimately differs between identical runs."""

from __future__ import annotations

import json
from pathlib import Path

#: train_metrics that count cache work (CCST/PARDON's lazily made images): they depend on what the
#: style cache held when the run started, as timings depend on the machine; never on the results
CACHE_COSTS = ("stylized_images",)


def without_costs(record: dict) -> dict:
    """``record`` without its wall-clock ``seconds`` and, in ``train_metrics``, timings (``*_seconds``)
    and :data:`CACHE_COSTS`."""
    record = {k: v for k, v in record.items() if k != "seconds"}
    if "train_metrics" in record:
        record["train_metrics"] = {k: v for k, v in record["train_metrics"].items()
                                   if not k.endswith("_seconds") and k not in CACHE_COSTS}
    return record


def evaluations(run_dir: Path) -> list[dict]:
    """The evaluation records of ``run_dir``'s metrics.jsonl (events left out), without costs."""
    lines = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [without_costs(r) for r in lines if "event" not in r]
