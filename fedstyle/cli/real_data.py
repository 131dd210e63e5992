"""``fedstyle reproduce PAPER --data-root DIR`` / ``--dataset NAME``: the paper's own setting on the real data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

REAL_DATA_EPILOG = """\
the paper's own setting on the real data (tracks paper-<dataset>: the paper's backbone, resolution, rounds):
  fedstyle data download pacs --data-root data
  fedstyle reproduce ccst --data-root data --dry-run     what would run, and in which setting
  fedstyle reproduce ccst --data-root data --scale smoke  a pipeline check on the real PACS
  fedstyle reproduce ccst --data-root data --device cuda --workers 4       the paper's setting (--scale full)
  fedstyle reproduce pardon --dataset hf:flwrlabs/pacs --dry-run           from the Hugging Face cache
"""


def add_real_data_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the paper's own setting on the real data")
    group.add_argument("--data-root", metavar="DIR",
                       help="run the paper's tracks (paper-<dataset>) whose data DIR holds: DIR itself, or "
                       "DIR/PACS, DIR/office_home, DIR/VLCS as `fedstyle data download` lays them out; "
                       "the scale defaults to full (the paper's setting)")
    group.add_argument("--dataset", metavar="NAME",
                       help="the dataset every run reads instead (e.g. hf:flwrlabs/pacs), for the paper track "
                       "its name matches (or --track)")


def reproduce_paper_setting(args: argparse.Namespace, path: Path, overrides: list,
                            run: Callable[..., int]) -> int:
    """Plan (and unless --dry-run, run) the paper tracks of preset ``path`` that have their data."""
    from fedstyle.experiments.grid import parse_grid, read_toml
    from fedstyle.experiments.real_data import describe_setting, select_paper_runs

    track = args.track if args.track and args.track.startswith("paper-") else None
    if args.track and track is None and args.track != "from-scratch":
        from fedstyle.errors import ConfigError

        raise ConfigError(f"--track {args.track} runs on fedstyle's stand-ins; with --data-root/--dataset give a "
                          "paper-<dataset> track or none")
    where = f"preset {args.paper}"
    runs, missing = select_paper_runs(read_toml(path), where, data_root=args.data_root, dataset=args.dataset,
                                      track=track, without_data=args.dry_run)
    for line in missing:
        print(f"fedstyle: left out {line}", file=sys.stderr)
    scale = args.scale or "full"
    code = 0
    for paper_run in runs:
        grid = parse_grid(paper_run.data, where, scale=scale, overrides=overrides, track=paper_run.track)
        print(f"{paper_run.track} ({scale}): {describe_setting(grid)}")
        out = Path(args.out) / paper_run.track if args.out and len(runs) > 1 else \
            Path(args.out or Path("runs") / "reproduce" / f"{path.stem}-{paper_run.track}-{scale}")
        code = max(code, run(grid, out, args))
    return code
