"""The argument parser of every ``strata`` command."""

from __future__ import annotations

import argparse


class SectionParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose leaf commands parse options and positional arguments
    intermixed (``parse_known_intermixed_args``): their positionals are optional to argparse,
    since a ``--config`` file or ``-p`` may give them, and argparse's plain parse would bind
    ``strata run pagerank --iterations 3 STORE``'s ``pagerank`` to both ``ALGORITHM`` and an
    empty ``STORE``, then refuse ``STORE``. A parser with subcommands parses as argparse does
    (the intermixed parse does not take them)."""

    _intermixing = False

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
