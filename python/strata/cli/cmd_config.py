"""``strata config``: show the options of a section as a commented TOML template."""

from __future__ import annotations

from .. import _native
from ..config import all_sections, describe
from ..errors import ConfigError


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Prints every option of a section with its type, default and help, "
        "ready to save as run.toml. Sections: " + ", ".join(sorted(all_sections())),
    )
    p.add_argument("section", nargs="?", help="section name (omit to list them)")
    p.set_defaults(run=run)


def run(args) -> int:
    sections = all_sections()
    if not args.section:
        for name in sorted(sections):
            print(name)
        return 0
    if args.section not in sections:
        raise ConfigError(_native.unknown_name("config section", args.section, sorted(sections)))
    print(describe(sections[args.section]), end="")
    return 0
