"""``fedstyle sweep FILE.toml`` (a grid of runs) and ``fedstyle reproduce PAPER`` (a paper's table)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from fedstyle.experiments.verdict import RULE

SWEEP_DESCRIPTION = """\
Run a grid of runs written as a TOML file: every variant (a method with its hyperparameters)
crossed with seeds, held-out targets and any other setting given as a list. The whole grid is
checked before anything runs. Runs land in OUT/<variant>/<crossed keys>/seed<k>/<target>
(<crossed keys>: key=value,key=value for the crossed settings other than seeds and targets; left
out when nothing else is crossed); finished runs are skipped and interrupted ones resumed, so
running the same command again continues the sweep. A failed run is reported with its error and
does not stop the others (tracebacks in OUT/sweep.log); the exit status is 1 when a run failed or
was in use by another process. At the end OUT/report.md, report.csv and the plots are written (one
report per group when the grid crosses datasets, partitions or other run settings:
OUT/reports/<group>/, joined by OUT/report.md)."""

SWEEP_EPILOG = """\
a sweep file (grid.toml):
  description = "FedAvg vs MixStyle vs CCST on digits4, every domain held out"
  seeds = [0, 1, 2]                # crossed
  targets = "each"                 # every domain of the dataset in turn (or ["mnist", "syn"])
  lam = [0.0, 0.1]                 # any run setting as a list is crossed (report per value)
  out = "runs/grid"                # default --out

  [base]                           # a run config: the keys of `fedstyle run --config`
  dataset = "digits4"
  partition = "lambda"
  clients = 9
  rounds = 8
  local_steps = 15
  batch_size = 64

  [[variant]]                      # rows: name (its folder), method, hparams, any setting
  name = "fedavg"
  method = "fedavg"

  [[variant]]
  name = "mixstyle"
  method = "mixstyle"
  hparams = { style_p = [0.3, 0.5] }   # a list inside a variant is crossed for it only

  [[variant]]
  name = "ccst-k3"
  label = "CCST (overall, K=3)"    # the row's name in the report (default: name)
  method = "ccst"
  hparams = { style_type = "overall", k = 3 }

  # settings that go together are crossed as a bundle: a list of tables under a new name
  # split = [{ name = "s-p", targets = ["sketch"], val_domain = "photo" }, ...]

examples:
  fedstyle sweep grid.toml --dry-run              the runs, one line each, and how many are done
  fedstyle sweep grid.toml --workers 4            4 runs at once on this machine (several per GPU too)
  fedstyle sweep grid.toml --set rounds=2 --only variant=fedavg,ccst-k3 --out /tmp/try
  fedstyle sweep grid.toml --launcher ray         each run a Ray task on a local Ray instance
  fedstyle sweep grid.toml --launcher ray --address auto --gpus-per-run 0.25 --out /shared/runs/grid
                                                  on a running cluster (OUT on a shared filesystem)
"""

REPRODUCE_DESCRIPTION = """\
Run a paper's main table as a sweep on fedstyle's offline stand-in datasets and put the paper's
own numbers (its dataset named) beside fedstyle's, with a verdict per claim the paper makes (an
ordering of methods), read by fedstyle's rule (fedstyle/experiments/verdict.py):
""" + textwrap.fill(RULE.replace("**", ""), 100) + """
Presets are TOML files shipped in fedstyle/experiments/presets/ (`fedstyle reproduce --list`); PAPER
may also be a path to such a file. Same execution options as `fedstyle sweep`."""

FROM_SCRATCH = "from-scratch"

REPRODUCE_EPILOG = """\
examples:
  fedstyle reproduce --list
  fedstyle reproduce --list ccst                  its tracks, scales and rows
  fedstyle reproduce ccst                         the smoke scale: a first look, minutes on 2 CPU cores
  fedstyle reproduce ccst --track pretrained --scale small --workers 2
                                                  the paper's claims with an ImageNet-pretrained backbone
  fedstyle reproduce ccst --scale full --device cuda --workers 8
  fedstyle reproduce pardon --scale small          PARDON's Table II rows on digits4 -> mnistm, 3 seeds
  fedstyle reproduce fedgca --scale full --device cuda --workers 12
  fedstyle reproduce ccst --scale full --launcher ray --address auto --gpus-per-run 0.125 --out /shared/ccst
