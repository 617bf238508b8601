"""Typed configuration of every subcommand (see :mod:`strata.config.schema`).

The section classes load with their group's module when first named here (``from strata.config
import InfoConfig`` imports ``strata.config.info`` alone): a command pays for its own sections
only. What needs them all (a config file's check, ``strata config``) asks :func:`all_sections`.
"""

import importlib

from .loading import SECTION_GROUPS, all_sections, from_args, from_call, load
from .schema import ConfigError, Fractions, Size, add_arguments, as_dict, describe, engine_options


def __getattr__(name: str):
    group = SECTION_GROUPS.get(name)
    if group is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{group}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    *sorted(SECTION_GROUPS),
    "ConfigError",
    "Fractions",
    "Size",
    "add_arguments",
    "all_sections",
    "as_dict",
    "describe",
    "engine_options",
    "from_args",
    "from_call",
    "load",
]
