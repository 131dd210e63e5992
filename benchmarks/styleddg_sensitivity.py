"""StyleDDG sensitivity (issue 21 §5): a styleddg_table.py run's config with one hyperparameter changed.

Variants: ``alpha1`` (StyleExplore alpha = 1 instead of the paper's 3, Eq. 18) and ``layer1`` (the
style steps at stage 1 only). Seeds 0-2; finished runs are skipped. Prints each run's selected
target accuracy; the table in docs/results/styleddg.md adds the source-validation accuracy from the
runs' metrics.jsonl.

    PYTHONPATH=. python benchmarks/styleddg_sensitivity.py \
        --config runs/styleddg/digits4/m3-complete/styleddg/seed0/mnistm/config.json --out runs/styleddg-sens
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import run_experiment

VARIANTS = {"alpha1": {"alpha": 1.0}, "layer1": {"stages": "layer1"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="config.json of a styleddg_table.py StyleDDG run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file; give the config.json of a StyleDDG run of "
                     "benchmarks/styleddg_table.py (runs/styleddg/<dataset>/<network>/styleddg/seed0/<target>/)")
    base = json.loads(args.config.read_text())
    if base.get("method") != "styleddg":
        parser.error(f"--config {args.config} is a {base.get('method')!r} run; give a StyleDDG run's config.json")
    for name in args.variants:
        for seed in args.seeds:
            out = args.out / name / f"seed{seed}"
            if (out / "summary.json").exists():
                continue
            config = dict(base, seed=seed, hparams={**base["hparams"], **VARIANTS[name]})
            summary = run_experiment(RunConfig(**config), out, quiet=True)
            print(name, seed, json.dumps(summary["targets"]), flush=True)


if __name__ == "__main__":
    main()
