"""Vertex programs of your own: :class:`VertexProgram` and :func:`run_program`.

A program is GridGraph's and X-Stream's streaming model written as expressions: vertex arrays
with their initial values (``values``), the message each edge sends (``edge``, reading
``src.X``, ``dst.X`` and ``weight``), how messages to a vertex combine into its accumulator
``acc`` (``combine``: sum, min or max), assignments run on each vertex after the edge pass
(``apply``), and what keeps it going: an active set (``active``, ``start``: only the edges of
active sources are streamed, and blocks without one are skipped), aggregates reduced over the
vertices (``aggregates``) that ``until`` and the next iteration read, and ``iterations``.

The engine compiles the expressions to vector code and runs it on its compute threads, over
batches of each block's edges and each chunk's vertices, in memory or out of core within the
budget like any native algorithm; Python is not called while it runs. The expression language
is Python's arithmetic on float64 (``+ - * / // % **``, comparisons, ``and or not``,
``a if c else b``, ``min max abs sqrt exp log floor ceil int where``). See docs/grid.md,
"Vertex programs".

    from strata.grid import VertexProgram, run_program

    pagerank = VertexProgram(
        "pagerank",
        params={"damping": 0.85},
        values={"rank": ("f32", "1 / n"), "contrib": ("f32", "where(out_degree > 0, 1 / n / out_degree, 0)")},
        edge="src.contrib",
        combine="sum",
        accumulator="f32",
        apply={"rank": "(1 - damping) / n + damping * (acc + dangling / n)",
               "contrib": "where(out_degree > 0, rank / out_degree, 0)"},
        aggregates={"dangling": ("sum", "where(out_degree == 0, rank, 0)")},
        iterations=20,
        outputs=["rank"],
    )
    result = run_program("twitter.strata", pagerank, memory="1G")
    result.values["rank"]        # a NumPy array (memory-mapped from the run directory)
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import sys
import tomllib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _native
from ..errors import ConfigError, InputNotFoundError, ProgramError

#: The file kinds a program may come in.
PROGRAM_SUFFIXES = (".py", ".toml", ".json")

_DTYPES = ("f32", "f64", "i64")
_FOLDS = ("sum", "min", "max")


class VertexProgram:
    """A vertex program (see the module documentation and docs/grid.md).

    ``values`` maps each vertex array's name to ``(dtype, init)`` (dtype ``f32``, ``f64`` or
    ``i64``) or to ``{"dtype": ..., "init": ...}``, in order; ``apply`` maps array names to
    expressions (run in order, each seeing the ones before; ``old.X`` is X before them), or is
    a list of ``"NAME = EXPRESSION"`` strings; ``aggregates`` maps names to
    ``(reduce, expression)``. ``params`` are constants the expressions read by name."""

    def __init__(
        self,
        name: str,
        *,
        values: Mapping | list,
        edge: str,
        apply: Mapping | list | str,
        combine: str = "sum",
        accumulator: str = "f64",
        active: str | None = None,
        start: str | None = None,
        aggregates: Mapping | list | None = None,
        until: str | None = None,
        params: Mapping | None = None,
        iterations: int | None = None,
        symmetric: bool = False,
        outputs: list | None = None,
    ):
        where = f"program {name!r}"
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a vertex program needs a name (a non-empty string), got {name!r}")
        self._spec = {
            "name": name,
            "params": _params(where, params or {}),
            "values": _values(where, values),
            "edge": _text(where, "edge", edge),
            "combine": _choice(where, "combine", combine, _FOLDS),
            "accumulator": _choice(where, "accumulator", accumulator, ("f32", "f64")),
            "apply": _apply(where, apply),
            "aggregates": _aggregates(where, aggregates or {}),
            "symmetric": bool(symmetric),
        }
        for key, text in (("active", active), ("start", start), ("until", until)):
            if text is not None:
                self._spec[key] = _text(where, key, text)
        if iterations is not None:
            if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
                raise ConfigError(f"{where}: iterations must be a whole number >= 1, got {iterations!r}")
            self._spec["iterations"] = iterations
        if outputs is not None:
            if isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs):
                raise ConfigError(f"{where}: outputs must be a list of array names, got {outputs!r}")
            self._spec["outputs"] = list(outputs)

    @property
    def name(self) -> str:
        return self._spec["name"]

    @property
    def params(self) -> dict:
        return dict(self._spec["params"])

    def spec(self) -> dict:
        """The program in the engine's JSON form (lists in declaration order)."""
        return copy.deepcopy(self._spec)

    def to_json(self) -> str:
        return json.dumps(self._spec)

    @classmethod
    def from_spec(cls, spec: Mapping, where: str = "program") -> VertexProgram:
        """A program from its JSON form, or from the same keys as the constructor's (a TOML
        program's tables)."""
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: a vertex program is a table of keys (name, values, edge, apply, ...)")
        spec = dict(spec)
        name = spec.pop("name", None)
        if name is None:
            raise ConfigError(f"{where}: the program needs a name")
        known = [p for p in inspect.signature(cls).parameters if p != "name"]
        for key in spec:
            if key not in known:
                raise ConfigError(f"{where}: {_native.unknown_name('program key', key, known)}")
        missing = [k for k in ("values", "edge", "apply") if k not in spec]
        if missing:
            raise ConfigError(f"{where}: program {name!r} needs {', '.join(missing)}")
        return cls(name, **spec)

    def replace(self, *, iterations: int | None = None, params: Mapping | None = None) -> VertexProgram:
        """A copy with its most ``iterations`` and some ``params`` changed (each must be one it
        declares)."""
        spec = self.spec()
        if iterations is not None:
            spec["iterations"] = iterations
        for key, value in (params or {}).items():
            if key not in spec["params"]:
                msg = _native.unknown_name("parameter", key, sorted(spec["params"]))
                raise ConfigError(f"program {self.name!r}: params: {msg}")
            spec["params"][key] = value
        return VertexProgram.from_spec(spec)

    def check(self) -> VertexProgram:
        """Checks every expression with the engine (names, syntax, declarations); raises
        ConfigError naming the step. Returns the program."""
        _native.config_check("run", {"store": ".", "algorithm": "program", "program": self.to_json()})
        return self

    def __repr__(self) -> str:
        arrays = ", ".join(f"{v['name']}:{v['dtype']}" for v in self._spec["values"])
        return f"VertexProgram({self.name!r}, values=[{arrays}], edge={self._spec['edge']!r})"


