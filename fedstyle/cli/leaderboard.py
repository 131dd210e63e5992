"""``fedstyle leaderboard run`` (the grid, resumable, its per-seed CSVs kept) and ``fedstyle leaderboard show``
(the tables, ranks and diagram rendered from the committed CSVs, no training)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
The leaderboard: every method side by side on every leave-one-domain-out target of digits4 and
fashion4, seeds 0-2, in three tables: multi-source star (every star method of the registry and one
ablation row, one client per source domain), peer to peer (DSGD, DSGD + MixStyle, DSGD + DSU, StyleDDG on
StyleDDG's graph) and single source (FedGCA, its paper's baselines and one ablation row, each domain the one
source). The tables are sweep files, benchmarks/leaderboard/*.toml; each run's result is kept in
benchmarks/per_seed/leaderboard-*.csv, and the leaderboard is rendered from those files only."""

RUN_EPILOG = """\
examples:
  fedstyle leaderboard run --dry-run                      every run validated; runs left; CPU hours estimated
  fedstyle leaderboard run --workers 2                    run what the CSVs lack (resumable: run it again)
  fedstyle leaderboard run --only multi_source --only variant=fedavg,ccst --device cuda --workers 12
  fedstyle leaderboard run --export-only                  only merge finished run folders into the CSVs
  fedstyle sweep benchmarks/leaderboard/p2p.toml --set rounds=16 --device cuda --workers 8 --out /tmp/p2p
  fedstyle leaderboard export p2p /tmp/p2p                a plain sweep's runs into the table's CSV
"""


