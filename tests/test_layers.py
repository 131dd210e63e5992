"""The package's layers: every import points down (or stays inside its own layer).

Walks every module of ``fedstyle/`` with ``ast`` — imports inside functions included — and fails
on an import of a package above the importer's layer. The layers, bottom to top, are read from the
picture in docs/architecture.md, so the page and the code cannot drift apart; the page's "path of
one round" must name files and definitions that exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fedstyle"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def layers_of_the_page(text: str) -> list[tuple[str, ...]]:
    """The layers of the page's picture (the code block under "## The layers"), bottom to top:
    ``core`` is the modules directly in ``fedstyle/``, any other name ``fedstyle.<name>``."""
    section = text.split("## The layers", 1)[1]
    block = section.split("```text", 1)[1].split("```", 1)[0]
    names = [re.split(r"\s{2,}", line)[0] for line in block.splitlines() if line and not line[0].isspace()]
    layers = [("fedstyle",) if name == "core" else tuple(f"fedstyle.{n.strip()}" for n in name.split(","))
              for name in names]
    return layers[::-1]


#: bottom to top; a module may import its own layer and the layers below it
LAYERS: list[tuple[str, ...]] = layers_of_the_page(ARCHITECTURE.read_text())


def layer_of(module: str) -> int:
    """The layer of a dotted module name (the longest matching prefix wins)."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer; add it to the picture in docs/architecture.md")
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every fedstyle import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from fedstyle.x import y` may name a submodule y: check the deeper name too
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == "fedstyle" or name.startswith("fedstyle.")]


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in all_modules():
        layer_of(module_name(path))


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_point_down(path):
    own = layer_of(module_name(path))
    upward = []
    for line, target in imported_modules(path):
        try:
            target_layer = layer_of(target)
        except AssertionError:
            continue  # `from fedstyle.x import name`: the name is not a module
        if target_layer > own:
            upward.append(f"line {line}: {target} (layer {target_layer} > {own})")
    assert not upward, f"{module_name(path)} imports a layer above its own:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules():
    """Module-level and function-level imports together form no cycle between files."""
    modules = {module_name(p): p for p in all_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for _, target in imported_modules(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not (modules[target].name == "__init__.py" and name.startswith(target + ".")):
                if modules[target].name != "__init__.py":
                    deps.add(target)
        graph[name] = deps
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_walker_sees_imports_inside_functions(tmp_path):
    probe = PACKAGE / "style" / "_layer_probe.py"
    probe.write_text("def f():\n    from fedstyle.experiments import runner\n")
    try:
        assert (2, "fedstyle.experiments") in imported_modules(probe)
        with pytest.raises(AssertionError, match="layer above"):
            test_imports_point_down(probe)
    finally:
        probe.unlink()


def test_the_page_draws_every_subpackage_as_a_layer():
    assert LAYERS[0] == ("fedstyle",) and len(LAYERS) == 9, LAYERS
    drawn = {prefix for layer in LAYERS for prefix in layer}
    for folder in sorted(p.parent for p in PACKAGE.glob("*/__init__.py")):
        assert f"fedstyle.{folder.name}" in drawn, f"fedstyle/{folder.name} is in no layer of docs/architecture.md"


def _definitions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_the_path_of_one_round_names_files_and_definitions_that_exist():
    text = ARCHITECTURE.read_text()
    references = re.findall(r"`(fedstyle/[\w/]+(?:\.py)?)(?::(\w+))?", text)
    assert len(references) > 20
    for path, name in references:
        target = PACKAGE.parent / path
        assert target.exists(), f"docs/architecture.md names {path}, which does not exist"
        if name:
            assert name in _definitions(target), f"docs/architecture.md names {path}:{name}, which it does not define"


def test_the_page_reader_sees_a_changed_picture():
    page = "## The layers\n```text\ncli            x\n  |\ncore           y\n```\n"
    assert layers_of_the_page(page) == [("fedstyle",), ("fedstyle.cli",)]
