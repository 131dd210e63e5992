"""MkDocs hooks (mkdocs.yml ``hooks:``): the site's home page is README.md, made at build time.

The page is README.md with its links seen from docs/ (:func:`gen_index.render`), generated in ``on_files``, so
there is one copy: whatever changes the README (a pasted leaderboard, say) is on the site at the next build, and
``mkdocs serve`` rebuilds when the README changes (``watch:`` in mkdocs.yml).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.structure.files import File

_spec = importlib.util.spec_from_file_location("gen_index", Path(__file__).with_name("gen_index.py"))
gen_index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_index)


def on_files(files, config):
    readme = Path(config.config_file_path).parent / "README.md"
    existing = files.get_file_from_path("index.md")
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, "index.md", content=gen_index.render(readme.read_text(encoding="utf-8"))))
    return files