"""


def _execution_flags(parser: argparse.ArgumentParser, default_out: str) -> None:
    group = parser.add_argument_group("what to run")
    group.add_argument("--out", metavar="DIR",
                       help=f"output folder of the runs and the report (default: {default_out})")
    group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="change a setting of every run ([base]), or replace a crossed key's list: --set rounds=2, "
                       "--set hparams.style_backend=fft, --set seeds=[0,1] (repeatable)")
    group.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                       help="keep only these values of a crossed key: variant, seed, target or a crossed setting "
                       "(repeatable); a variant is named by its method (all its rows), its name or its row label")
    group.add_argument("--device", help="cpu, cuda, cuda:1 or auto for every run (a finished run is reused whatever "
                       "its device)")
    group.add_argument("--dry-run", action="store_true", help="print the runs, one line each, and how many are done; "
                           "run nothing")
    group.add_argument("--report-only", action="store_true", help="write the report of the finished runs; run nothing")
    group.add_argument("--quiet", action="store_true", help="no progress bar (failures are still reported)")
    where = parser.add_argument_group("where to run")
    where.add_argument("--workers", type=int, default=None,
                       help="runs at once on this machine, as spawned processes with an equal share of the CPU "
                       "threads (several fit on one GPU for small models; default 1)")
    where.add_argument("--launcher", choices=("local", "ray"), default="local",
                       help="local: this machine (--workers); ray: each run a Ray task (needs "
                       "pip install -c constraints.txt 'fedstyle[flower-sim]')")
    where.add_argument("--address", metavar="ADDR",
                       help="with --launcher ray: auto joins the running cluster of this machine, HOST:PORT a head "
                       "node; default: start a local Ray instance. Every node must see --out at the same path (shared "
                       "filesystem) and have fedstyle installed")
    where.add_argument("--cpus-per-run", type=float, default=None, help="with --launcher ray: CPUs per run (default 1)")
    where.add_argument("--gpus-per-run", type=float, default=None,
                       help="with --launcher ray: GPUs per run, fractions share a GPU (0.25: four runs per GPU; "
                       "default 0)")


def make_launcher(args: argparse.Namespace):
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.sweep import LocalLauncher, RayLauncher

    if args.launcher == "ray":
        if args.workers is not None:
            raise ConfigError("--workers is for --launcher local; with Ray, --cpus-per-run/--gpus-per-run decide how "
                              "many runs share the cluster")
        return RayLauncher(args.address, args.cpus_per_run or 1.0, args.gpus_per_run or 0.0)
    given = [flag for flag, value in (("--address", args.address), ("--cpus-per-run", args.cpus_per_run),
                                      ("--gpus-per-run", args.gpus_per_run)) if value is not None]
    if given:
        raise ConfigError(f"{given[0]} is for --launcher ray")
    return LocalLauncher(1 if args.workers is None else args.workers)  # 0 is refused there, not read as 1


def _only(items: list[str]) -> list[tuple[str, list[str]]]:
    from fedstyle.errors import ConfigError

    out = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ConfigError(f"--only expects KEY=V1,V2, got {item!r} (e.g. --only variant=fedavg,ccst)")
        out.append((key.strip(), [v.strip() for v in values.split(",") if v.strip()]))
    return out


def _overrides(args: argparse.Namespace) -> list[tuple[str, object]]:
    from fedstyle.experiments.grid import parse_override

    overrides = [parse_override(item) for item in args.overrides]
    if args.device:
        overrides.append(("device", args.device))
    return overrides


def _run(grid, out: Path, args: argparse.Namespace) -> int:
    from fedstyle.experiments.report import to_text
    from fedstyle.experiments.sweep import dry_run, plan_grid, run_plan

    from fedstyle.cli.names import resolve_variants

    from fedstyle.errors import ConfigError

    if out.exists() and not out.is_dir():  # a dry run too: its plan names folders below --out
        raise ConfigError(f"--out {out} is a file; give the folder the sweep's runs go to")
    launcher = make_launcher(args)
    only = [(key, resolve_variants(values, grid.variants, grid.where) if key == "variant" else values)
            for key, values in _only(args.only)]
    # a dry run lists the runs even where the data is not there yet (marked), so a plan can be read before a download
    plan = plan_grid(grid, out, progress=not args.quiet, only=only, without_data=args.dry_run)
    if args.dry_run:
        dry_run(plan)
        return 0
    if args.launcher != "ray" and not args.report_only:
        from fedstyle.devices import require_devices

        # this machine runs them (a Ray cluster's nodes may differ)
        require_devices(run.config.device for run in plan.runs if run.status != "done")
    if args.report_only and not any(run.status == "done" for run in plan.runs):  # it wrote an empty report, exit 0
        raise ConfigError(f"none of the {len(plan.runs)} runs under {plan.out} has finished yet: nothing to report; "
                          "run the sweep without --report-only")
    try:
        outcome, reports = run_plan(plan, launcher, quiet=args.quiet, report_only=args.report_only)
    except KeyboardInterrupt:
        print("\ninterrupted; finished runs are kept and interrupted ones resume: run the same command again",
              file=sys.stderr)
        raise
    for report in reports:
        for warning in report.warnings:
            print(f"fedstyle: warning: {warning}", file=sys.stderr)
        if report.table is None:
            continue
        if len(reports) > 1:
            print(f"\n== {', '.join(f'{k} {v}' for k, v in report.group)} ==")
        print(to_text(report.table))
        for v in report.verdicts:
            print(f"  claim {v.claim}: {v.status} ({v.text})")
    written = [report.paths.get("markdown") for report in reports if report.paths]
    if len(reports) > 1:
        written.insert(0, plan.out / "report.md")
    for path in written:
        print(f"wrote {path}")
    missing = sum(r.planned - r.finished for r in reports)
    if not args.report_only:
        print(f"{len(outcome.finished)} runs ran in {outcome.seconds:.0f} s; {len(plan.runs) - missing} of "
              f"{len(plan.runs)} finished; {len(outcome.failed)} failed; {len(outcome.locked)} in use elsewhere")
    if outcome.failed:
        from fedstyle.experiments.rundir import diverged_note

        # the folder's diverged.txt, or (diverged before its first checkpoint: the folder is gone) the error's words
        diverged = [r for r in outcome.failed if diverged_note(r.run_dir) or "diverged" in r.error]
        if len(diverged) < len(outcome.failed):
            print(f"fedstyle: error: {len(outcome.failed) - len(diverged)} run(s) failed (tracebacks in "
                  f"{plan.out / 'sweep.log'}); fix the cause and run the same command again to finish them",
                  file=sys.stderr)
        if diverged:  # running the same command again repeats a divergence: the settings must change
            print(f"fedstyle: error: {len(diverged)} run(s) diverged, e.g. {diverged[0].name}: {diverged[0].error}; "
                  "running them again repeats it: lower their lr in the sweep file (or --set lr=...), into another "
                  "--out or after deleting their folders", file=sys.stderr)
    if outcome.locked:
        print(f"fedstyle: {len(outcome.locked)} run(s) are being run by another process; run the same command "
              "again after it ends to report them", file=sys.stderr)
    return 0 if outcome.ok else 1


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedstyle.cli.flags import stop_on_sigterm
    from fedstyle.experiments.grid import load_grid

    stop_on_sigterm()
    grid = load_grid(args.file, scale=args.scale, overrides=_overrides(args), track=args.track)
    out = Path(args.out or grid.out or Path("runs") / Path(args.file).stem)
    return _run(grid, out, args)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from fedstyle.cli.flags import stop_on_sigterm
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.paper import list_presets, preset_path

    if args.list:
        from fedstyle.cli.listing import preset_detail, preset_lines

        presets = list_presets()
        tracks = {t for _, data in presets for t in data.get("tracks", {})}
        if args.track not in (None, FROM_SCRATCH) and args.track not in tracks:
            raise ConfigError(f"--track {args.track!r} is no preset's track; the tracks are {FROM_SCRATCH}"
                              + "".join(f", {t}" for t in sorted(tracks)))
        if args.paper:
            import tomllib

            path = preset_path(args.paper)
            print("\n".join(preset_detail(path.stem, tomllib.loads(path.read_text()))))
        else:
            print("\n".join(preset_lines(presets)))
        return 0
    if not args.paper:
        raise ConfigError("name a paper (`fedstyle reproduce --list` shows them), e.g. fedstyle reproduce ccst")
    stop_on_sigterm()
    path = preset_path(args.paper)
    from fedstyle.experiments.grid import parse_grid, read_toml  # imports every method, and torch

    if args.data_root or args.dataset:
        from fedstyle.cli.real_data import reproduce_paper_setting

        return reproduce_paper_setting(args, path, _overrides(args), _run)
    args.scale = args.scale or "smoke"
    track = None if args.track in (None, FROM_SCRATCH) else args.track
    grid = parse_grid(read_toml(path), f"preset {args.paper}", scale=args.scale, overrides=_overrides(args),
                      track=track)
    folder = f"{path.stem}-{track}-{args.scale}" if track else f"{path.stem}-{args.scale}"
    out = Path(args.out or Path("runs") / "reproduce" / folder)
    return _run(grid, out, args)


def add_sweep_commands(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser("sweep", help="run a grid of runs from a TOML file (locally or on Ray) and report it",
                           description=SWEEP_DESCRIPTION, epilog=SWEEP_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_argument("file", metavar="FILE.toml", help="the sweep file")
    sweep.add_argument("--scale", help="the scale to run, for a file with [scales.NAME] tables")
    sweep.add_argument("--track", help="the track to run, for a file with [tracks.NAME] tables (default: the file's "
                       "own settings)")
    _execution_flags(sweep, "the file's `out`, else runs/<file name>")
    sweep.set_defaults(func=_cmd_sweep)

    reproduce = sub.add_parser("reproduce", help="a paper's main table on fedstyle's datasets, its claims checked",
                               description=REPRODUCE_DESCRIPTION, epilog=REPRODUCE_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    reproduce.add_argument("paper", nargs="?", metavar="PAPER", help="a preset name (see --list) or a preset file")
    reproduce.add_argument("--list", action="store_true", help="the presets, one line each; with PAPER its tracks, "
                           "scales, rows and the paper's numbers")
    reproduce.add_argument("--scale", default=None,
                           help="smoke (minutes on 2 CPU cores), small, full (the benchmark's setting); default smoke "
                           "(with --data-root or --dataset: full, the paper's setting)")
    reproduce.add_argument("--track", default=FROM_SCRATCH,
                           help=f"{FROM_SCRATCH} (default: a small network trained from scratch, the benchmark "
                           "tables' setting), pretrained (an ImageNet-pretrained EfficientNet-Lite0 fine-tuned with "
                           "the paper's optimiser, closer to the papers; slower) or paper-<dataset> (the paper's own "
                           "setting on the real data: see --data-root); `fedstyle reproduce --list PAPER` lists a "
                           "preset's tracks, e.g. CCST's pretrained-batchstats and pretrained-fixbn")
    _execution_flags(reproduce, "runs/reproduce/<paper>-<scale>, or <paper>-<track>-<scale>")
    from fedstyle.cli.real_data import REAL_DATA_EPILOG, add_real_data_flags

    add_real_data_flags(reproduce)
    reproduce.epilog += REAL_DATA_EPILOG
    reproduce.set_defaults(func=_cmd_reproduce)
