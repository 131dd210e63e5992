"""The docs site's home page from README.md (issue 52: the site's home is the README).

The README links into docs/ as ``docs/PAGE.md``; from the site's index.md the same page is ``PAGE.md``. A link
to a repository file outside docs/ is refused: the site could not follow it. The site makes its home page with
:func:`render` at build time (docs/tools/site_hooks.py), so there is no second copy; this script prints it.

    python docs/tools/gen_index.py            # print the home page's Markdown
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADER = "<!-- the site's home page: README.md, made by docs/tools/gen_index.py at build time -->\n"

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


def main() -> int:
    print(render(README.read_text(encoding="utf-8")), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
