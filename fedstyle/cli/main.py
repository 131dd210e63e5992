"""The ``fedstyle`` command line."""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from pathlib import Path

from fedstyle.cli.flags import (
    add_run_flags,
    check_resume_flags,
    check_run_names,
    config_from_args,
    fetch_pretrained_weights,
    print_summary,
    resume_settings,
    stop_on_sigterm,
)
from fedstyle.cli.parser import FedstyleParser
from fedstyle.errors import FedstyleError

RUN_USAGE = """fedstyle run --method NAME [--hp NAME=VALUE ...] [RUN SETTINGS ...] --out DIR
       fedstyle run --config FILE.toml [RUN SETTINGS ...] --out DIR
       fedstyle run --resume DIR [--restart] [--quiet]"""

RUN_EXAMPLES = """\
Train one federated configuration; writes config.json, partition.json, metrics.jsonl, a checkpoint,
summary.json and finally `done` into --out. --method takes a method name (`fedstyle methods`, any case),
a preset's variant name or a row label (`fedstyle reproduce --list PAPER`).

examples:
  # what a run would train on (model, budget, domains, clients), nothing trained or written
  fedstyle run --method ccst --dataset folder --data-root my_images --target site_b --dry-run
  # leave MNIST out; 6 single-domain clients, half of them each round
  fedstyle run --method fedavg --dataset digits4 --target mnist --partition per_domain \\
      --clients 6 --fraction 0.5 --rounds 2 --out runs/x
  # a method's own hyperparameters
  fedstyle run --method fedprox --hp mu=0.01 --target syn --out runs/prox
  # FedBN + MixStyle, i.e. local options composed on any method
  fedstyle run --method fedbn --hp style=mixstyle --target syn --out runs/bn-ms
  # peer-to-peer DSGD on a random geometric graph of 9 devices
  fedstyle run --method dsgd --topology rgg --radius 0.8 --partition per_domain --clients 9 --target mnist --out runs/p2p
  # a TOML file (flags given as well override it); [hparams] holds the method's options
  fedstyle run --config exp.toml --seed 1 --out runs/s1
  # continue an interrupted run (Ctrl-C or killed) from its last checkpoint
  fedstyle run --resume runs/x
  # a preset's row by its variant name: CCST with overall styles, K = 3
  fedstyle run --method ccst-overall-k3 --target syn --out runs/ccst
"""

MAIN_EPILOG = """\
a 5-minute tour:
  fedstyle demo                       leave-one-domain-out on digits4, FedAvg vs MixStyle vs CCST, table + plot
  fedstyle data list                  datasets (built-in and folder benchmarks)
  fedstyle data show digits4          PNG grid: a row per domain, a column per class
  fedstyle data download pacs --data-root data   PACS, VLCS, Office-Home, DomainNet ... fetched and verified
  fedstyle methods                    every method, one line each; `fedstyle methods NAME` its hyperparameters
  fedstyle leaderboard show           which method to use: every method side by side, the papers' claims judged
  fedstyle run --help                 train one configuration into a run directory
  fedstyle report runs/*              the papers' table (mean ± std over seeds) + CSV + plot
  fedstyle sweep --help               a grid of runs from one TOML file, on this machine or a Ray cluster
  fedstyle reproduce --list           a paper's table on the offline datasets, its claims checked
  fedstyle cache                      what the cache holds; `fedstyle cache clear ccst` frees stylized copies
  fedstyle deploy --help              the same runs on a real Flower federation (SuperLink + SuperNodes, TLS)
  fedstyle style demo                 PNG grid: digits restyled to every domain's style (offline AdaIN)
"""


#: `fedstyle cache clear`'s kinds, written here because --help must not import torch (fedstyle.data.cache does);
#: tests/test_cli_instant.py checks it against fedstyle.data.cache.DERIVED_KINDS
CACHE_KINDS = ("datasets", "ccst", "pardon", "client_styles", "feddg_fft", "style", "adain")


