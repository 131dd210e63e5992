"""The documentation site builds with ``mkdocs build --strict`` (issue 52 §4): a broken link, a missing page, a
page the nav names but docs/ lacks or a page the nav leaves out fails the suite. Its home page is README.md itself,
made at build time (docs/tools/site_hooks.py), so the README's links are checked too."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: pages other branches of the same change add (issue 52's siblings: the CLI, real data, privacy, leaderboard
#: pages). Until they are merged the build gets a one-line stand-in for each one absent, so this branch's own
#: links are checked; once a page exists, the real one is built. Drop a name here when its page has landed.
PAGES_FROM_SIBLING_BRANCHES = ("cli.md",)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_is_no_second_copy_of_the_readme():
    assert not (ROOT / "docs" / "index.md").exists(), (
        "docs/index.md would shadow the README: the site's home page is made from README.md at build time")


def test_readme_links_outside_docs_are_refused():
    gen_index = _load(ROOT / "docs" / "tools" / "gen_index.py")
    assert gen_index.render("[a](docs/x.md) [b](https://e.org/y) [c](#z)") == (
        gen_index.HEADER + "[a](x.md) [b](https://e.org/y) [c](#z)")
    with pytest.raises(ValueError, match="outside docs/"):
        gen_index.render("[a](benchmarks/RESULTS.md)")


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed: pip install -c constraints.txt -e '.[test]'")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for page in PAGES_FROM_SIBLING_BRANCHES:
        target = tmp_path / "docs" / page
        if not target.exists():
            target.write_text(f"# {page}\n\nWritten on another branch of issue 52's change.\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "-f", str(tmp_path / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Results at a glance" in home and 'href="results/' in home  # the README, its links seen from docs/
