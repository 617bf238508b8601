"""``strata config``: show the options of a section as a commented TOML template."""

from __future__ import annotations

from ..config import SECTIONS, describe
from ..errors import ConfigError


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Prints every option of a section with its type, default and help, "
        "ready to save as run.toml. Sections: " + ", ".join(sorted(SECTIONS)),
    )
    p.add_argument("section", nargs="?", help="section name (omit to list them)")
    p.set_defaults(run=run)


def run(args) -> int:
    if not args.section:
        for name in sorted(SECTIONS):
            print(name)
        return 0
    if args.section not in SECTIONS:
        raise ConfigError(f"no config section '{args.section}'; sections: {', '.join(sorted(SECTIONS))}")
    print(describe(SECTIONS[args.section]), end="")
    return 0
