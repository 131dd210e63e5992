"""Code, presets and scripts cite the results pages by file and section (docs/results/<page>.md "Section"): each
cited page exists and holds the cited name. benchmarks/RESULTS.md became a pointer page, and 39 citations of its
old sections were left pointing at nothing; this keeps the new ones true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
#: docs/results/<page>.md, optionally followed by a quoted section name: "Name" or 'Name'
CITATION = re.compile(r"""docs/results/([a-z0-9_-]+\.md)(?: (?:"([^"\n]+)"|'([^'\n]+)'))?""")


def sources() -> list[Path]:
    files = []
    for folder in ("fedstyle", "benchmarks", "tests"):
        for suffix in ("*.py", "*.toml", "*.sh"):
            files += (ROOT / folder).rglob(suffix)
    return sorted(f for f in files if f.name != Path(__file__).name)


def citations(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2) or m.group(3)) for m in CITATION.finditer(text)]


def test_the_pattern_reads_a_page_and_its_section():
    text = """see docs/results/pretrained.md "FixBN", docs/results/ccst.md's table and docs/results/x.md 'A b'"""
    assert citations(text) == [("pretrained.md", "FixBN"), ("ccst.md", None), ("x.md", "A b")]


def test_every_cited_results_page_exists_and_holds_the_cited_section():
    wrong = []
    for path in sources():
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for page, section in citations(line):
                where = f"{path.relative_to(ROOT)}:{line_no}"
                if not (RESULTS / page).is_file():
                    wrong.append(f"{where}: docs/results/{page} does not exist")
                elif section and section not in (RESULTS / page).read_text(encoding="utf-8"):
                    wrong.append(f"{where}: docs/results/{page} has no {section!r}")
    assert not wrong, "\n".join(wrong)


def test_nothing_cites_a_section_of_the_pointer_page():
    """benchmarks/RESULTS.md holds no sections but its generated leaders: a citation of one of its old sections
    ("RESULTS.md "FixBN"", "RESULTS.md's CCST table") is stale."""
    stale = re.compile(r"""RESULTS(?:\.md)?(?:'s [A-Z][\w-]* table| ["'][A-Z])""")
    assert stale.search("""(benchmarks/RESULTS.md "FixBN")""") and stale.search("RESULTS' CCST") is None
    assert stale.search("benchmarks/RESULTS.md's CCST table") and not stale.search("RESULTS.md's leaders")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sources()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if stale.search(line)]
    assert not found, found
