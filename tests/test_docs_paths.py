"""No absolute path of any machine in the README or the docs (issue 52 §3): commands use relative --out folders.

A machine path is a path rooted at one of the usual top-level folders of a Unix or macOS machine, e.g. a home
folder or a scratch folder. A URL is not one (its path follows a host), nor is a path inside a package
(``fedstyle/data/...``): the look-behind refuses a path that follows a word character, a dot or a slash.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("work", "tmp", "home", "root", "mnt", "data", "Users", "opt", "srv", "var", "usr", "scratch", "media")
MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:" + "|".join(TOP_LEVEL) + r")/[\w.-]+")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def machine_paths(text: str) -> list[str]:
    return [m.group(0) for m in MACHINE_PATH.finditer(text)]


def test_the_pattern_finds_machine_paths_and_nothing_else():
    text = ("--out /work/bench34/x and /tmp/try, in `/home/me/data` or (/Users/a/b); "
            "not https://example.org/data/x, fedstyle/data/folder.py, runs/work/x, ~/.cache/torch or /data alone")
    assert machine_paths(text) == ["/work/bench34", "/tmp/try", "/home/me", "/Users/a"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths(page):
    found = machine_paths(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} names machine paths {found[:5]}: use a relative folder (runs/...)"
