"""One config mechanism for every subcommand.

A section is a frozen dataclass registered under a dotted name (``convert``,
``generate.rmat``). Each field is typed and carries its help text. Values come, lowest
precedence first, from the field default, the section's table in a TOML file
(``--config run.toml``), command-line flags generated from the fields, and dotted overrides
(``-p convert.memory=2G``): :mod:`strata.config.loading` gathers them. Every value is coerced
to the field's type and checked here; a bad one raises :class:`~strata.errors.ConfigError`
naming the field and where the value came from.

An engine's sections are declared once, in Rust (``strata_store::config``): their fields,
types, defaults, bounds and help come from the native schema (:func:`native_section`), and
their values are checked by the engine's own check (``_native.config_check``). Sections whose
work is Python's alone are declared here with :func:`section` and :func:`option`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import struct
import types
import typing
from pathlib import Path
from typing import Any, Literal, NewType, Union

from .. import _native
from ..errors import ConfigError
from ..units import fmt_bytes, parse_size

#: A byte size; accepts ``512M``, ``2G``, ``1.5GiB`` or an integer.
Size = NewType("Size", int)
#: A size or ``"auto"`` (the consumer sizes it); accepts ``auto``, ``8G`` or an integer.
AutoSize = NewType("AutoSize", object)
#: A size or ``"all"`` (held whole); accepts ``all``, ``512M`` or an integer.
AllSize = NewType("AllSize", object)
#: The word each size-or-word type takes beside a size.
SIZE_WORDS = {AutoSize: "auto", AllSize: "all"}
#: Three fractions (train, valid, test) summing to 1 (checked by the engine); accepts
#: ``0.9,0.05,0.05`` or a list.
Fractions = NewType("Fractions", tuple)
#: Fanouts per edge type, keyed by ``src:rel:dst`` (PyG's ``num_neighbors`` dict): a TOML table
#: ``{"author:writes:paper" = [15, 10]}`` or, on the command line,
#: ``author:writes:paper=15,10;paper:cites:paper=10,5``.
FanoutTable = NewType("FanoutTable", dict)

#: The sections declared so far, by dotted name: a section group's module declares its own when
#: imported (``loading.all_sections`` imports them all, from ``loading.SECTION_GROUPS``).
SECTIONS: dict[str, type] = {}

#: The range of an integer option unless the option says otherwise: every integer option of
#: Strata is a count, an index, a seed or a size, and the engines take them as unsigned 64-bit
#: (or narrower, declared with ``option(..., min=..., max=...)``).
INT_RANGE = (0, (1 << 63) - 1)


def section(name: str):
    """Registers a dataclass as config section ``name`` (e.g. ``generate.rmat``)."""

    def register(cls):
        user_check = getattr(cls, "check", None)

        def __post_init__(self):
            # Coerce and validate however the section is built: from the CLI, a TOML file, or
            # Python code passing plain strings and ints.
            for f in dataclasses.fields(self):
                value = coerce_field(type(self), f.name, getattr(self, f.name), f"{name}.{f.name}")
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
    min: int | None = None,
    max: int | None = None,
) -> Any:
    """A config field: ``help`` is shown by ``--help`` and ``strata config show``.

    ``positional`` makes it a positional argument (a list field takes any number);
    ``flag=False`` keeps it out of the command line (config file and ``-p`` only). ``min`` and
    ``max`` bound an integer field (or each item of a list of integers), inclusive; unset, they
    are :data:`INT_RANGE`.
    """
    meta = {"help": help, "positional": positional, "short": short, "flag": flag, "min": min, "max": max}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def fields(cls) -> list[dataclasses.Field]:
    return list(dataclasses.fields(cls))


@functools.cache
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
    elif tp in SIZE_WORDS:
        name = f"size|{SIZE_WORDS[tp]}"
    elif tp is Fractions:
        name = "train,valid,test fractions"
    elif tp is FanoutTable:
        name = "src:rel:dst=fanouts;..."
    elif typing.get_origin(tp) is Literal:
        name = "|".join(str(a) for a in typing.get_args(tp))
    elif typing.get_origin(tp) is list:
        name = f"list of {type_name(typing.get_args(tp)[0])}"
    elif tp is Path:
        name = "path"
    else:
        name = getattr(tp, "__name__", str(tp))
    return name


_INTEGER = re.compile(r"^[+-]?[0-9][0-9_]*$")


def coerce_field(cls, key: str, value: Any, where: str) -> Any:
    """Converts ``value`` to the type of field ``key`` of section ``cls`` and checks its range."""
    meta = cls.__dataclass_fields__[key].metadata
    low = INT_RANGE[0] if meta.get("min") is None else meta["min"]
    high = INT_RANGE[1] if meta.get("max") is None else meta["max"]
    return coerce(value, _hints(cls)[key], where, int_range=(low, high))


def coerce(value: Any, tp: Any, where: str, int_range: tuple[int, int] = INT_RANGE) -> Any:
    """Converts ``value`` (from TOML or a command-line string) to type ``tp``.

    Strict: a TOML float for an integer option is an error (never truncated), integers must
    lie in ``int_range`` (inclusive), and numbers must be finite.
    """
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
    if tp in SIZE_WORDS:
        word = SIZE_WORDS[tp]
        if isinstance(value, str) and value.strip().lower() == word:
            return word
        try:
            return parse_size(value, expected=f"{word} or a size like 512M or 2G")
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if tp is Fractions:
        # Parsed here; whether they make a split (three, in [0, 1], summing to 1) is the
        # engine's check (strata_store::convert::Fractions).
        parts = value.split(",") if isinstance(value, str) else value
        try:
            return Fractions(tuple(float(x) for x in parts))
        except (TypeError, ValueError):
            raise fail("three fractions like 0.9,0.05,0.05") from None
    if tp is FanoutTable:
        return _fanout_table(value, where)
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {_native.unknown_name('choice', str(value), [str(c) for c in choices])}")
        return value
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise fail(type_name(tp))
        # Command-line values may be comma-separated ("--queue-depths 1,4,16").
        items = [part for v in value for part in (v.split(",") if isinstance(v, str) else [v]) if part != ""]
        return [coerce(v, item, where, int_range) for v in items]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise fail("true or false")
    if tp is int:
        # bool is an int subclass, and int("2.7") fails but int(2.7) truncates: only whole
        # integers and integer literals pass.
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, str) and _INTEGER.match(value.strip()))
        ):
            raise fail("an integer")
        number = int(value)
        low, high = int_range
        if not low <= number <= high:
            bound = f"must be >= {low}" if number < low else f"must be <= {high}"
            raise ConfigError(f"{where}: {bound}, got {number}")
        return number
    if tp is float:
        if isinstance(value, bool):
            raise fail("a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise fail("a number") from None
        if not math.isfinite(number):
            raise fail("a finite number")
        return number
    if tp is Path:
        if not isinstance(value, (str, Path)) or str(value) == "":
            raise fail("a path")
        return Path(value)
    if tp is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    raise TypeError(f"unsupported config type {tp!r} for {where}")


def _fanout_table(value: Any, where: str) -> FanoutTable:
    """A :data:`FanoutTable` from a TOML table or a command-line string; the keys are checked
    against a store's edge types where one is opened (``strata.gnn.typed``)."""
    if isinstance(value, str):
        table = {}
        for entry in (e.strip() for e in value.split(";")):
            key, eq, fanouts = entry.partition("=")
            if not entry or not eq:
                raise ConfigError(f"{where}: expected src:rel:dst=F,F;... entries, got {entry!r} in {value!r}")
            table[key.strip()] = fanouts
        value = table
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table of src:rel:dst = [fanouts], got {value!r}")
    out = {}
    for key, fanouts in value.items():
        if not isinstance(key, str) or len(key.split(":")) != 3 or not all(key.split(":")):
            raise ConfigError(f"{where}: expected keys like author:writes:paper (src:rel:dst), got {key!r}")
        out[key] = coerce(fanouts, list[int], f"{where}[{key}]", (-1, INT_RANGE[1]))
    return FanoutTable(out)


