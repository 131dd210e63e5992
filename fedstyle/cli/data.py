"""``fedstyle data download NAME``: a benchmark fetched, verified and unpacked into a data root; ``fedstyle data
check DIR``: a folder of own images read before training."""

from __future__ import annotations

import argparse
from pathlib import Path

DOWNLOAD_DESCRIPTION = """\
Download a benchmark the way DomainBed lays it out (Camelyon17 the way WILDS does) into
DATA_ROOT/<folder>: each archive from its sources in order (--mirror first), resuming an
interrupted transfer where it stopped (run the same command again), its SHA-256 checked before it
is unpacked, and the folder appearing only when complete. Archives without a published checksum
are checked on first use: the first download that unpacks cleanly has its SHA-256 recorded in
DATA_ROOT/fedstyle-downloads.json, and later downloads must match it. When every source fails,
the error names the file to fetch by hand and where to put it (DATA_ROOT/downloads/<file>)."""

DOWNLOAD_EPILOG = """\
examples:
  fedstyle data download --list
  fedstyle data download pacs --data-root data        -> data/PACS; fedstyle run --dataset pacs --data-root data/PACS
  fedstyle data download domainnet --data-root /big/data --keep-archives
  fedstyle data download officehome --data-root data --mirror https://mirror.example.org/domainbed
  FEDSTYLE_DOWNLOAD_SOURCES=sources.json fedstyle data download vlcs --data-root data
                                                     (JSON: {"VLCS.tar.gz": {"urls": [...], "sha256": "..."}})
"""


def _cmd_download(args: argparse.Namespace) -> int:
    from fedstyle.data.download import DOWNLOADS, download_dataset
    from fedstyle.errors import ConfigError

    if args.list:
        for name, entry in DOWNLOADS.items():
            print(f"{name:16s} {entry.title} -> DATA_ROOT/{entry.folder}")
            for archive in entry.archives[:6]:
                size = f"{archive.size / 1e9:.2f} GB, " if archive.size else ""
                print(f"    {archive.filename:32s} {size}{archive.checksum_text}")
            if len(entry.archives) > 6:
                print(f"    ... and {len(entry.archives) - 6} more files (train/test lists)")
        return 0
    if not args.name:
        raise ConfigError("name a dataset (`fedstyle data download --list` shows them), e.g. "
                          "fedstyle data download pacs --data-root data")
    if not args.data_root:
        raise ConfigError(f"give --data-root DIR: the dataset goes to DIR/{DOWNLOADS.get(args.name).folder}")
    done = download_dataset(args.name, Path(args.data_root), mirrors=tuple(args.mirror),
                            keep_archives=args.keep_archives, progress=not args.quiet)
    entry = DOWNLOADS.get(args.name)
    state = "downloaded to" if done.fresh else "already in"
    print(f"{entry.title}: {state} {done.path}")
    print(f"read it with: --dataset {entry.dataset} --data-root {done.path}")
    return 0


def add_download_command(data_sub: argparse._SubParsersAction) -> None:
    download = data_sub.add_parser("download", help="download a benchmark (PACS, VLCS, Office-Home, DomainNet, "
                                   "TerraIncognita, Camelyon17-WILDS), verified, into a data root",
                                   description=DOWNLOAD_DESCRIPTION, epilog=DOWNLOAD_EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    download.add_argument("name", nargs="?", metavar="NAME", help="pacs, vlcs, officehome, domainnet, "
                          "terra_incognita or camelyon17 (see --list)")
    download.add_argument("--data-root", metavar="DIR", help="where the dataset folder goes (DIR/PACS, "
                          "DIR/office_home, ...); archives are fetched into DIR/downloads")
    download.add_argument("--list", action="store_true", help="the datasets, their archives and checksums")
    download.add_argument("--mirror", action="append", default=[], metavar="URL",
                          help="a base URL serving the same archive files (URL/PACS.zip ...), tried before "
                          "the listed sources (repeatable, in order)")
    download.add_argument("--keep-archives", action="store_true",
                          help="keep the archives in DIR/downloads after unpacking (default: deleted)")
    download.add_argument("--quiet", action="store_true", help="no progress bar")
    download.set_defaults(func=_cmd_download)


def _cmd_check(args: argparse.Namespace) -> int:
    from fedstyle.data.check import check_folder, report_lines

    check = check_folder(Path(args.root), progress=not args.quiet)
    print("\n".join(report_lines(check)))
    return 0 if check.ok else 1


def add_check_command(data_sub: argparse._SubParsersAction) -> None:
    check = data_sub.add_parser("check", help="a folder of own images before training: images per domain and "
                                "class, their sizes, unreadable files",
                                description="Read DIR/<domain>/<class>/<image> as `--dataset folder` reads it, "
                                "without training: the images per domain and class, their sizes, the unreadable "
                                "ones and the resolution a run would use. Exits 1 when a run would refuse the "
                                "folder (unreadable images, a class missing from a domain).",
                                epilog="example:\n  fedstyle data check my_images/\n"
                                "  fedstyle run --dataset folder --data-root my_images/ --target DOMAIN --out runs/x",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("root", metavar="DIR", help="the folder with one folder per domain, each with one per class")
    check.add_argument("--quiet", action="store_true", help="no progress bar")
    check.set_defaults(func=_cmd_check)

