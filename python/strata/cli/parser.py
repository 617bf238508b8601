"""The argument parser of every ``strata`` command."""

from __future__ import annotations

import argparse
import difflib


class SectionParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose leaf commands parse options and positional arguments
    intermixed (``parse_known_intermixed_args``): their positionals are optional to argparse,
    since a ``--config`` file or ``-p`` may give them, and argparse's plain parse would bind
    ``strata run pagerank --iterations 3 STORE``'s ``pagerank`` to both ``ALGORITHM`` and an
    empty ``STORE``, then refuse ``STORE``. A parser with subcommands parses as argparse does
    (the intermixed parse does not take them)."""

    _intermixing = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A sub-parser's defaults replace its parent's, so the parsed namespace names the
        # deepest parser: the command's own, which knows its options (see refuse_extras).
        self.set_defaults(_parser=self)

    def refuse_extras(self, extras: list[str]):
        """Exits with status 2, as argparse does, naming arguments this command does not take
        under its own name and usage (argparse's own message names ``strata`` and its usage),
        with the nearest option when the first unknown one looks like a misspelling."""
        message = f"unrecognized arguments: {' '.join(extras)}"
        if extras[0].startswith("--"):
            names = [s[2:] for action in self._actions for s in action.option_strings if s.startswith("--")]
            near = difflib.get_close_matches(extras[0][2:].split("=", 1)[0], names, n=1, cutoff=0.75)
            message += f"; did you mean --{near[0]}?" if near else f" (`{self.prog} --help` lists the options)"
        self.error(message)

    def parse_known_args(self, args=None, namespace=None):
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        # parse_known_intermixed_args calls parse_known_args itself, twice: those calls parse
        # as argparse does.
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
