"""Every registered method has a card (docs/methods/NAME.md) whose hyperparameter table is the registry's, and
every method module's docstring is short: the paper-versus-code analysis lives in the card (issue 52 §2)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.hparams import HParam

ROOT = Path(__file__).resolve().parents[1]
DOCSTRING_MAX_LINES = 25
SECTIONS = ("## Paper and code", "## What is implemented", "## Hyperparameters", "## How to run",
            "## Expected results", "## Cost per step against FedAvg", "## What it sends, and what the privacy audit says",
            "## Parity")


@pytest.fixture(scope="module")
def gen_cards():
    path = ROOT / "docs" / "tools" / "gen_cards.py"
    spec = importlib.util.spec_from_file_location("gen_cards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_has_a_card_on_the_template(name):
    card = ROOT / "docs" / "methods" / f"{name}.md"
    assert card.exists(), f"method {name} has no card: write docs/methods/{name}.md (template: docs/methods/fedavg.md)"
    text = card.read_text(encoding="utf-8")
    missing = [s for s in SECTIONS if s not in text]
    assert not missing, f"docs/methods/{name}.md lacks the template's sections {missing}"
    assert f"--method {name}" in text, f"docs/methods/{name}.md has no command that runs it"


@pytest.mark.parametrize("name", METHODS.names())
def test_card_table_matches_the_registry(name, gen_cards):
    text = (ROOT / "docs" / "methods" / f"{name}.md").read_text(encoding="utf-8")
    method = METHODS.get(name)
    assert gen_cards.card_table(text) == gen_cards.table(method), (
        f"docs/methods/{name}.md's hyperparameters differ from the registry: run `python docs/tools/gen_cards.py`")
    # the table's rows are the common options whose default the method changes, then its own hyperparameters,
    # each with its default as `fedstyle methods` shows it
    common = gen_cards.COMMON_DEFAULTS
    listed = [h for h in method.declared_hparams() if h.name in common and h.default != common[h.name]]
    listed += [h for h in method.declared_hparams() if h.name not in gen_cards.COMMON]
    rows = [line for line in gen_cards.card_table(text).splitlines()[2:] if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [h.name for h in listed]
    for row, h in zip(rows, listed):
        assert f"`{h.default!r}`" in row


def test_a_changed_default_is_caught(gen_cards):
    class Changed:
        @staticmethod
        def declared_hparams():
            return (HParam("tau", 0.4, "the threshold", low=0.0, high=1.0),)

    class Again:
        @staticmethod
        def declared_hparams():
            return (HParam("tau", 0.5, "the threshold", low=0.0, high=1.0),)

    text = "x\n" + gen_cards.START + "\n" + gen_cards.table(Changed) + "\n" + gen_cards.END + "\ny"
    assert gen_cards.card_table(text) == gen_cards.table(Changed) != gen_cards.table(Again)
    assert "| `tau` | `0.4` | [0.0, 1.0] | the threshold |" in gen_cards.table(Changed)
    assert gen_cards.card_table(gen_cards.updated(text, Again)) == gen_cards.table(Again)


@pytest.mark.parametrize("name", METHODS.names())
def test_method_docstring_is_short_and_points_to_its_card(name):
    path = ROOT / (METHODS.get(name).__module__.replace(".", "/") + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
    lines = len(doc.splitlines())
    assert lines <= DOCSTRING_MAX_LINES, f"{path.name}'s docstring is {lines} lines (at most {DOCSTRING_MAX_LINES}): " \
                                         "move the detail into its card"
    assert f"docs/methods/{name}.md" in doc or lines <= 3, f"{path.name}'s docstring does not name its card"
