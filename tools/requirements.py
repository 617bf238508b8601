"""Prints the requirements of Strata plus the named extras of pyproject.toml, one a line.

``python tools/requirements.py dev+torch+pyg+parquet`` is what ``make test`` installs; the Makefile
keeps no package list of its own, so pyproject.toml is the one place that names them.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"pyproject.toml has no extra {', '.join(unknown)}; extras are: {', '.join(optional)}")
    out = list(project["dependencies"])
    for extra in extras:
        out += [r for r in optional[extra] if r not in out]
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: requirements.py EXTRA[+EXTRA...]")
    print("\n".join(requirements(sys.argv[1].split("+"))))
