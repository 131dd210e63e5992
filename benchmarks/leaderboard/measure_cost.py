"""Measure what one leaderboard run costs, per table and row, for `fedstyle leaderboard run --dry-run`'s estimate.

Per table: one run of every row with 1 round (digits4, the first target or source, seed 0), and one run of the
table's reference row (its plain baseline: FedAvg, DSGD) with the whole budget on each dataset. The estimate of a
row's run on a dataset is then
    s/run(row, D) = s(row, 1 round) x s(reference, whole run on D) / s(reference, 1 round) x rounds / whole rounds,
i.e. the reference's measured ratio of a whole run on D to one round on digits4, applied to every row, and scaled
in proportion to the rounds a run has (the whole run is measured at --whole-rounds, default 8). Measuring the whole
run per dataset matters: evaluation is most of a run, and fashion4's domains hold 17,500 images, digits4's 2,500 to
5,000. It over-counts a method with a one-time setup (CCST's stylization: counted in every round), so it is an
upper bound for those: each run makes its method's derived copies afresh (a cache of its own without
CCST's and PARDON's transfers, client styles and FedDG-FFT's copies; the decoded datasets are shared), as a
grid run of a new seed makes them. Seconds are the process's CPU seconds (torch on one thread), steadier than
wall time on a shared machine; CPU hours on an idle core are about the same as wall hours there.

    PYTHONPATH=. python benchmarks/leaderboard/measure_cost.py [--tables multi_source p2p single_source]
        -> benchmarks/leaderboard/cost.json
    PYTHONPATH=. python benchmarks/leaderboard/measure_cost.py --tables multi_source --rows NEW_ROW
        (a new row's one round only; the rest of the table's record kept)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's fedstyle

import torch  # noqa: E402

from fedstyle.data.cache import CACHE_ENV, DERIVED_KINDS, cache_dir  # noqa: E402
from fedstyle.errors import ConfigError  # noqa: E402
from fedstyle.io import atomic_write_text, json_text  # noqa: E402
from fedstyle.experiments.grid import plan_grid  # noqa: E402
from fedstyle.experiments.leaderboard.tables import load_table, read_meta  # noqa: E402
from fedstyle.experiments.runner import run_experiment  # noqa: E402

HERE = Path(__file__).resolve().parent
#: the reference row of a table (its plain baseline), the first one it has
REFERENCES = ("fedavg", "dsgd")
#: the cache the runs share their decoded datasets with (read before any run points CACHE_ENV elsewhere)
USER_CACHE = cache_dir()


#: the weights among the cache's derived folders: a run reads them, never makes them
READ_ONLY_KINDS = ("style", "adain")
#: the cache's folders of per-run derived copies (CCST's, PARDON's, FedDG-FFT's, the client styles)
PER_RUN_COPIES = tuple(kind for kind in DERIVED_KINDS if kind not in READ_ONLY_KINDS)


def cold_copies_cache(root: Path, source: Path) -> Path:
    """A cache root at ``root`` that shares the decoded datasets and weights of the cache ``source`` (symbolic
    links) but holds no derived copies, so a measured round includes making them."""
    root.mkdir(parents=True)
    if source.is_dir():
        for entry in source.iterdir():
            if entry.name not in PER_RUN_COPIES:
                (root / entry.name).symlink_to(entry.resolve())
    return root


def cpu_seconds(config, scratch: Path) -> float:
    """One run's CPU seconds, with a cache of its own that lacks every derived copy (no run reads another's)."""
    name = f"run{time.monotonic_ns()}"
    os.environ[CACHE_ENV] = str(cold_copies_cache(scratch / f"cache-{name}", USER_CACHE))
    start = time.process_time()
    run_experiment(config, scratch / name, quiet=True)
    return time.process_time() - start


def first_digits4_runs(plan) -> dict[str, object]:
    """Each row's first run on digits4 (its first target or source): the run whose one round is measured."""
    first: dict[str, object] = {}
    for run in plan.runs:
        if run.config.dataset == "digits4":
            first.setdefault(run.variant, run.config)
    return first


