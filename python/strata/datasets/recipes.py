"""Recipes: how the raw files of each catalogue family become a store (see docs/datasets.md).

- ``kg``: DGL-KE knowledge-graph folders, ``train.txt`` / ``valid.txt`` / ``test.txt`` with
  tab-separated ``head relation tail`` names (string ids, numbered densely in sorted order).
- ``freebase``: DGL-KE's Freebase folder, the same files with integer ``head tail relation`` ids;
  the entity and relation counts come from the first line of ``entity2id.txt`` / ``relation2id.txt``.
- ``planetoid``: the ``ind.NAME.*`` files, processed as PyTorch Geometric does.
- ``ogb``: OGB node-property zips (homogeneous, or heterogeneous as ogbn-mag), staged as ``.npy``
  files in bounded memory (:mod:`.ogb`).
- ``snap``: SNAP edge lists, integer ids, ``#`` comments, read gzip-compressed as downloaded.

Every recipe ends in :func:`strata.convert.convert`, which streams within the memory budget.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import ConvertConfig, Size
from ..convert import convert
from ..errors import InputError, InputNotFoundError
from ..paths import make_dir
from . import ogb
from .planetoid import datasets_in
from .registry import Dataset

ProgressFn = Callable[..., bool]
MIB = 1 << 20


@dataclass(frozen=True)
class Build:
    """Where and how to build a store: the options every recipe passes to the converter."""

    out: Path
    memory: int
    threads: int = 0
    overwrite: bool = False
    #: None keeps the dataset's own convention.
    symmetrize: bool | None = None


def build_store(ds: Dataset, raw: Path, build: Build, progress: ProgressFn | None = None) -> dict:
    """Converts the raw files of ``ds`` (under ``raw``) into the store ``build.out``; returns the
    conversion summary (see :func:`strata.convert.format_summary`)."""
    common = {
        "out": build.out,
        "name": ds.name,
        "memory": Size(build.memory),
        "threads": build.threads,
        "overwrite": build.overwrite,
        "symmetrize": ds.symmetrize if build.symmetrize is None else build.symmetrize,
    }
    return _RECIPES[ds.recipe](ds, raw, common, build, progress)


def _find_one(raw: Path, name: str) -> Path:
    """The single file called ``name`` anywhere under ``raw`` (archives put it in a subfolder)."""
    found = sorted(raw.rglob(name))
    if not found:
        raise InputNotFoundError(f"{raw}: no {name} in the downloaded files")
    if len(found) > 1:
        raise InputError(f"{raw}: several {name} files ({', '.join(map(str, found))}); keep one")
    return found[0]


def _splits(raw: Path) -> dict:
    train = _find_one(raw, "train.txt")
    return {
        "inputs": [train],
        "valid": [p for p in [train.with_name("valid.txt")] if p.exists()],
        "test": [p for p in [train.with_name("test.txt")] if p.exists()],
        "format": "text",
        "delimiter": "tab",
        # Names are data, never comments: Freebase mids and WordNet offsets may start with anything.
        "comment": "",
    }


def _kg(ds: Dataset, raw: Path, common: dict, build: Build, progress: ProgressFn | None) -> dict:
    # WN18RR's entities are zero-padded numbers ("00260881"): integer parsing would merge and
    # renumber them, so ids are names here.
    cfg = ConvertConfig(**common, **_splits(raw), columns="src,rel,dst", ids="string", relation_ids="string")
    return convert(cfg, progress)


def _first_count(path: Path) -> int | None:
    """The count on the first line of an OpenKE-style ``entity2id.txt``, if the file is there."""
    if not path.exists():
        return None
    with path.open() as f:
        first = f.readline().strip()
    if not first.isdigit():
        raise InputError(f"{path}: expected the number of entries on the first line, found {first[:40]!r}")
    return int(first)


def _freebase(ds: Dataset, raw: Path, common: dict, build: Build, progress: ProgressFn | None) -> dict:
    splits = _splits(raw)
    folder = splits["inputs"][0].parent
    cfg = ConvertConfig(
        **common,
        **splits,
        columns="src,dst,rel",
        ids="int",
        relation_ids="int",
        num_nodes=_first_count(folder / "entity2id.txt"),
        num_relations=_first_count(folder / "relation2id.txt"),
    )
    return convert(cfg, progress)


def _planetoid(ds: Dataset, raw: Path, common: dict, build: Build, progress: ProgressFn | None) -> dict:
    if ds.name.lower() not in datasets_in(raw):
        raise InputNotFoundError(f"{raw}: the Planetoid files ind.{ds.name.lower()}.* are incomplete")
    return convert(ConvertConfig(**common, inputs=[raw], format="planetoid"), progress)


def _ogb(ds: Dataset, raw: Path, common: dict, build: Build, progress: ProgressFn | None) -> dict:
    root = ogb.find_root(raw)
    parent = build.out.absolute().parent
    make_dir(parent, "--out")
    staging = Path(tempfile.mkdtemp(prefix=f".{ds.name}-staging-", dir=parent))
    try:
        # A 32nd of the budget per block of text: parsing holds the block and its numbers a few times.
        chunk = min(max(build.memory // 32, MIB), 64 * MIB)
        if ogb.is_hetero(root):
            typed = ogb.stage_hetero(root, staging, chunk, progress)
            return convert(ConvertConfig(**common, inputs=[typed], format="numpy"), progress)
        staged = ogb.stage(root, staging, chunk, progress)
        cfg = ConvertConfig(
            **common,
            inputs=[staged.edges],
            format="numpy",
            layout=staged.layout,
            features=staged.features,
            labels=staged.labels,
            num_nodes=staged.num_nodes,
            **staged.splits,
        )
        return convert(cfg, progress)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _snap(ds: Dataset, raw: Path, common: dict, build: Build, progress: ProgressFn | None) -> dict:
    (edges,) = (raw / f.name for f in ds.files)
    cfg = ConvertConfig(**common, inputs=[edges], format="text", columns="src,dst", ids="int", comment="#")
    return convert(cfg, progress)


_RECIPES = {"kg": _kg, "freebase": _freebase, "planetoid": _planetoid, "ogb": _ogb, "snap": _snap}
