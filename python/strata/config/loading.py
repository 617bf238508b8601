"""Where a section's values come from: its defaults, a TOML file (``--config``), flags and
``-p`` overrides (:func:`load`, :func:`from_args`), or a Python call's arguments
(:func:`from_call`).

A command declares only its own sections (a section group's module costs its import, a few tens
of milliseconds each on a slow core, at every process's start). A config file is checked
against every section, so reading one imports them all (:func:`all_sections`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import tomllib
from pathlib import Path
from typing import Any

from .. import _native
from ..errors import ConfigError
from .schema import SECTIONS, _unknown_key, coerce_field, fields, flag_name

#: Each section class (and the generators' table) by the module of its group: the facade loads a
#: class's group when the class is first named, :func:`all_sections` loads every group.
SECTION_GROUPS = {
    "BenchDiskConfig": "bench",
    "ConvertConfig": "convert",
    "DatasetsListConfig": "datasets",
    "FetchConfig": "datasets",
    **dict.fromkeys(
        (
            "EmbedEvalConfig",
            "EmbedExportConfig",
            "EmbedGatherConfig",
            "EmbedImportPbgConfig",
            "EmbedIndexConfig",
            "EmbedNeighborsConfig",
            "EmbedPlanConfig",
            "EmbedPredictConfig",
            "EmbedScoreConfig",
            "EmbedSearchConfig",
            "EmbedTrainConfig",
            "PlotConfig",
        ),
        "embed",
    ),
    **dict.fromkeys(("GENERATORS", "HetSbmConfig", "KgConfig", "RmatConfig", "SbmConfig"), "generate"),
    "GnnTrainConfig": "gnn",
    **dict.fromkeys(("FarmemServeConfig", "GridBuildConfig", "GridInfoConfig", "RunConfig"), "grid"),
    "CheckConfig": "info",
    "InfoConfig": "info",
    "ReorderConfig": "reorder",
    "ServeConfig": "serve",
    "ServeStatusConfig": "serve",
}


def all_sections() -> dict[str, type]:
    """Every section by its dotted name, each section group's module imported."""
    for group in dict.fromkeys(SECTION_GROUPS.values()):
        importlib.import_module(f".{group}", __package__)
    return SECTIONS


def _table_for(doc: dict, name: str) -> dict:
    table: Any = doc
    for part in name.split("."):
        table = table.get(part, {}) if isinstance(table, dict) else {}
    return table if isinstance(table, dict) else {}


def _check_document(doc: dict, config_file: Path, sections: dict[str, type], path: str = "") -> None:
    """Checks every table and option of a config file, not only the section being loaded: an
    unknown section, an unknown option or a wrongly typed value anywhere is an error, so a typo
    in ``[embed.trian]`` is found on the first run rather than silently ignored."""
    cls = sections.get(path)
    for key, value in doc.items():
        name = f"{path}.{key}" if path else key
        if name in sections or any(s.startswith(name + ".") for s in sections):
            if not isinstance(value, dict):
                raise ConfigError(f"{config_file}: [{name}] must be a table of options, got {value!r}")
            _check_document(value, config_file, sections, name)
        elif cls is not None:
            if key not in cls.__dataclass_fields__:
                raise _unknown_key(cls, key, str(config_file))
            coerce_field(cls, key, value, f"{config_file}: [{path}] {key}")
        elif path and not isinstance(value, dict):
            inside = ", ".join(f"[{s}]" for s in sorted(sections) if s.startswith(path + "."))
            raise ConfigError(f"{config_file}: [{path}] holds sections, not options: put '{key}' in one of {inside}")
        elif isinstance(value, dict):
            raise ConfigError(f"{config_file}: {_native.unknown_name('section', name, sorted(sections))}")
        else:
            raise ConfigError(
                f"{config_file}: unknown option '{key}' outside any section (sections: {', '.join(sorted(sections))})"
            )


