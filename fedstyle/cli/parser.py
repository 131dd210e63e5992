"""The argument parser of every ``fedstyle`` command: no abbreviated options, "did you mean" for a
misspelt option or choice, and a misspelt option answered with the usage of the command it was given to.

argparse (Python 3.11) matches option prefixes (``--round 1`` would set ``--rounds``) unless
``allow_abbrev=False``, and it reports a subcommand's unknown option with the top-level usage; this
subclass fixes both for every parser of the tree (``add_subparsers`` makes children of the parent's class).
"""

from __future__ import annotations

import argparse
from typing import Sequence

from fedstyle.registry import close_names


def _suggestion(word: str, names, cutoff: float = 0.6) -> str:
    close = close_names(word, names, cutoff=cutoff)
    return f"; did you mean {' or '.join(close)}?" if close else ""


class FedstyleParser(argparse.ArgumentParser):
    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):
        """As argparse's, but an argument this parser does not know is an error here, with this parser's
        usage: a subcommand's parser reports its own misspelt options."""
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(self._unrecognized(extra, list(args) if args is not None else []))
        return parsed, extra

    def _unrecognized(self, extra: list[str], argv: list[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extra)}"
        options = [o for o in extra if o.startswith("-")]
        if options:
            # options share their "--" and many letters: a higher bar than for names keeps one or two
            message += _suggestion(options[0].split("=")[0], self._option_string_actions, cutoff=0.75)
        if "--hp" in argv:
            message += "; --hp takes one NAME=VALUE word (e.g. --hp mu=0.1), repeated for each hyperparameter"
        return message

    def _check_value(self, action: argparse.Action, value) -> None:
        """An invalid choice (a COMMAND, --partition ...) names the close ones."""
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{_suggestion(str(value), action.choices)}"
                                         f" (choose from {choices})")
