"""Per-seed results of a benchmark, kept in the repository, and the verdicts of docs/results/ re-read from them.

Run directories are large (checkpoints) and do not outlive the machine they ran on; a verdict by the rule of
:mod:`fedstyle.experiments.verdict` needs each (cell, seed)'s accuracy, not a mean. So each table of
docs/results/ measured after 2026-11-26 keeps one small CSV here, one line per run:

    python benchmarks/per_seed.py export RUN_DIR [RUN_DIR ...] --name NAME   # -> benchmarks/per_seed/NAME.csv
    python benchmarks/per_seed.py judge NAME --claim 'FedOMG > FedAvg' [--claim ...] [--dataset digits4]
    python benchmarks/per_seed.py judge NAME+OTHER --claim ...                 # rows of two tables, paired
    python benchmarks/per_seed.py show NAME                                    # the rows and their cells

A row is a table label (the report's row name: a variant's ``label``, else its method); a cell is
"dataset → target"; ``target_acc`` is the selected model's accuracy in percent (source-validation selection
unless the run says otherwise), ``source_val`` the same model's mean source-validation accuracy. ``judge``
pairs two rows on the (cell, seed)s both have, exactly as ``fedstyle report --claim`` does on run folders.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedstyle, not an installed one
from fedstyle.errors import ConfigError  # noqa: E402
from fedstyle.experiments.report.per_seed import COLUMNS, accuracies, read_rows, record_rows, write_rows  # noqa: E402
from fedstyle.experiments.verdict import judge_paired  # noqa: E402

HERE = Path(__file__).resolve().parent / "per_seed"
__all__ = ["COLUMNS", "HERE", "accuracies", "export", "judge", "load", "main"]


def _variant(record, roots: list[Path]) -> str:
    """The run's folder below its sweep root, without dataset/seed/target parts: the grid's variant."""
    for root in roots:
        try:
            parts = record.path.resolve().relative_to(root.resolve()).parts
        except ValueError:
            continue
        return "/".join(p for p in parts[:-1] if not p.startswith(("seed", "dataset=")))
    return record.path.parent.name


def export(run_dirs: list[Path], name: str, which: str = "selected", out_dir: Path = HERE,
           label: str | None = None) -> Path:
    """Write ``out_dir/NAME.csv`` from every finished run below ``run_dirs`` (every row named ``label`` when
    given: a variant run apart, e.g. at another learning rate; ``{label}`` in it stands for the run's own
    label, so ``"{label} (FixBN)"`` keeps a whole sweep's rows apart from the same rows of another regime);
    returns its path. The lines are those of :mod:`fedstyle.experiments.report.per_seed`."""
    from fedstyle.experiments.report.runs import collect

    records = collect([str(d) for d in run_dirs])
    if not records:
        raise ConfigError(f"no finished run below {', '.join(map(str, run_dirs))}")
    lines = [line for record in records
             for line in record_rows(record, which, variant=_variant(record, run_dirs), label=label)]
    return write_rows(out_dir / f"{name}.csv", lines, COLUMNS)


def load(name: str | Path, in_dir: Path = HERE) -> list[dict[str, str]]:
    return read_rows(Path(name) if str(name).endswith(".csv") else in_dir / f"{name}.csv")


def judge(name: str, claims: list[str], dataset: str | None = None) -> list[str]:
    """One line per claim 'A > B', read by the rule on the kept per-seed accuracies; ``name`` may join several
    tables with '+' (rows run apart, paired by cell and seed)."""
    rows = [row for part in str(name).split("+") for row in load(part)]
    lines = []
    for claim in claims:
        better, sep, worse = (p.strip() for p in claim.partition(" > "))
        if not sep or not better or not worse:
            raise ConfigError(f"--claim {claim!r} is not 'A > B' (row labels, spaces around >)")
        verdict = judge_paired(accuracies(rows, better, dataset), accuracies(rows, worse, dataset))
        lines.append(f"claim {better} > {worse}: {verdict.status} ({verdict.text()})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write benchmarks/per_seed/NAME.csv from run folders")
    ex.add_argument("run_dirs", nargs="+", type=Path)
    ex.add_argument("--name", required=True)
    ex.add_argument("--which", choices=("selected", "last"), default="selected")
    ex.add_argument("--label", help="name every run's row so (default: the run's own label); {label} in it "
                    "stands for the run's own, e.g. --label '{label} (FixBN)'")
    ju = sub.add_parser("judge", help="re-read claims by the rule from a kept table")
    ju.add_argument("name")
    ju.add_argument("--claim", action="append", required=True)
    ju.add_argument("--dataset", help="only this dataset's cells (default: every cell both rows have)")
    sh = sub.add_parser("show", help="the rows of a kept table and their cells")
    sh.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            print(f"wrote {export(args.run_dirs, args.name, args.which, label=args.label)}")
        elif args.command == "judge":
            print("\n".join(judge(args.name, args.claim, args.dataset)))
        else:
            rows = load(args.name)
            for label in sorted({r["label"] for r in rows}):
                paired = accuracies(rows, label)  # its cells as judge pairs them (a single-source line: its source)
                cells = sorted({cell for cell, _ in paired})
                seeds = sorted({seed for _, seed in paired})
                print(f"{label}: {', '.join(cells)}; seeds {seeds}")
    except ConfigError as err:
        print(f"per_seed.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