def measure_rows(key: str, rows: list[str], scratch: Path, log, previous: dict) -> dict:
    """Only ``rows``' one-round seconds, measured afresh into the table's ``previous`` record (a new row's estimate,
    without measuring the table's other rows and its reference again)."""
    table = load_table(key)
    try:
        # no dataset filter: the single-source table crosses source domains, not datasets; planning is cheap
        plan = plan_grid(table.grid(overrides=[("rounds", 1), ("eval_every", 1), ("seeds", [0])]),
                         scratch / f"plan-{key}", only=[("variant", rows)])
    except ConfigError as error:  # an unknown row: the message lists the table's rows
        raise SystemExit(f"error: {error}") from None
    first = first_digits4_runs(plan)
    missing = sorted(set(rows) - set(first))
    if missing:
        raise SystemExit(f"error: the {key} table has no row {', '.join(missing)}: see {key}.toml's [[variant]] names")
    out = dict(previous, rows_one_round=dict(previous["rows_one_round"]))
    for variant, config in first.items():
        out["rows_one_round"][variant] = round(cpu_seconds(config, scratch), 2)
        log(f"{key} {variant}: {out['rows_one_round'][variant]} CPU s for 1 round")
    return out


def measure(key: str, scratch: Path, log, whole_rounds: int) -> dict:
    table = load_table(key)
    one_round = table.grid(overrides=[("rounds", 1), ("eval_every", 1), ("seeds", [0])])
    first = first_digits4_runs(plan_grid(one_round, scratch / f"plan-{key}"))
    rows = {}
    for variant, config in first.items():
        rows[variant] = round(cpu_seconds(config, scratch), 2)
        log(f"{key} {variant}: {rows[variant]} CPU s for 1 round")
    reference = next((v for v in REFERENCES if v in first), next(iter(first)))
    whole = plan_grid(table.grid(overrides=[("seeds", [0]), ("rounds", whole_rounds)]), scratch / f"whole-{key}",
                      only=[("variant", [reference])])
    configs: dict[str, object] = {}
    for run in whole.runs:  # the first target (or source) of every dataset
        configs.setdefault(run.config.dataset, run.config)
    full = {}
    for dataset, config in configs.items():
        full[dataset] = round(cpu_seconds(config, scratch), 2)
        log(f"{key} {reference}: {full[dataset]} CPU s for the whole budget on {dataset} ({config.rounds} rounds)")
    return {"rows_one_round": rows, "reference": reference, "reference_whole": full,
            "reference_rounds": whole_rounds, "reference_one_round": rows[reference]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", nargs="+", default=list(read_meta()))
    parser.add_argument("--out", type=Path, default=HERE / "cost.json")
    parser.add_argument("--whole-rounds", type=int, default=8, help="rounds of the reference's whole run (the "
                        "estimate scales it to a table's rounds in proportion)")
    parser.add_argument("--rows", nargs="+", metavar="VARIANT", help="measure only these rows of the one table in "
                        "--tables (a new row's estimate), keeping its other measurements")
    args = parser.parse_args()
    if args.rows and len(args.tables) != 1:
        parser.error("--rows names rows of one table: give one --tables")
    torch.set_num_threads(1)
    now, command = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), " ".join(["python"] + sys.argv)
    result = {"basis": __doc__.split("\n\n")[1].replace("\n", " "), "date": now, "machine": f"{platform.machine()}, "
              f"{platform.processor() or 'cpu'}, torch {torch.__version__}, 1 thread", "command": command, "tables": {}}
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    result["tables"] = previous.get("tables", {})  # measure some tables again, keep the others
    if args.rows:  # the file's date and command stay those of its whole measurement; the rows say their own
        result.update({k: previous[k] for k in ("date", "machine", "command") if k in previous})
    log = functools.partial(print, flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for key in args.tables:
            if args.rows:
                if key not in result["tables"]:
                    parser.error(f"--rows adds to a measured table; {key} has none yet: measure it whole first")
                table = measure_rows(key, args.rows, Path(scratch), log, result["tables"][key])
                table["rows_measured_later"] = dict(table.get("rows_measured_later", {}),
                                                    **{row: f"{now}: {command}" for row in args.rows})
                result["tables"][key] = table
            else:
                result["tables"][key] = measure(key, Path(scratch), log, args.whole_rounds)
            atomic_write_text(args.out, json_text(result, indent=1) + "\n")  # an interrupted run leaves the old file
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