def _text(where: str, key: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key} must be an expression (a non-empty string), got {value!r}")
    return value


def _choice(where: str, key: str, value, choices: tuple) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: {key}: {_native.unknown_name('choice', str(value), list(choices))}")
    return value


def _params(where: str, params) -> dict:
    if not isinstance(params, Mapping):
        raise ConfigError(f"{where}: params must map names to numbers, got {params!r}")
    out = {}
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: params[{key!r}] must be a number, got {value!r}")
        out[str(key)] = float(value)
    return out


def _declarations(where: str, what: str, given, keys: tuple[str, str]) -> list[tuple[str, tuple]]:
    """``(name, (first, second))`` for each declaration of ``given``: a mapping of names to
    ``(first, second)`` pairs or to tables of ``keys``, or a list of tables with ``name`` and
    ``keys`` (the JSON form)."""
    pair = f"({', '.join(keys)})"
    if isinstance(given, list):
        named = []
        for k, table in enumerate(given):
            if not (isinstance(table, Mapping) and set(table) == {"name", *keys}):
                raise ConfigError(f"{where}: {what}[{k}] must be a table of name, {' and '.join(keys)}; got {table!r}")
            named.append((table["name"], table))
    elif isinstance(given, Mapping):
        named = list(given.items())
    else:
        raise ConfigError(f"{where}: {what} must map names to {pair}, got {given!r}")
    out = []
    for name, decl in named:
        if isinstance(decl, Mapping) and set(decl) - {"name"} == set(keys):
            decl = tuple(decl[k] for k in keys)
        if not (isinstance(decl, tuple | list) and len(decl) == 2):
            raise ConfigError(f"{where}: {what}[{name!r}] must be {pair}, got {decl!r}")
        out.append((str(name), tuple(decl)))
    return out


def _values(where: str, values) -> list:
    out = []
    for name, (dtype, init) in _declarations(where, "values", values, ("dtype", "init")):
        if isinstance(init, int | float) and not isinstance(init, bool):
            init = repr(float(init))
        out.append(
            {
                "name": name,
                "dtype": _choice(where, f"values[{name!r}].dtype", dtype, _DTYPES),
                "init": _text(where, f"values[{name!r}].init", init),
            }
        )
    return out


def _apply(where: str, apply) -> list:
    if isinstance(apply, str):
        statements = [line.strip() for line in apply.splitlines() if line.strip()]
    elif isinstance(apply, Mapping):
        statements = [f"{name} = {_text(where, f'apply[{name!r}]', text)}" for name, text in apply.items()]
    elif isinstance(apply, list):
        statements = [_text(where, f"apply[{k}]", s) for k, s in enumerate(apply)]
    else:
        raise ConfigError(f"{where}: apply must map array names to expressions, got {apply!r}")
    return statements


