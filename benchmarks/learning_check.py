"""The learning check's and the term check's numbers (tests/test_learning.py): every registered method with its
defaults and every known regression (tests/learning.py REGRESSIONS), trained on digits3x with the check's budget
over several seeds, one torch thread per run.

Prints, per variant, the check's statistic (the late loss) per seed, its mean and seed-to-seed spread (sample
std), the spread of the statistic the check uses (a method the check trains on n seeds: std / sqrt(n)), the
method's ceiling and the distance to it in those spreads; then, per loss term of the methods the term check
probes, the ratio of its weighted gradient to the cross-entropy's per seed and its floor. ``--propose`` prints
the ceilings the check's rule gives (tests/learning.py CEILINGS). The test's docstrings summarise these tables.

Each finished run is one JSON line in ``--out`` (per-round losses, source-validation and target accuracies,
logged names and values, term ratios, CPU seconds), so a rerun only trains what is missing and ``--table-only``
reprints from the file.

    OMP_NUM_THREADS=1 python benchmarks/learning_check.py --variants gperxan --seeds 0 1 2 --workers 1
    OMP_NUM_THREADS=1 python benchmarks/learning_check.py --table-only --propose --write-fixture

After a change to a method's defaults, ``--variants METHOD [its regressions] --seeds 0 1 2 --rerun --propose
--write-fixture`` measures it again (the new rows replace the old ones in the tables) and prints its ceiling.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import learning  # noqa: E402  (tests/learning.py: the check's data, budget, variants and statistic)
from learning import BUDGET, REGRESSIONS, SHORT_BUDGET, Run, Variant, budget_of, seeds, sound  # noqa: E402
from loss_terms import FLOOR, TERMS, Probe  # noqa: E402  (tests/loss_terms.py: the term check)


#: which steps the term ratios of a row were read from (rows of an earlier probe are left out of the term table)
PROBED = "round 2, last 4 steps per client"


def variants(names: list[str] | None) -> list[Variant]:
    from fedstyle.algorithms import METHODS

    every = [sound(m) for m in sorted(METHODS.names())] + list(REGRESSIONS)
    if not names:
        return every
    known = {v.name: v for v in every}
    missing = [n for n in names if n not in known]
    if missing:
        raise SystemExit(f"unknown variant(s) {', '.join(missing)}; choose among {', '.join(known)}")
    return [known[n] for n in names]


def _budget_key(budget: dict) -> str:
    return json.dumps(budget, sort_keys=True)


def _one(root: str, variant_name: str, seed: int, budget: dict) -> dict:
    """Train one variant on one seed (in a worker process); a sound method the term check probes is probed
    as in the test (the probe only reads, see tests/loss_terms.py)."""
    import time

    variant = {v.name: v for v in variants(None)}[variant_name]
    terms = TERMS.get(variant.method)  # a method not yet declared there is measured without its terms
    probe = Probe(variant.method) if variant.name == variant.method and terms and terms.probed else None
    tick, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp, (probe.watching() if probe else nullcontext()):
        run = learning.train(Path(root), Path(tmp) / "run", variant, seed, budget)
    row = {"variant": variant_name, "seed": seed, "budget": budget, "seconds": time.perf_counter() - tick,
           "cpu_seconds": time.process_time() - cpu, **run.to_json()}
    if probe is not None:
        row["term_ratios"] = probe.median_ratios()
        row["term_probe"] = PROBED
    return row


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collect(rows: list[dict], budget_for) -> dict[str, dict[int, dict]]:
    """variant -> seed -> row, for the runs made with their variant's budget ``budget_for(variant name)`` (the
    last row of a repeated run wins)."""
    runs: dict[str, dict[int, dict]] = {}
    for row in rows:
        if _budget_key(row["budget"]) == _budget_key(budget_for(row["variant"])):
            runs.setdefault(row["variant"], {})[row["seed"]] = row
    return runs


def _late(by_seed: dict[int, dict]) -> list[float]:
    return [Run.from_json(by_seed[s]).late_loss for s in sorted(by_seed)]


def late_losses(runs: dict[str, dict[int, dict]]) -> dict[str, list[float]]:
    """variant -> late loss per seed (seed order), for every variant with at least two seeds."""
    return {name: _late(by_seed) for name, by_seed in runs.items() if len(by_seed) > 1}


def table(runs: dict[str, dict[int, dict]], ceilings: dict[str, float]) -> str:
    late = late_losses(runs)
    margin = learning.margins({k: v for k, v in late.items() if k.split(":")[0] in ceilings}, ceilings)
    lines = [f"statistic: mean training loss of the last {learning.LATE_ROUNDS} rounds, averaged over the check's n "
             "seeds; sd: per-run seed-to-seed std; spread = sd / sqrt(n); margin = (ceiling - mean) / spread for "
             "sound methods, (mean - ceiling) / spread for regressions (positive: the check decides right)",
             f"{'variant':45s} {'late loss per seed':36s} {'mean':>6s} {'sd':>6s} {'n':>2s} {'spread':>6s} "
             f"{'ceil':>6s} {'margin':>6s}  best source-val mean (sd)  target  cpu s"]
    for variant in variants(None):
        by_seed = runs.get(variant.name)
        if not by_seed or variant.name not in late:
            continue
        values = late[variant.name]
        n = len(seeds(variant.method))
        m, s = learning.mean_and_spread(values, n)
        best = [max(by_seed[k]["source_val"]) for k in sorted(by_seed)]
        target = [by_seed[k]["target"][-1] for k in sorted(by_seed) if by_seed[k].get("target")]
        cpu = [by_seed[k]["cpu_seconds"] for k in sorted(by_seed) if "cpu_seconds" in by_seed[k]]
        note = "  (not this check's: see its guard)" if variant.guard else ""
        lines.append(f"{variant.name:45s} {' '.join(f'{v:.3f}' for v in values):36s} {m:6.3f} "
                     f"{statistics.stdev(values):6.3f} {n:2d} {s:6.3f} {ceilings.get(variant.method, math.nan):6.3f} "
                     f"{margin.get(variant.name, math.nan):+6.1f}  {statistics.mean(best):.3f} "
                     f"({statistics.stdev(best):.3f})  {statistics.mean(target) if target else math.nan:6.3f}  "
                     f"{statistics.mean(cpu) if cpu else math.nan:5.0f}{note}")
    return "\n".join(lines)


def term_table(runs: dict[str, dict[int, dict]]) -> str:
    """Per probed term: its ratio per seed, the smallest, its floor and the smallest over the floor."""
    lines = [f"{'method':10s} {'term':14s} {'ratio per seed':44s} {'min':>8s} {'floor':>7s} {'min/floor':>9s}"]
    for method, terms in sorted(TERMS.items()):
        by_seed = runs.get(method, {})
        rows = [by_seed[s]["term_ratios"] for s in sorted(by_seed) if by_seed[s].get("term_probe") == PROBED]
        for name in [*terms.terms, *terms.own]:
            values = [r[name] for r in rows if name in r]
            if not values:
                continue
            floor = terms.floors.get(name, (FLOOR, ""))[0]
            dead = " (dead: see TERMS)" if name in terms.dead else ""
            lines.append(f"{method:10s} {name:14s} {' '.join(f'{v:.3g}' for v in values):44s} {min(values):8.3g} "
                         f"{floor:7.3g} {min(values) / floor:9.1f}{dead}")
    return "\n".join(lines)


def write_fixture(runs: dict[str, dict[int, dict]], budget: dict, short_budget: dict) -> None:
    """The measured numbers the checks' thresholds rest on, per variant and seed (the late loss, the best
    source-validation accuracy) and per probed method and seed (its terms' ratios), with the two budgets they
    were measured on (the methods with a regression on ``budget``, the others on ``short_budget``)."""
    fixture = {"budget": budget, "short_budget": short_budget, "late_loss": {}, "best_source_val": {},
               "term_ratios": {}}
    for name, by_seed in sorted(runs.items()):
        if len(by_seed) < 2:
            continue
        fixture["late_loss"][name] = {str(k): round(Run.from_json(by_seed[k]).late_loss, 5) for k in sorted(by_seed)}
        fixture["best_source_val"][name] = {str(k): round(max(by_seed[k]["source_val"]), 4) for k in sorted(by_seed)}
        ratios = {str(k): {t: float(f"{v:.4g}") for t, v in by_seed[k]["term_ratios"].items()}
                  for k in sorted(by_seed) if by_seed[k].get("term_probe") == PROBED}
        if ratios:
            fixture["term_ratios"][name] = ratios
    learning.FIXTURE.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("learning_check_results.jsonl"),
                        help="the runs, one JSON line each (default: the measured runs the checks' thresholds rest on)")
    parser.add_argument("--variants", nargs="*", help="variant names (default: every method and every regression)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", default="", help="overrides of the check's budgets (tests/learning.py BUDGET "
                        "and SHORT_BUDGET), NAME=VALUE,... (e.g. local_steps=10)")
    parser.add_argument("--propose", action="store_true", help="print the ceilings the rule gives (for CEILINGS)")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--write-fixture", action="store_true", help=f"write the late losses and term ratios per "
                        "seed to tests/fixtures/learning_check.json, which tests/test_learning.py checks CEILINGS and "
                        "the term floors against")
    parser.add_argument("--rerun", action="store_true", help="train the runs asked for even where --out has them "
                        "(the new row replaces the old one in the tables)")
    args = parser.parse_args()
    overrides = {}
    for item in filter(None, args.budget.split(",")):
        name, value = item.split("=", 1)
        overrides[name] = type(BUDGET[name])(value) if name in BUDGET else value
    budget, short_budget = {**BUDGET, **overrides}, {**SHORT_BUDGET, **overrides}
    method_of = {v.name: v.method for v in variants(None)}

    def budget_for(variant_name: str) -> dict:
        """The variant's method's budget (tests/learning.py budget_of) with the --budget overrides."""
        return {**budget_of(method_of[variant_name]), **overrides}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        done = set() if args.rerun else {(r["variant"], r["seed"], _budget_key(r["budget"])) for r in load(args.out)}
        todo = [(v.name, s) for v in variants(args.variants) for s in args.seeds
                if (v.name, s, _budget_key(budget_for(v.name))) not in done]
        os.environ["OMP_NUM_THREADS"] = "1"  # the spawned workers' torch reads it at import
        with tempfile.TemporaryDirectory() as tmp:
            root = learning.write_digits3x(Path(tmp) / "digits3x")
            with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = [pool.submit(_one, str(root), name, seed, budget_for(name)) for name, seed in todo]
                for future in as_completed(futures):
                    try:
                        row = future.result()
                    except Exception as error:  # one failed run does not lose the others
                        print(f"a run failed: {type(error).__name__}: {error}", flush=True)
                        continue
                    with args.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"{row['variant']} seed {row['seed']}: late loss {Run.from_json(row).late_loss:.3f}, best "
                          f"source-val {max(row['source_val']):.3f} ({row['cpu_seconds']:.0f} cpu s)", flush=True)
    runs = collect(load(args.out), budget_for)
    ceilings = learning.ceilings_by_rule(late_losses(runs)) if args.propose else learning.CEILINGS
    print(table(runs, ceilings))
    print()
    print(term_table(runs))
    if args.propose:
        print("CEILINGS = " + json.dumps(ceilings, indent=4))
    if args.write_fixture:
        write_fixture(runs, budget, short_budget)
        print(f"wrote {learning.FIXTURE}")


if __name__ == "__main__":
    main()
