"""Write docs/index.md, the docs site's home page, from README.md (issue 52: the site's home is the README).

The README links into docs/ as ``docs/PAGE.md``; from docs/index.md the same page is ``PAGE.md``, and a repository
file outside docs/ is linked on GitHub's terms by its path only, so the two copies differ in link targets alone.
``tests/test_docs_site.py`` checks that docs/index.md is what this script writes, so the two cannot drift apart.

    python docs/tools/gen_index.py            # rewrite docs/index.md
    python docs/tools/gen_index.py --check    # exit 1 when docs/index.md is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"
HEADER = "<!-- generated from README.md by docs/tools/gen_index.py: edit README.md, then run it -->\n"

_LINK_TARGET = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def _relink(match: re.Match) -> str:
    target = match.group(1)
    if target.startswith("docs/"):
        return f"]({target[len('docs/'):]})"
    raise ValueError(f"README.md links to {target!r}, outside docs/: the site cannot follow it; "
                     "link a docs/ page or a full https:// address instead")


def render(readme: str) -> str:
    """docs/index.md's text for a README text: the same page with its links seen from docs/."""
    return HEADER + _LINK_TARGET.sub(_relink, readme)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that docs/index.md is up to date")
    args = parser.parse_args(argv)
    text = render(README.read_text(encoding="utf-8"))
    if args.check:
        current = INDEX.read_text(encoding="utf-8") if INDEX.exists() else ""
        if current != text:
            print("docs/index.md is stale: run `python docs/tools/gen_index.py`", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