def _aggregates(where: str, aggregates) -> list:
    return [
        {
            "name": name,
            "reduce": _choice(where, f"aggregates[{name!r}].reduce", reduce, _FOLDS),
            "expr": _text(where, f"aggregates[{name!r}]", text),
        }
        for name, (reduce, text) in _declarations(where, "aggregates", aggregates, ("reduce", "expr"))
    ]


# ---------------------------------------------------------------------------------------------
# Program files


def load_program(path: str | Path) -> VertexProgram:
    """The program in ``path``: a ``.py`` file defining a :class:`VertexProgram` (the one named
    ``program``, or its only one), or a ``.toml`` or ``.json`` file of the program's keys.
    Raises ProgramError (a file without a program, code that raised) or ConfigError."""
    path = Path(path)
    if path.suffix not in PROGRAM_SUFFIXES:
        raise ConfigError(f"{path}: a vertex program is a .py, .toml or .json file")
    if not path.is_file():
        raise InputNotFoundError(f"{path}: no such program file")
    if path.suffix == ".py":
        return _from_python(path)
    kind, parse, malformed = {
        ".toml": ("TOML", tomllib.loads, tomllib.TOMLDecodeError),
        ".json": ("JSON", json.loads, json.JSONDecodeError),
    }[path.suffix]
    try:
        spec = parse(path.read_text(encoding="utf-8-sig"))
    except malformed as e:
        raise ConfigError(f"{path}: not {kind}: {e}") from None
    return VertexProgram.from_spec(spec, where=str(path))


def _from_python(path: Path) -> VertexProgram:
    module_name = f"_strata_program_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (ConfigError, ProgramError):
        raise
    except Exception as e:  # the user's code: report where it failed, not our traceback
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
        line = f" (line {frames[-1].lineno})" if frames else ""
        raise ProgramError(f"{path}{line}: running the program file raised {type(e).__name__}: {e}") from None
    finally:
        sys.modules.pop(module_name, None)
    chosen = getattr(module, "program", None)
    if isinstance(chosen, VertexProgram):
        return chosen
    found = {k: v for k, v in vars(module).items() if isinstance(v, VertexProgram) and not k.startswith("_")}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise ProgramError(f"{path}: defines no VertexProgram (make one with strata.grid.VertexProgram)")
    raise ProgramError(
        f"{path}: defines {len(found)} VertexPrograms ({', '.join(sorted(found))}); name the one to run `program`"
    )


def program_text(given: str) -> tuple[str, dict]:
    """The engine's JSON text and the parsed spec of ``--program``'s value: a file (read
    here) or JSON text (parsed and passed on)."""
    stripped = given.strip()
    if stripped.startswith("{"):
        try:
            spec = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ConfigError(f"run.program: not JSON: {e}") from None
        return stripped, spec
    program = load_program(stripped)
    return program.to_json(), program.spec()


# ---------------------------------------------------------------------------------------------
# Running one


@dataclass
class ProgramResult:
    """What :func:`run_program` returns: the result arrays (memory-mapped from the run
    directory), the native run summary, and the run directory."""

    values: dict[str, np.ndarray]
    summary: dict
    out: Path

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]


def run_program(
    target: str | Path,
    program: VertexProgram | str | Path | Mapping,
    *,
    iterations: int | None = None,
    params: Mapping | None = None,
    progress=None,
    on_iteration=None,
    **options,
) -> ProgramResult:
    """Runs ``program`` (a :class:`VertexProgram`, a program file, or its JSON form) on the
    store ``target`` (its grid found or built for what the program reads) or on the grid
    directory ``target`` (``STORE/grids/NAME``), within ``memory``. ``iterations`` and
    ``params`` override the program's; other keyword options are ``[run]``'s (``memory``,
    ``out``, ``threads``, ``vertex``, ``keep_resident``, ``far``, ...), their defaults its. Results go to ``out``
    (``STORE/runs/grid-program-NAME``) with ``metrics.jsonl`` and ``run.json``."""
    from . import RunConfig, run

    if isinstance(program, str | Path):
        program = load_program(program)
    elif isinstance(program, Mapping):
        program = VertexProgram.from_spec(program)
    elif not isinstance(program, VertexProgram):
        raise ConfigError(
            f"run_program: program must be a VertexProgram, a program file or its JSON form, got {program!r}"
        )
    if iterations is not None or params:
        program = program.replace(iterations=iterations, params=params)
    target = Path(target)
    if (target / "grid.json").is_file():
        options.setdefault("grid", target.name)
        target = target.parent.parent
    cfg = RunConfig(algorithm="program", store=target, program=program.to_json(), **options)
    summary = run(cfg, progress=progress, on_iteration=on_iteration)
    values = {Path(p).stem: np.load(p, mmap_mode="r") for p in summary["arrays"]}
    return ProgramResult(values=values, summary=summary, out=Path(summary["out"]))