def read_toml(path: Path, what: str) -> dict:
    """The TOML document of ``path``; a missing, unreadable or malformed file is a
    :class:`ConfigError` naming it as ``what`` (``config file``, ``search space file``)."""
    try:
        # utf-8-sig: a byte order mark (Windows editors write one) opens no TOML statement.
        return tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} cannot be read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path}: {e}") from None


def read_config_file(config_file: Path) -> dict:
    """The TOML document of ``config_file``, every table and option in it checked."""
    doc = read_toml(config_file, "config file")
    _check_document(doc, config_file, all_sections())
    return doc


def load(
    cls, *, config_file: Path | None = None, flags: dict[str, Any] | None = None, overrides: list[str] | None = None
):
    """Builds section ``cls`` from defaults, a TOML file, flags and ``-p`` overrides.

    Every error is a :class:`ConfigError` that names where the value came from: the file and
    its ``[section] key``, the ``--flag`` or the ``-p`` override.
    """
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    section_name = cls.__section__
    if config_file is not None:
        table = _table_for(read_config_file(config_file), section_name)
        for key, value in table.items():
            if key in cls.__dataclass_fields__:
                values[key] = coerce_field(cls, key, value, f"{config_file}: [{section_name}] {key}")
                origin[key] = f"{config_file}: [{section_name}] {key}"
    for key, value in (flags or {}).items():
        flag = flag_name(cls, key)
        values[key] = coerce_field(cls, key, value, flag)
        origin[key] = flag
    for item in overrides or []:
        dotted, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"-p {item!r}: expected SECTION.KEY=VALUE, e.g. -p {section_name}.memory=2G")
        sect, _, key = dotted.strip().rpartition(".")
        if sect != section_name:
            raise ConfigError(f"-p {item!r}: this command reads section [{section_name}], not [{sect or '?'}]")
        if key not in cls.__dataclass_fields__:
            raise _unknown_key(cls, key, f"-p {item!r}")
        values[key] = coerce_field(cls, key, raw.strip(), f"-p {dotted}")
        origin[key] = f"-p {dotted}"
    missing = [
        f.name
        for f in fields(cls)
        if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        flags_text = ", ".join(flag_name(cls, m) for m in missing)
        raise ConfigError(
            f"[{section_name}] needs a value for {', '.join(missing)} ({flags_text}, "
            f"or -p {section_name}.{missing[0]}=...)"
        )
    try:
        return cls(**values)
    except ConfigError as e:
        # A section's own check names the option (``embed.train.buffer: ...``); add where the
        # value came from, so a bad value in a long config file is found at once.
        named = [where for key, where in origin.items() if f"{section_name}.{key}:" in str(e)]
        if not named:
            raise
        raise ConfigError(f"{e} (from {', '.join(named)})") from None


def from_call(cls, config, options: dict[str, Any]):
    """The section a Python API call asks for: ``cls(**options)``, or ``config`` (a ``cls``)
    with ``options`` replacing its values, checked again.

    An option ``cls`` lacks is a :class:`ConfigError` with a "did you mean"; a ``config`` of
    another type (a store's path passed by position) is a ``TypeError`` naming the keyword."""
    for key in options:
        if key not in cls.__dataclass_fields__:
            raise _unknown_key(cls, key, "keyword argument")
    if config is None:
        return cls(**options)
    if not isinstance(config, cls):
        first = "store" if "store" in cls.__dataclass_fields__ else fields(cls)[0].name
        raise TypeError(
            f"expected {cls.__name__} (the [{cls.__section__}] section) or keyword options, got the"
            f" {type(config).__name__} {config!r}; give it by keyword, e.g. {first}={config!r}"
        )
    return dataclasses.replace(config, **options)


def from_args(cls, args: argparse.Namespace):
    """Builds section ``cls`` from parsed arguments (flags, ``--config``, ``-p``)."""
    names = {f.name for f in fields(cls)}
    flags = {k: v for k, v in vars(args).items() if k in names}
    return load(cls, config_file=args.config, flags=flags, overrides=args.overrides)
