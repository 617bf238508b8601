"""One config mechanism for every subcommand.

A section is a frozen dataclass registered under a dotted name (``convert``,
``generate.rmat``). Each field is typed and carries its help text. Values come, lowest
precedence first, from the field default, the section's table in a TOML file
(``--config run.toml``), command-line flags generated from the fields, and dotted overrides
(``-p convert.memory=2G``). Every value is coerced to the field's type and checked; a bad one
raises :class:`~strata.errors.ConfigError` naming the field and where the value came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, NewType, Union

import tomllib

from ..errors import ConfigError
from ..units import fmt_bytes, parse_size

#: A byte size; accepts ``512M``, ``2G``, ``1.5GiB`` or an integer.
Size = NewType("Size", int)
#: Three fractions (train, valid, test) summing to 1; accepts ``0.9,0.05,0.05`` or a list.
Fractions = NewType("Fractions", tuple)

SECTIONS: dict[str, type] = {}


def section(name: str):
    """Registers a dataclass as config section ``name`` (e.g. ``generate.rmat``)."""

    def register(cls):
        user_check = getattr(cls, "check", None)

        def __post_init__(self):
            # Coerce and validate however the section is built: from the CLI, a TOML file, or
            # Python code passing plain strings and ints.
            hints = _hints(type(self))
            for f in dataclasses.fields(self):
                value = coerce(getattr(self, f.name), hints[f.name], f"{name}.{f.name}")
                object.__setattr__(self, f.name, value)
            if user_check is not None:
                user_check(self)

        cls.__post_init__ = __post_init__
        cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        cls.__section__ = name
        SECTIONS[name] = cls
        return cls

    return register


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    positional: bool = False,
    short: str | None = None,
    flag: bool = True,
) -> Any:
    """A config field: ``help`` is shown by ``--help`` and ``strata config show``.

    ``positional`` makes it a positional argument (a list field takes any number);
    ``flag=False`` keeps it out of the command line (config file and ``-p`` only).
    """
    meta = {"help": help, "positional": positional, "short": short, "flag": flag}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def fields(cls) -> list[dataclasses.Field]:
    return list(dataclasses.fields(cls))


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def type_name(tp: Any) -> str:
    """A short human name of a field type, for help and errors."""
    tp, _ = _unwrap_optional(tp)
    if tp is Size:
        name = "size"
    elif tp is Fractions:
        name = "train,valid,test fractions"
    elif typing.get_origin(tp) is Literal:
        name = "|".join(str(a) for a in typing.get_args(tp))
    elif typing.get_origin(tp) is list:
        name = f"list of {type_name(typing.get_args(tp)[0])}"
    elif tp is Path:
        name = "path"
    else:
        name = getattr(tp, "__name__", str(tp))
    return name


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Converts ``value`` (from TOML or a command-line string) to type ``tp``."""
    tp, optional = _unwrap_optional(tp)

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{where}: expected {expected}, got {value!r}")

    if value is None or (optional and isinstance(value, str) and value.lower() in ("", "none", "null")):
        if optional:
            return None
        raise fail(type_name(tp))
    if tp is Size:
        try:
            return Size(parse_size(value))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if tp is Fractions:
        parts = value.split(",") if isinstance(value, str) else value
        try:
            f = tuple(float(x) for x in parts)
        except (TypeError, ValueError):
            raise fail("three fractions like 0.9,0.05,0.05") from None
        if len(f) != 3 or any(x < 0 or x > 1 for x in f) or abs(sum(f) - 1) > 1e-6 or f[0] <= 0:
            raise ConfigError(
                f"{where}: expected three fractions (train, valid, test) in [0, 1] summing to 1 "
                f"with train > 0, got {value!r}"
            )
        return Fractions(f)
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise fail("one of " + ", ".join(repr(c) for c in choices))
        return value
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise fail(type_name(tp))
        # Command-line values may be comma-separated ("--queue-depths 1,4,16").
        items = [part for v in value for part in (v.split(",") if isinstance(v, str) else [v]) if part != ""]
        return [coerce(v, item, where) for v in items]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise fail("true or false")
    if tp is int:
        if isinstance(value, bool):
            raise fail("an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise fail("an integer") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise fail("a number") from None
    if tp is Path:
        if not isinstance(value, (str, Path)) or str(value) == "":
            raise fail("a path")
        return Path(value)
    if tp is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    raise TypeError(f"unsupported config type {tp!r} for {where}")


def _table_for(doc: dict, name: str) -> dict:
    table: Any = doc
    for part in name.split("."):
        table = table.get(part, {}) if isinstance(table, dict) else {}
    return table if isinstance(table, dict) else {}


def _unknown_key(cls, key: str, where: str) -> ConfigError:
    names = [f.name for f in fields(cls)]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; options are: {', '.join(names)}"
    return ConfigError(f"{where}: [{cls.__section__}] has no option '{key}'{hint}")


def load(
    cls, *, config_file: Path | None = None, flags: dict[str, Any] | None = None, overrides: list[str] | None = None
):
    """Builds section ``cls`` from defaults, a TOML file, flags and ``-p`` overrides."""
    hints = _hints(cls)
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            doc = tomllib.loads(Path(config_file).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {config_file} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {config_file}: {e}") from None
        nested_sections = {n.split(".", 1)[1].split(".")[0] for n in SECTIONS if n.startswith(cls.__section__ + ".")}
        for key, value in _table_for(doc, cls.__section__).items():
            if key in nested_sections:
                continue
            if key not in hints:
                raise _unknown_key(cls, key, str(config_file))
            values[key] = coerce(value, hints[key], f"{config_file}: {cls.__section__}.{key}")
    for key, value in (flags or {}).items():
        values[key] = coerce(value, hints[key], f"--{key.replace('_', '-')}")
    for item in overrides or []:
        dotted, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"-p {item!r}: expected SECTION.KEY=VALUE, e.g. -p {cls.__section__}.memory=2G")
        sect, _, key = dotted.strip().rpartition(".")
        if sect != cls.__section__:
            raise ConfigError(f"-p {item!r}: this command reads section [{cls.__section__}], not [{sect or '?'}]")
        if key not in hints:
            raise _unknown_key(cls, key, f"-p {item!r}")
        values[key] = coerce(raw.strip(), hints[key], f"-p {dotted}")
    missing = [
        f.name
        for f in fields(cls)
        if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        flags_text = ", ".join(f"--{m.replace('_', '-')}" for m in missing)
        raise ConfigError(
            f"[{cls.__section__}] needs a value for {', '.join(missing)} ({flags_text}, "
            f"or -p {cls.__section__}.{missing[0]}=...)"
        )
    return cls(**values)


def add_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """Adds a flag (or positional) for every field of ``cls``, plus ``--config`` and ``-p``."""
    hints = _hints(cls)
    for f in fields(cls):
        meta = f.metadata
        if not meta.get("flag", True):
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        shown = fmt_bytes(default) if tp is Size and isinstance(default, int) else default
        help_text = meta["help"] + (f" (default: {shown})" if default not in (None, [], "") else "")
        if meta.get("positional"):
            nargs = "*" if typing.get_origin(tp) is list else None
            parser.add_argument(f.name, metavar=f.name.upper(), nargs=nargs, help=help_text, default=argparse.SUPPRESS)
            continue
        names = [f"--{f.name.replace('_', '-')}"] + ([f"-{meta['short']}"] if meta.get("short") else [])
        if tp is bool:
            parser.add_argument(
                *names, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
            )
        elif typing.get_origin(tp) is list:
            parser.add_argument(
                *names,
                dest=f.name,
                action="extend",
                nargs="+",
                default=argparse.SUPPRESS,
                metavar=type_name(typing.get_args(tp)[0]).upper(),
                help=help_text,
            )
        else:
            parser.add_argument(
                *names,
                dest=f.name,
                default=argparse.SUPPRESS,
                metavar=type_name(tp).split("|")[0].upper()
                if typing.get_origin(tp) is not Literal
                else "{" + ",".join(typing.get_args(tp)) + "}",
                help=help_text,
            )
    parser.add_argument(
        "--config", type=Path, metavar="TOML", help=f"read options from the [{cls.__section__}] table of a TOML file"
    )
    parser.add_argument(
        "-p",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override one option, e.g. -p {cls.__section__}.{fields(cls)[0].name}=...",
    )


def from_args(cls, args: argparse.Namespace):
    """Builds section ``cls`` from parsed arguments (flags, ``--config``, ``-p``)."""
    names = {f.name for f in fields(cls)}
    flags = {k: v for k, v in vars(args).items() if k in names}
    return load(cls, config_file=args.config, flags=flags, overrides=args.overrides)


def describe(cls) -> str:
    """A commented TOML template of the section: every option with its type, default and help."""
    hints = _hints(cls)
    lines = [f"[{cls.__section__}]"]
    for f in fields(cls):
        tp = hints[f.name]
        lines.append(f"# {f.metadata['help']}")
        lines.append(f"# type: {type_name(tp)}")
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        )
        if default is dataclasses.MISSING:
            lines.append(f"# {f.name} = ...  (required)")
        elif default is None:
            lines.append(f"# {f.name} =  (unset)")
        else:
            lines.append(f"{f.name} = {_toml_value(default, _unwrap_optional(tp)[0])}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _toml_value(v: Any, tp: Any) -> str:
    if tp is Size:
        return f'"{fmt_bytes(v).replace(" ", "").replace("iB", "")}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x, None) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def as_dict(obj) -> dict[str, Any]:
    """The section's values as plain JSON-able data (paths as strings)."""
    out = {}
    for f in fields(type(obj)):
        v = getattr(obj, f.name)
        if isinstance(v, Path):
            v = str(v)
        elif isinstance(v, list):
            v = [str(x) if isinstance(x, Path) else x for x in v]
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out
