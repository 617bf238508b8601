"""``strata datasets fetch``: download a catalogue dataset, extract it, and convert it to a store.

Layout under ``--dir D``: ``D/NAME/raw/`` holds the downloaded files (and what the archives
held), ``D/NAME/NAME.strata`` the store. Each step is skipped when its result is already there,
so running fetch again after an interruption picks up where it stopped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config import FetchConfig
from ..errors import ConfigError, StrataError
from ..store import Store
from ..units import fmt_bytes
from .download import download, extract, is_archive, no_progress
from .recipes import Build, build_store
from .registry import Dataset, RemoteFile, get

ProgressFn = Callable[..., bool]
#: Environment variable read when ``--mirror`` is not given.
MIRROR_ENV = "STRATA_DATASETS_MIRROR"


@dataclass
class FetchResult:
    """What a fetch found and did."""

    dataset: Dataset
    raw_dir: Path
    #: The store, or None when conversion was turned off.
    store: Path | None
    #: Names of the files transferred by this run, and their total size in bytes.
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    #: The conversion summary; None when the store already existed or conversion was off.
    summary: dict | None = None

    def describe(self) -> str:
        """One line on the downloads and on the store when it was not built by this run."""
        if self.downloaded:
            count = len(self.downloaded)
            text = (
                f"{self.dataset.name}: downloaded {count} file{'s' if count != 1 else ''} "
                f"({fmt_bytes(self.downloaded_bytes)}) into {self.raw_dir}."
            )
        else:
            text = f"{self.dataset.name}: every file was already in {self.raw_dir}."
        if self.store is None:
            text += " Conversion skipped (--no-convert)."
        elif self.summary is None:
            text += f" Store {self.store} already exists; --overwrite rebuilds it."
        return text

    def as_dict(self) -> dict:
        """The result as JSON-able data."""
        return {
            "dataset": self.dataset.name,
            "raw_dir": str(self.raw_dir),
            "store": str(self.store) if self.store else None,
            "downloaded": self.downloaded,
            "downloaded_bytes": self.downloaded_bytes,
            "conversion": self.summary,
        }


def file_url(ds: Dataset, f: RemoteFile, mirror: str | None) -> str:
    """Where to fetch file ``f``: its catalogue URL, or ``{mirror}/{dataset}/{file}``."""
    return f"{mirror.rstrip('/')}/{ds.name}/{f.name}" if mirror else f.url


def fetch(cfg: FetchConfig, progress: ProgressFn | None = None) -> FetchResult:
    """Downloads (resuming), verifies and extracts the files of dataset ``cfg.name`` into
    ``cfg.dir/NAME/raw``, then converts them into a store unless ``cfg.convert`` is off."""
    progress = progress or no_progress
    ds = get(cfg.name)
    root = cfg.dir / ds.name
    raw = root / "raw"
    mirror = cfg.mirror or os.environ.get(MIRROR_ENV) or None
    result = FetchResult(ds, raw, None)
    store = cfg.out or root / f"{ds.name}.strata"
    built = cfg.convert and _holds_store_of(store, ds, cfg.overwrite)
    for f in ds.files:
        dest = raw / f.name
        # Extraction leaves a marker, so an archive deleted afterwards (--no-keep-archives) is not
        # fetched again, and an interrupted extraction is redone.
        marker = raw / f".{f.name}.extracted"
        if cfg.force:
            marker.unlink(missing_ok=True)
        if is_archive(f.name) and marker.exists() and not dest.exists():
            continue
        url = file_url(ds, f, mirror)
        if download(
            url, dest, checksum=f.checksum, timeout=cfg.timeout, retries=cfg.retries, force=cfg.force, progress=progress
        ):
            result.downloaded.append(f.name)
            result.downloaded_bytes += dest.stat().st_size
            marker.unlink(missing_ok=True)
        if is_archive(f.name):
            if not marker.exists():
                extract(dest, raw, progress)
                marker.touch()
            if not cfg.keep_archives:
                dest.unlink()
    if not cfg.convert:
        return result
    result.store = store
    if built and not cfg.overwrite:
        return result
    build = Build(result.store, int(cfg.memory), cfg.threads, cfg.overwrite, cfg.symmetrize)
    result.summary = build_store(ds, raw, build, progress)
    return result


def _holds_store_of(store: Path, ds: Dataset, overwrite: bool) -> bool:
    """Whether ``store`` already holds the store of ``ds`` (a fetch keeps it unless
    ``overwrite``); False when nothing is there. Anything else there is refused before a byte
    is downloaded: a script that fetched into the wrong ``--out`` would otherwise go on with
    another graph, told only that the store "already exists"."""
    if not os.path.lexists(store):
        return False
    try:
        name = Store(store).name
    except StrataError as e:
        raise ConfigError(
            f"--out {store} exists and is not a store to keep or replace ({e}); choose another --out"
        ) from None
    if name != ds.name and not overwrite:
        raise ConfigError(
            f"--out {store} is the store of '{name}', not of {ds.name}: choose another --out, "
            "or --overwrite replaces it"
        )
    return True