def _cmd_run(args: argparse.Namespace) -> int:
    from fedstyle.errors import ConfigError

    if not args.resume:
        check_run_names(args)  # names and options refused here, before torch is imported
    from fedstyle.experiments.runner import resume_experiment, run_experiment

    stop_on_sigterm()
    if args.dry_run and args.resume:
        raise ConfigError("--dry-run says what a new run would train on; --resume DIR continues one: give one of them")
    if args.restart and not args.resume:
        raise ConfigError("--restart starts a run directory over; give it with --resume DIR")
    if args.resume:
        check_resume_flags(args)
        summary = resume_experiment(args.resume, quiet=args.quiet, restart=args.restart, **resume_settings(args))
        out = Path(args.resume)
    elif args.dry_run:
        from fedstyle.experiments.preview import preview_run

        print(preview_run(config_from_args(args), progress=not args.quiet))
        print("nothing trained or written; drop --dry-run (and give --out DIR) to train it")
        return 0
    else:
        if not args.out:
            raise ConfigError("give --out DIR for the run directory (or --resume DIR to continue one)")
        config = config_from_args(args)
        if args.download:
            fetch_pretrained_weights(config, quiet=args.quiet)
        summary = run_experiment(config, args.out, quiet=args.quiet)
        out = Path(args.out)
    print_summary(summary, out)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fedstyle.cli.names import row_resolver
    from fedstyle.experiments.report import collect, plan_rows, results_table, to_text, write_report
    from fedstyle.experiments.verdict import claim_rows, judge_labelled_claims, parse_ordering

    for claim in args.claim:  # a malformed claim is refused before any run is read
        parse_ordering(claim)
    runs = [Path(p) for p in args.runs]
    resolve = None
    if args.claim:  # every claim checked before anything is written
        records = collect(runs)
        table = results_table(records, args.which)
        row_of = plan_rows([r for r in records if r.dataset == table.dataset]).row_of
        row_methods: dict[str, set[str]] = {}
        for record in records:
            if record.path in row_of:
                row_methods.setdefault(row_of[record.path], set()).add(record.summary.get("method", ""))
        resolve = row_resolver([row.label for row in table.rows], row_methods)
        claim_rows(table, args.claim, resolve)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table, paths = write_report(runs, Path(args.out), which=args.which)
    for message in dict.fromkeys(str(w.message) for w in caught):
        if message != table.warning:  # that one is printed under the table
            _plain_warning(message, UserWarning, "", 0)
    print(to_text(table))
    if args.claim:
        lines = judge_labelled_claims(table, args.claim, Path(args.out) / "claims.json", resolve)
        print("\n".join(lines))
        paths["claims"] = Path(args.out) / "claims.json"
    for p in paths.values():
        print(f"wrote {p}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from fedstyle.experiments.demo import run_demo

    run_demo(Path(args.out), quiet=args.quiet, rounds=args.rounds, device=args.device,
             ccst_style_backend=args.ccst_backend)
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from fedstyle.cli.listing import method_detail, method_lines

    print("\n".join(method_detail(args.name) if args.name else method_lines()))
    return 0


def _cmd_data_list(args: argparse.Namespace) -> int:
    from fedstyle.cli import catalog

    for name, entry in sorted(catalog.load()["datasets"].items()):
        print(f"{name:12s} {entry['description']}")
    print(f"{'hf:OWNER/NAME':12s} a Hugging Face image dataset with a domain column, from its cache (e.g. "
          "hf:flwrlabs/pacs; pip install 'fedstyle[hf]')")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from fedstyle.data.cache import DERIVED_KINDS, cache_dir, cache_usage, clear_cache
    from fedstyle.errors import ConfigError

    if args.cache_command == "clear":
        kinds = ["datasets", *DERIVED_KINDS] if args.all else args.kinds
        if not kinds:
            raise ConfigError("name what to clear (e.g. `fedstyle cache clear ccst`) or give --all")
        print(f"freed {clear_cache(kinds) / 1e6:,.1f} MB in {cache_dir()}")
        return 0
    print(f"cache: {cache_dir()}  (set FEDSTYLE_CACHE to move it)")
    descriptions = {"datasets": "decoded datasets (uint8 arrays)", **DERIVED_KINDS}
    for kind, (entries, size) in cache_usage().items():
        print(f"  {kind:<10} {entries:>5} entries {size / 1e6:>10,.1f} MB   {descriptions[kind]}")
    return 0


def _cmd_data_show(args: argparse.Namespace) -> int:
    from fedstyle.data import load_dataset, save_grid

    # a grid draws from every image: official splits play no part (and hf:DIR's extra splits need no flag here)
    dataset = load_dataset(args.name, data_root=args.data_root, resolution=args.resolution,
                           skip_bad_images=args.skip_bad_images, progress=not args.quiet, official_splits=False)
    default = f"{args.name.replace(':', '-').replace('/', '--')}.png"  # hf:OWNER/NAME: one file
    out = Path(args.out or default)
    if out.is_dir():  # --out DIR: the grid goes inside it, under its default name
        out = out / default
    save_grid(dataset, out, per_cell=args.per_cell, seed=args.seed)
    sizes = ", ".join(f"{d} {dataset.size(d)}" for d in dataset.domains)
    print(f"{dataset.name}: {dataset.num_classes} classes, {dataset.resolution}x{dataset.resolution}; {sizes}")
    print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = FedstyleParser(
        prog="fedstyle",
        description="Federated domain generalization: train one classifier across clients whose images come "
        "from different visual domains, and test it on a domain no client has.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="train one configuration into a run directory", usage=RUN_USAGE,
                         description=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(run, resume_help="continue the interrupted run in DIR (its config.json is used)")
    run.add_argument("--download", action="store_true", help="with --pretrained: fetch torchvision's ResNet file "
                     "from its official URL into the torch hub cache (its hash checked) when it is not there")
    run.add_argument("--dry-run", action="store_true", help="say what the run would train on (model, budget, "
                     "domains, split, clients) and stop: nothing is trained or written; --out is not needed")
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser("report", help="paper-style table over run directories (mean ± std over seeds)",
                            description="Collect run directories (searched recursively) into the papers' table: "
                            "rows are methods, columns held-out domains and their average, cells mean ± std over seeds. "
                            "Writes report.md, report.csv, report.tex and the figures (PNG and PDF).")
    report.add_argument("runs", nargs="+", metavar="DIR", help="run directories or folders containing them")
    report.add_argument("--out", default="report", metavar="DIR", help="where to write the report (default: report)")
    report.add_argument("--which", choices=("selected", "last"), default="selected",
                        help="accuracy of the selected model or of the last round (default: selected)")
    report.add_argument("--claim", action="append", default=[], metavar="'A > B'",
                        help="judge a claim between two rows, each named by its method, a preset's variant name or its "
                        "label in the table, in that order (e.g. 'pardon > fpl', or a chain 'A > B > C'); checked "
                        "before anything is written; a row within 10 points of chance on source validation is not "
                        "judged. By fedstyle's rule: paired seeds per held-out target, the 95 %% "
                        "interval of the mean difference (holds / fails / within noise); repeatable; writes claims.json")
    report.set_defaults(func=_cmd_report)

    demo = sub.add_parser("demo", help="leave-one-domain-out on digits4 comparing methods, in a few minutes",
                          description="The main job on the built-in digits4: every domain left out in turn, "
                          "FedAvg, local MixStyle and CCST (overall style, K=3); prints the table, "
                          "writes the report and the plot.")
    demo.add_argument("--out", default="fedstyle-demo", metavar="DIR", help="output folder (default: fedstyle-demo)")
    demo.add_argument("--rounds", type=int, default=None, help="override the demo's number of rounds")
    demo.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    demo.add_argument("--ccst-backend", default="auto", choices=("auto", "lite", "fft", "adain"),
                      help="CCST's style transfer: auto = lite (offline AdaIN) on a GPU, fft on a CPU, where lite "
                      "would take about two minutes per held-out domain (default: auto)")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(func=_cmd_demo)

    methods = sub.add_parser("methods", help="every method, one line each; with NAME its hyperparameters",
                             description="Every method: name, family, paper and what it shares besides nothing "
                             "private. `fedstyle methods NAME` (a method, a preset's variant or a row label): its "
                             "summary, hyperparameters (--hp NAME=VALUE) and defaults.")
    methods.add_argument("name", nargs="?", metavar="NAME", help="a method (any case), a preset's variant or a row label")
    methods.set_defaults(func=_cmd_methods)

    cache = sub.add_parser("cache", help="what the cache holds (datasets, stylized copies), or clear parts of it",
                           description="The cache keeps decoded datasets and the images CCST and FedDG-FFT generate "
                           "(one entry per client, style bank, K and seed: tens of MB on digits4, GBs on PACS). "
                           "Everything in it is rebuilt on demand; do not clear it while runs are using it.",
                           epilog="examples:\n  fedstyle cache\n  fedstyle cache clear ccst feddg_fft\n"
                           "  fedstyle cache clear --all", formatter_class=argparse.RawDescriptionHelpFormatter)
    cache.set_defaults(func=_cmd_cache, cache_command="list")
    cache_sub = cache.add_subparsers(dest="cache_command", metavar="ACTION")
    cache_sub.add_parser("list", help="entries and sizes by kind (the default)")
    clear = cache_sub.add_parser("clear", help=f"delete kinds of entries: {', '.join(CACHE_KINDS)}")
    clear.add_argument("kinds", nargs="*", metavar="KIND", help=f"{', '.join(CACHE_KINDS[:-1])} or {CACHE_KINDS[-1]}")
    clear.add_argument("--all", action="store_true", help="everything")

    data = sub.add_parser("data", help="list datasets, draw one as a PNG grid, check a folder of images, or download "
                          "a benchmark")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    data_list = data_sub.add_parser("list", help="list datasets")
    data_list.set_defaults(func=_cmd_data_list)
    show = data_sub.add_parser("show", help="write a PNG grid: a row per domain, a column per class")
    show.add_argument("name", help="dataset name (see `fedstyle data list`) or hf:OWNER/NAME")
    show.add_argument("--out", metavar="FILE.png", help="output image, or a folder to write NAME.png in (default: "
                      "NAME.png)")
    show.add_argument("--data-root", help="dataset folder (folder datasets, fashion4's idx files)")
    show.add_argument("--resolution", type=int, default=None, help="image side in pixels")
    show.add_argument("--skip-bad-images", action="store_true", help="skip unreadable images")
    show.add_argument("--per-cell", type=int, default=1, help="images per (domain, class) cell")
    show.add_argument("--seed", type=int, default=0, help="which images are drawn")
    show.add_argument("--quiet", action="store_true", help="no progress bar")
    show.set_defaults(func=_cmd_data_show)
    from fedstyle.cli.data import add_check_command, add_download_command

    add_download_command(data_sub)
    add_check_command(data_sub)

    from fedstyle.cli.style import add_style_commands

    add_style_commands(sub)

    from fedstyle.cli.deploy import add_deploy_command

    add_deploy_command(sub)

    from fedstyle.cli.sweep import add_sweep_commands

    add_sweep_commands(sub)

    from fedstyle.cli.audit import add_audit_command

    add_audit_command(sub)

    from fedstyle.cli.leaderboard import add_leaderboard_command

    add_leaderboard_command(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedstyle")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """--version: the installed package's version, looked up only when asked (importlib.metadata is slow)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help="print fedstyle's version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"fedstyle {_version()}")
        parser.exit()


def _plain_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning reaches the user as one line, without the source path and line Python would print."""
    text = " ".join(str(message).split())
    print(f"fedstyle: warning: {text}", file=file or sys.stderr)


#: errno -> what to do about an OSError on a path the user gave (the OS's own words say only what happened)
OS_ERROR_FIXES = {
    errno.EEXIST: "a file is in the way of a folder there: give a folder (or a new name) instead",
    errno.ENOTDIR: "a part of that path is a file, not a folder: give a folder",
    errno.EISDIR: "that is a folder: give a file name inside it",
    errno.EACCES: "no permission there: choose a folder you can write to, or fix its permissions",
    errno.EROFS: "that file system is read-only: choose a folder you can write to",
    errno.ENOSPC: "the disk is full: free space or choose another disk",
    errno.ENOENT: "check the path (a folder that holds it must exist)",
}


def os_error_fix(err: OSError) -> str:
    """What the user can do about ``err``, by its errno (empty when there is no general advice)."""
    return OS_ERROR_FIXES.get(err.errno, "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    warnings.showwarning = _plain_warning
    try:
        return args.func(args)
    except FedstyleError as err:
        print(f"fedstyle: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file the user named cannot be read or written: say which and why, no traceback
        where = f": {err.filename}" if err.filename else ""
        fix = os_error_fix(err)
        print(f"fedstyle: error: {err.strerror or err}{where}{'; ' + fix if fix else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
