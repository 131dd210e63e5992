"""Every page of the docs reads at once: median sentence at most 15 words, none over 40 (issue 52 for the README,
which is also the docs site's home page, and the results index; every other page since). The changelog is left
out: it keeps the readings it replaced as they were written.

How a sentence is found (the rule this test measures by):

- Only prose counts. Fenced code blocks, HTML comments, table rows (lines starting with ``|``) and headings
  (lines starting with ``#``) are skipped.
- A list item starts a new paragraph; its marker (``-``, ``*``, ``1.``) is dropped. Other consecutive non-blank
  lines are joined into one paragraph.
- Markdown links count as their text, an inline code span as one word, and emphasis markers are dropped.
- A paragraph splits into sentences after ``.``, ``!`` or ``?`` followed by white space, except after the
  abbreviations in ``ABBREVIATIONS`` (``e.g.``, ``et al.``, ``Eq.`` ...). A colon or semicolon does not end one.
- A sentence's length is its number of white-space separated words.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: history as it was written (a page of record), not a page a user reads to learn the tool
NOT_MEASURED = ("docs/results/changelog.md",)
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")
                              if p.relative_to(ROOT).as_posix() not in NOT_MEASURED))
MEDIAN_MAX, LONGEST_MAX = 15, 40
ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "Eq.", "Eqs.", "vs.", "etc.", "Fig.", "cf.", "No.")

_LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_END = re.compile(r"(?<=[.!?])\s+")


def paragraphs(markdown: str) -> list[str]:
    """The prose paragraphs of a Markdown text, by the rule in the module docstring."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
    out: list[str] = []
    current: list[str] = []
    in_code = False

    def flush() -> None:
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            in_code = not in_code
            flush()
            continue
        if in_code or not stripped or stripped.startswith(("|", "#")):
            flush()
            continue
        if _LIST_MARKER.match(line):
            flush()
            stripped = _LIST_MARKER.sub("", line).strip()
        current.append(stripped)
    flush()
    return out


def sentences(paragraph: str) -> list[str]:
    text = _LINK.sub(r"\1", paragraph)
    text = _CODE_SPAN.sub("CODE", text)
    text = text.replace("**", "").replace("__", "")
    for i, abbreviation in enumerate(ABBREVIATIONS):
        text = text.replace(abbreviation, f"ABBREV{i}")
    return [s for s in _END.split(text) if s.strip()]


def sentence_lengths(markdown: str) -> list[int]:
    return [len(s.split()) for p in paragraphs(markdown) for s in sentences(p)]


def test_the_rule_on_a_hand_counted_text():
    text = ("# A heading that is long enough to count if headings counted\n\n"
            "One two three. Four five, e.g. six seven!\n"
            "Eight `a long code span` nine [a link text](docs/x.md).\n\n"
            "- A list item of six words\n- and another: three more here\n\n"
            "| a | table | row | is | skipped |\n\n"
            "```\ncode is not prose at all, however long it runs on and on\n```\n")
    assert sentence_lengths(text) == [3, 5, 6, 6, 5]


@pytest.mark.parametrize("page", PAGES)
def test_sentences_are_short(page):
    path = ROOT / page
    lengths = sentence_lengths(path.read_text(encoding="utf-8"))
    assert lengths, f"{page} has no prose"
    median = statistics.median(lengths)
    assert median <= MEDIAN_MAX, f"{page}: the median sentence is {median} words (at most {MEDIAN_MAX})"
    longest = [s for p in paragraphs(path.read_text(encoding="utf-8")) for s in sentences(p)
               if len(s.split()) > LONGEST_MAX]
    assert not longest, f"{page}: {len(longest)} sentence(s) over {LONGEST_MAX} words, the first: {longest[0][:200]}"


#: "(issue 51)": a number in fedstyle's work queue, which a user cannot open. Another project's tracker is cited
#: with its name and a hash ("DomainBed issue #136"), which this does not match.
_WORK_QUEUE_ISSUE = re.compile(r"\b[Ii]ssues? \d+")


def _cli_help_texts() -> list[tuple[str, str]]:
    """``--help`` of ``fedstyle`` and of every subcommand, nested ones included."""
    import argparse

    from fedstyle.cli.main import build_parser

    texts, stack = [], [("fedstyle", build_parser())]
    while stack:
        name, parser = stack.pop()
        texts.append((name, parser.format_help()))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend((f"{name} {sub}", child) for sub, child in action.choices.items())
    return texts


@pytest.mark.parametrize("page", PAGES)
def test_page_names_no_work_queue_issue(page):
    """A user cannot open the team's work queue, so "(issue 51)" reads as a dead reference: say what it stood for."""
    lines = [f"{i}: {line.strip()}" for i, line in enumerate((ROOT / page).read_text().splitlines(), 1)
             if _WORK_QUEUE_ISSUE.search(line)]
    assert not lines, f"{page} names an issue of fedstyle's work queue:\n" + "\n".join(lines)


def test_cli_help_names_no_work_queue_issue():
    texts = _cli_help_texts()
    assert len(texts) > 10  # the walk reached the subcommands
    found = [name for name, text in texts if _WORK_QUEUE_ISSUE.search(text)]
    assert not found, f"`--help` of {found} names an issue of fedstyle's work queue; say what it stood for"