def _unknown_key(cls, key: str, where: str) -> ConfigError:
    names = [f.name for f in fields(cls)]
    return ConfigError(f"{where}: {_native.unknown_name(f'[{cls.__section__}] option', key, names)}")


def flag_name(cls, key: str) -> str:
    """How the command line names option ``key`` of section ``cls``: ``--run-dir``, or the
    metavar ``STORE`` of a positional argument."""
    if cls.__dataclass_fields__[key].metadata.get("positional"):
        return key.upper()
    return f"--{key.replace('_', '-')}"


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
        # argparse expands %-formats in help texts; the texts are plain prose ("20%").
        help_text = help_text.replace("%", "%%")
        if meta.get("positional"):
            # Optional for argparse: a --config file or a -p override may give the value, and
            # `load` names it when nothing does.
            nargs = "*" if typing.get_origin(tp) is list else "?"
            parser.add_argument(f.name, metavar=f.name.upper(), nargs=nargs, help=help_text, default=argparse.SUPPRESS)
            continue
        names = [flag_name(cls, f.name)] + ([f"-{meta['short']}"] if meta.get("short") else [])
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


def describe(cls) -> str:
    """A commented TOML template of the section: every option with its type, default and help."""
    hints = _hints(cls)
    lines = [f"[{cls.__section__}]"]
    for f in fields(cls):
        tp = hints[f.name]
        lines.append(f"# {f.metadata['help']}")
        low, high = f.metadata.get("min"), f.metadata.get("max")
        bounds = ", ".join(b for b in (low is not None and f">= {low}", high is not None and f"<= {high}") if b)
        lines.append(f"# type: {type_name(tp)}" + (f" ({bounds})" if bounds else ""))
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
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_value(k, None)} = {_toml_value(x, None)}" for k, x in v.items()) + "}"
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


def engine_options(cfg) -> dict[str, Any]:
    """The options of a native section's values that the engine declares (``__engine__``), as
    JSON-able data: what the engine's entry point takes. The front end's (``__front__``: the
    store or run, how to print) are Python's and left out."""
    return {k: v for k, v in as_dict(cfg).items() if k in cfg.__engine__}


