"""Creating output directories with a true message when a path component is a file, refusing
outputs that would replace a store's, a grid's or another command's run's files, and staging
directories that a killed process's successor cleans up."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError


def make_dir(path: str | Path, what: str) -> Path:
    """Creates directory ``path`` and its missing parents (``mkdir -p``) and returns it. When a
    component of ``path`` is a file rather than a directory, raises ConfigError naming ``what``
    (the option, such as ``--out``) and that file, instead of the operating system's
    "File exists" or "Not a directory"."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise ConfigError(
            f"{what} {path}: {blocker} is a file, not a directory, so the output cannot be created there"
        ) from None
    except OSError as e:
        # A read-only or virtual file system, a name too long, no permission.
        raise ConfigError(f"{what} {path}: the directory cannot be created: {e.strerror}") from None
    return path


def refuse_foreign_dir(path: str | Path, what: str, ours: Callable[[dict], bool]) -> None:
    """Refuses output directory ``path`` (the option ``what``, e.g. ``--run-dir``) when it holds
    what the command must not write into: a store (``manifest.json``), a grid (``grid.json``)
    or a ``run.json`` that ``ours(record)`` does not accept as the command's own (another
    engine's run, whose record would be replaced). A new, empty or earlier own directory
    passes."""
    path = Path(path)
    found = _holder(path)
    if found == "a run":
        try:
            record = json.loads((path / "run.json").read_text())
        except (OSError, ValueError):
            record = None
        found = None if ours(record) else "another kind of run (its run.json is not this command's)"
    if found is not None:
        raise ConfigError(f"{what} {path} is {found}; choose a new directory")


def refuse_owned_file(path: str | Path, what: str) -> None:
    """Refuses output file ``path`` (the option ``what``, e.g. ``--out``) when it is a
    directory, or an existing file of a store, a grid or a run (its manifest, an array, a
    checkpoint), which writing would replace. A new file, or one of the user's own, passes."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give the path of a file to write")
    holder = _holder(path.parent)
    if holder is not None and path.exists():
        raise ConfigError(f"{what} {path} is a file of {holder} ({path.parent}); write to a new file")


def _holder(path: Path) -> str | None:
    """What directory ``path`` is, by its marker file: a store, a grid or a run; else None."""
    for marker, kind in (("manifest.json", "a store"), ("grid.json", "a grid"), ("run.json", "a run")):
        if (path / marker).is_file():
            return kind
    return None


def existing_dir(path: str | Path, what: str) -> Path:
    """Returns ``path`` when it is an existing directory; otherwise raises ConfigError naming
    ``what`` (the option, such as ``--dir``) and what is wrong: the path is missing, or it or
    one of its parents is a file."""
    path = Path(path)
    if path.is_dir():
        return path
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ConfigError(f"{what} {path}: {blocker} is a file, not a directory")
    raise ConfigError(f"{what} {path}: no such directory")


def staging_dir(parent: Path, store_name: str, kind: str) -> Path:
    """Creates ``parent/.STORE_NAME-KIND-PID`` for a conversion's staging files (``kind``:
    ``parquet``, ``arrays``), first removing those that conversions no longer running left
    there (killed ones). The caller removes its own when done."""
    prefix = f".{store_name}-{kind}-"
    for old in parent.glob(f"{prefix}*"):
        pid = old.name[len(prefix) :]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True)
    staging = parent / f"{prefix}{os.getpid()}"
    staging.mkdir()
    return staging


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