def _split_only(items: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``--only`` words: a table's name, or KEY=V1,V2 (a crossed key's values, as in `fedstyle sweep --only`)."""
    from fedstyle.cli.sweep import _only

    tables = [item for item in items if "=" not in item]
    return tables, _only([item for item in items if "=" in item])


def _cmd_run(args: argparse.Namespace) -> int:
    from fedstyle.cli.flags import stop_on_sigterm
    from fedstyle.experiments.grid import parse_override
    from fedstyle.experiments.leaderboard.cost import CostModel
    from fedstyle.experiments.leaderboard.run import check_only, dry_run_lines, plan_table, run_table
    from fedstyle.experiments.leaderboard.tables import load_tables
    from fedstyle.experiments.sweep import LocalLauncher

    from fedstyle.errors import ConfigError
    from fedstyle.experiments.leaderboard.tables import CSV_DIR

    launcher = LocalLauncher(args.workers)  # --workers checked first, for a dry run too
    tables, only = _split_only(args.only)
    overrides = [parse_override(item) for item in args.overrides]
    if overrides and not args.dry_run and Path(args.csv_dir).resolve() == CSV_DIR.resolve():
        raise ConfigError("--set changes the tables' settings, and the kept CSVs hold the tables' own settings only: "
                          "give --csv-dir DIR (and --runs DIR) for such runs")
    plans = []
    chosen = load_tables(tables, args.grid_dir)
    check_only([table.grid(overrides, args.device) for table in chosen], only)
    for table in chosen:
        if table.stale:
            print(f"fedstyle: note: {table.path} lacks the registry's rows of now ({', '.join(table.added)}); run "
                  "`fedstyle leaderboard grid --write` to write them (this run uses them anyway)", file=sys.stderr)
        planned = plan_table(table, args.runs, only=only, overrides=overrides, device=args.device,
                             csv_dir=args.csv_dir, progress=not args.quiet)
        if planned is None:
            print(f"{table.key}: --only leaves it no run", file=sys.stderr)
            continue
        plans.append(planned)
    if args.dry_run:
        cost = CostModel.load(args.grid_dir / "cost.json")
        for planned in plans:
            cost.learn_finished(planned.table.key, planned.csv_lines)
        for line in dry_run_lines(plans, cost.run_seconds):
            print(line)
        print(f"estimate's basis ({cost.date}): {' '.join(cost.basis.split())}")
        return 0
    if not args.export_only:
        from fedstyle.devices import require_devices

        require_devices(run.config.device for planned in plans for run in planned.to_run
                        if run.status != "done")  # a finished run in its folder is only exported
    stop_on_sigterm()
    failed = 0
    for planned in plans:
        outcome, path, added = run_table(planned, launcher, quiet=args.quiet, csv_dir=args.csv_dir,
                                         export_only=args.export_only, overrides=overrides)
        failed += len(outcome.failed) if outcome else 0
        print(f"{planned.table.key}: {added} finished runs merged into {path}")
    if failed:
        print(f"fedstyle: error: {failed} run(s) failed (tracebacks in each table's sweep.log under {args.runs}); "
              "fix the cause and run the same command again", file=sys.stderr)
    return 1 if failed else 0


def _cmd_export(args: argparse.Namespace) -> int:
    from fedstyle.experiments.leaderboard.run import export_runs
    from fedstyle.experiments.leaderboard.tables import load_table

    from fedstyle.experiments.grid import parse_override

    table = load_table(args.table, args.grid_dir)
    overrides = [parse_override(item) for item in args.overrides]
    for root in args.roots:
        path, merged = export_runs(table, root, args.csv_dir, csv=args.csv, overrides=overrides)
        print(f"{table.key}: {merged} finished runs below {root} merged into {path}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    import time

    from fedstyle.experiments.leaderboard.page import (check_markers, load_boards, load_claims, terminal_text,
                                                       write_show)

    start = time.perf_counter()
    check_markers(args.out, args.readme)  # before the page and figures are written
    boards = load_boards(args.grid_dir, args.csv_dir)
    claims = load_claims(boards, args.grid_dir, args.csv_dir)
    if not args.quiet:
        print(terminal_text(boards, claims))
    written = write_show(args.out, args.grid_dir, args.csv_dir, figures=not args.no_figures, boards=boards,
                         claims=claims)
    page, made = written[0], [p for p in written[1:] if p.parent == Path(args.out) and p.name.startswith("leaderboard")]
    edited = [p for p in written[1:] if p not in made]  # tracked pages changed between their markers
    print(f"wrote {page} and {len(made)} files beside it (each table's CSV and LaTeX"
          f"{'' if args.no_figures else ', its rank diagram as PNG and PDF'})")
    for path in edited:
        print(f"updated {path}")
    if args.readme:
        from fedstyle.cli import catalog
        from fedstyle.experiments.leaderboard.page import write_readme

        family_of = {name: entry["family"] for name, entry in catalog.load()["methods"].items()}
        changed = write_readme(args.readme, family_of, args.grid_dir, args.csv_dir, boards=boards, claims=claims)
        print(f"updated in {args.readme}: {', '.join(changed)}" if changed else f"unchanged: {args.readme}")
    print(f"rendered from the CSVs in {time.perf_counter() - start:.1f} s")
    return 0


def _cmd_grid(args: argparse.Namespace) -> int:
    from fedstyle.experiments.leaderboard.tables import load_tables, write_tables

    if args.write:
        changed = write_tables(args.grid_dir)
        print("\n".join(f"wrote {path}" for path in changed) or "every sweep file has the registry's rows already")
        return 0
    stale = []
    for table in load_tables(grid_dir=args.grid_dir):
        print(f"{table.key}: {len(table.rows())} rows ({len(table.added)} from the registry), {table.path}"
              + (" — lags behind the registry" if table.stale else ""))
        for method, reason in table.excluded.items():
            print(f"    excluded {method}: {reason}")
        stale += [table] if table.stale else []
    if stale:
        print("fedstyle: run `fedstyle leaderboard grid --write` to bring the sweep files up to date", file=sys.stderr)
    return 1 if stale else 0


def add_leaderboard_command(sub: argparse._SubParsersAction) -> None:
    from fedstyle.experiments.leaderboard.tables import CSV_DIR, GRID_DIR

    board = sub.add_parser("leaderboard", help="every method side by side: run the grid, or render it from the CSVs",
                           description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    board_sub = board.add_subparsers(dest="leaderboard_command", required=True)
    run = board_sub.add_parser("run", help="run the grid's runs its CSVs lack (resumable), merge them into the CSVs",
                               description=DESCRIPTION, epilog=RUN_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--only", action="append", default=[], metavar="TABLE|KEY=V1,V2",
                     help="a table (multi_source, p2p, single_source) or a crossed key's values (variant=fedavg,ccst; "
                     "seed=0; target=mnist; dataset=digits4); repeatable")
    run.add_argument("--workers", type=int, default=1, help="runs at once on this machine (default 1)")
    run.add_argument("--device", help="cpu, cuda, auto for every run (the same settings wherever it runs; float "
                     "rounding moves a cell about half as much as a new seed: docs/results/index.md#machines)")
    run.add_argument("--dry-run", action="store_true",
                     help="validate every run, print how many each table has, holds and lacks, and the CPU hours")
    run.add_argument("--export-only", action="store_true", help="run nothing; merge finished run folders into the CSVs")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="change a setting of every run (a pipeline check: --set rounds=1); NOT for the leaderboard's "
                     "CSVs, whose runs must share the tables' settings")
    run.add_argument("--runs", type=Path, default=Path("runs/leaderboard"), help="the run folders' root "
                     "(default runs/leaderboard; a table's runs under ROOT/<table>)")
    run.add_argument("--grid-dir", type=Path, default=GRID_DIR, help="the tables' sweep files (default: %(default)s)")
    run.add_argument("--csv-dir", type=Path, default=CSV_DIR, help="the per-seed CSVs (default: %(default)s)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)

    export = board_sub.add_parser("export", help="merge the finished runs of a sweep of a table's file into its CSV")
    export.add_argument("table", help="multi_source, p2p or single_source")
    export.add_argument("roots", nargs="+", type=Path, metavar="OUT", help="the sweep's --out folder(s)")
    export.add_argument("--grid-dir", type=Path, default=GRID_DIR,
                        help="the tables' sweep files (default: %(default)s)")
    export.add_argument("--csv-dir", type=Path, default=CSV_DIR, help="the per-seed CSVs (default: %(default)s)")
    export.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="the --set the sweep ran with (repeatable): its runs are checked against the table's "
                        "settings with these changes (the number of rounds is read from the runs)")
    export.add_argument("--csv", metavar="NAME", help="merge into CSV_DIR/NAME.csv instead of the table's (the "
                        "budget's FedAvg runs: --csv leaderboard-budget)")
    export.set_defaults(func=_cmd_export)

    from fedstyle.experiments.leaderboard.page import DEFAULT_OUT

    show = board_sub.add_parser("show", help="render the tables, ranks, diagrams and claims from the kept CSVs",
                                description="Render the leaderboard from the kept per-seed CSVs only (no training, no "
                                "data): DIR/leaderboard.md (tables, ranks, missing cells, the papers' claims at a "
                                "glance), and per table DIR/leaderboard-<table>.csv and .tex and the "
                                "critical-difference diagram DIR/leaderboard-cd-<table>.png and .pdf; between their "
                                "markers, the claims at a glance in DIR/index.md, each method card's rows in "
                                "DIR/../methods/<method>.md and each paper's claim on its results page "
                                "(<!-- leaderboard-claim:PAPER:start --> ... :end --> in DIR/*.md).")
    show.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder written (default: %(default)s)")
    show.add_argument("--grid-dir", type=Path, default=GRID_DIR, help="the tables' sweep files (default: %(default)s)")
    show.add_argument("--csv-dir", type=Path, default=CSV_DIR, help="the per-seed CSVs (default: %(default)s)")
    show.add_argument("--no-figures", action="store_true", help="no diagrams (the page only)")
    show.add_argument("--quiet", action="store_true", help="print only what was written, not the tables")
    show.add_argument("--readme", type=Path, metavar="README.md", help="also write, between the file's markers: the "
                      "multi-source table and its summary (<!-- leaderboard:start --> ... :end -->), each method "
                      "family's leading row (<!-- leading:FAMILY:start --> ... :end -->) and the papers' claims "
                      "(<!-- readme-claims:start --> ... :end -->)")
    show.set_defaults(func=_cmd_show)

    grid = board_sub.add_parser("grid", help="the tables' rows; --write puts the registry's rows into the sweep files")
    grid.add_argument("--write", action="store_true", help="write each sweep file's section of registry rows")
    grid.add_argument("--grid-dir", type=Path, default=GRID_DIR, help="the tables' sweep files (default: %(default)s)")
    grid.set_defaults(func=_cmd_grid)