@functools.cache
def _engine_schemas() -> dict[str, Any]:
    """Every engine section's JSON schema by name. The extension builds all of them in each call,
    and every command line declares 22 sections at import: one call, not 22, per process."""
    return _native.config_schema()


def native_section(name: str, class_name: str, front: type | None = None):
    """Declares engine section ``name`` from its Rust schema: one field per option, in the
    struct's order, with its type, default, bounds, help and command-line role; the values go
    through the engine's check (``_native.config_check``) once coerced. ``front`` (a class of
    :func:`option` fields) adds options Python handles before the engine runs (where the run
    lives, whether to resume), placed first; its ``check`` method, if any, checks them. The
    class's ``__front__`` names those, ``__engine__`` the engine's (:func:`engine_options`)."""
    schema = _engine_schemas()[name]
    annotations: dict[str, Any] = typing.get_type_hints(front) if front else {}
    namespace: dict[str, Any] = {"__annotations__": annotations, "__doc__": schema.get("description")}
    namespace.update({k: vars(front)[k] for k in annotations if k in vars(front)})
    namespace["__front__"] = tuple(annotations)
    namespace["__engine__"] = tuple(schema["x-order"])
    for key in schema["x-order"]:
        prop = _resolved(schema, schema["properties"][key])
        tp, low, high = _python_type(schema, prop)
        # A required option (the store a command works on) has a placeholder default in Rust
        # that its check refuses; the command line asks for it instead.
        default = dataclasses.MISSING if prop.get("x-required") else prop.get("default", dataclasses.MISSING)
        if tp is Path and isinstance(default, str):
            default = Path(default)
        elif prop.get("format") == "float" and isinstance(default, float):
            default = _shortest_f32(default)
        annotations[key] = tp
        namespace[key] = option(
            default,
            # A doc comment's line breaks are the source's wrapping, not the text's.
            help=" ".join(prop.get("description", "").split()),
            positional=prop.get("x-positional", False),
            short=prop.get("x-short"),
            flag=prop.get("x-flag", True),
            min=low,
            max=high,
        )

    front_check = vars(front).get("check") if front else None

    def check(self) -> None:
        if front_check is not None:
            front_check(self)
        _native.config_check(name, engine_options(self))

    namespace["check"] = check
    namespace["__module__"] = __name__
    namespace["__native__"] = True
    return section(name)(type(class_name, (), namespace))


def _shortest_f32(x: float) -> float:
    """The shortest decimal that is the same 32-bit float as ``x`` (a Rust ``f32`` default of
    0.1 reaches Python as 0.10000000149011612)."""
    want = struct.pack("<f", x)
    for digits in range(1, 10):
        y = float(f"{x:.{digits}g}")
        if struct.pack("<f", y) == want:
            return y
    return x


def _resolved(root: dict, prop: dict) -> dict:
    """``prop`` merged over the definition its ``$ref`` names (its own keys win)."""
    ref = prop.get("$ref")
    if ref is None:
        return prop
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{k: v for k, v in prop.items() if k != "$ref"}}


def _python_type(root: dict, prop: dict) -> tuple[Any, int | None, int | None]:
    """The Python type of schema ``prop`` and its integer bounds (None: :data:`INT_RANGE`'s)."""
    options = prop.get("anyOf") or []
    if options and any(o.get("type") == "null" for o in options):
        inner = {k: v for k, v in prop.items() if k != "anyOf"}
        (rest,) = [o for o in options if o.get("type") != "null"]
        tp, low, high = _python_type(root, _resolved(root, {**rest, **inner}))
        return tp | None, low, high
    kind = prop.get("type")
    if isinstance(kind, list) and "null" in kind:
        (kind,) = [k for k in kind if k != "null"]
        tp, low, high = _python_type(root, {**prop, "type": kind})
        return tp | None, low, high
    if kind == "array":
        # A list's x-kind (a list of paths) is its items'.
        item_kind = {"x-kind": prop["x-kind"]} if "x-kind" in prop else {}
        item, low, high = _python_type(root, {**_resolved(root, prop["items"]), **item_kind})
        return list[item], low, high
    kinds = {"size": Size, "auto-size": AutoSize, "all-size": AllSize, "path": Path, "fractions": Fractions}
    if prop.get("x-kind") in kinds:
        return kinds[prop["x-kind"]], None, None
    # A Rust enum's variants: an "enum" list, or a "oneOf" of "const"s where variants carry doc
    # comments (schemars groups the undocumented ones of a mixed enum into one "enum" entry).
    variants = [o.get("enum", [o["const"]] if "const" in o else []) for o in prop.get("oneOf", [])]
    choices = prop.get("enum") or [c for v in variants for c in v]
    if choices:
        return Literal[tuple(choices)], None, None
    low, high = prop.get("minimum"), prop.get("maximum")
    types_by_name = {"integer": int, "number": float, "boolean": bool, "string": str}
    if kind not in types_by_name:
        raise TypeError(f"unsupported schema type {kind!r} in {prop}")
    if kind != "integer":
        low = high = None
    return types_by_name[kind], low, high
