"""``strata convert``: from text edge lists, Parquet edge tables (staged as text by
:mod:`strata.parquet`), NumPy arrays (plain or typed), raw int32 pairs or Planetoid files into a
store, streaming within a memory budget (the work happens in ``strata._native``);
:func:`convert_dicts` converts OGB/PyG-style typed dicts held in memory."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import _native, parquet
from .config import ConvertConfig, as_dict
from .datasets import hetero
from .datasets.planetoid import read_planetoid
from .errors import ConfigError, InputError, InputNotFoundError, StrataError
from .paths import staging_dir
from .units import fmt_bytes, fmt_count, fmt_duration

ProgressFn = Callable[..., bool]


@dataclass
class Plan:
    """What a conversion reads, as its input format planned it in Rust
    (``strata_store::convert::SourcePlan``): the format (``numpy-typed`` for a typed NumPy
    directory), the edge files per split and the other files by role."""

    format: str
    train: list[Path]
    valid: list[Path] = field(default_factory=list)
    test: list[Path] = field(default_factory=list)
    #: Other files by role (a NumPy directory's ``features``, ``labels``, ``node_train``, ...).
    files: dict[str, Path] = field(default_factory=dict)
    #: ``--edges-of`` files: ``{"path", "edge_type": [src, relation, dst]}``.
    edges_of: list[dict] = field(default_factory=list)
    #: Planetoid's directory and dataset name.
    dataset: tuple[Path, str] | None = None
    #: The directory of a typed NumPy conversion.
    typed: Path | None = None
    #: Bytes of the planned files.
    bytes: int = 0
    #: The ``[convert]`` options the format reads beside the shared ones.
    options: list[str] = field(default_factory=list)
    #: The format the front end stages this one as (Parquet, Planetoid), or None.
    staged_as: str | None = None


def plan_inputs(cfg: ConvertConfig) -> Plan:
    """Decides the format and the role of each input from the config and the files (the input
    formats' detection and plans, in ``strata._native``)."""
    p = _native.convert_plan(as_dict(cfg))
    paths = lambda key: [Path(x) for x in p[key]]  # noqa: E731
    return Plan(
        format=p["kind"],
        train=paths("train"),
        valid=paths("valid"),
        test=paths("test"),
        files={k: Path(v) for k, v in p["files"].items()},
        edges_of=[{"path": Path(e["path"]), "edge_type": list(e["edge_type"])} for e in p["edges_of"]],
        dataset=(Path(p["dataset"][0]), p["dataset"][1]) if p["dataset"] else None,
        typed=Path(p["typed"]) if p["typed"] else None,
        bytes=p["bytes"],
        options=list(p["options"]),
        staged_as=p["staged_as"],
    )


def convert(cfg: ConvertConfig, progress: ProgressFn | None = None) -> dict:
    """Runs a conversion; returns the summary (counts, bytes, timings, budget plan). Formats
    Strata reads itself convert from the checked section in ``strata._native``; Parquet and
    Planetoid inputs are staged here first (:data:`_STAGERS`)."""
    plan = plan_inputs(cfg)
    provenance = {"config": as_dict(cfg)}
    if plan.staged_as is not None:
        return _STAGERS[plan.format](cfg, plan, provenance, progress)
    return _native.convert(as_dict(cfg), provenance, progress)


def _default_columns(cfg: ConvertConfig) -> str:
    return "src,rel,dst" if cfg.relations else "src,dst"


def _convert_parquet(cfg: ConvertConfig, plan: Plan, provenance: dict, progress: ProgressFn | None) -> dict:
    """Stages each Parquet file as CSV beside the store (:mod:`strata.parquet`), one record
    batch at a time, and converts the CSV files with the text converter. The plan in Rust has
    refused text files among them and the text converter's options."""
    files = [e["path"] for e in plan.edges_of] + plan.train + plan.valid + plan.test
    pairs = parquet.parse_columns(cfg.columns or _default_columns(cfg))
    parent = Path(cfg.out).absolute().parent
    if not parent.is_dir():
        raise InputNotFoundError(f"{parent}: the output's parent directory does not exist")
    staging = staging_dir(parent, Path(cfg.out).name, "parquet")
    staged: list[parquet.Staged] = []
    try:
        for i, path in enumerate(files):
            staged.append(parquet.stage(path, pairs, staging / f"{i}.csv"))
        id_kinds = {s.id_kind for s in staged}
        rel_kinds = {s.rel_kind for s in staged}
        if len(id_kinds) > 1 or len(rel_kinds) > 1:
            raise InputError(
                "convert: the Parquet files disagree on the id columns' types (integers in some, strings in others)"
            )
        dims = {s.feature_dim for s in staged}
        if len(dims) > 1:
            raise InputError(
                f"convert: the Parquet files' feat columns hold different numbers of features ({sorted(dims)})"
            )
        csv = {p: s.csv for p, s in zip(files, staged, strict=True)}
        rel_kind = rel_kinds.pop()
        text = replace(
            cfg,
            format="text",
            inputs=[csv[p] for p in plan.train],
            valid=[csv[p] for p in plan.valid],
            test=[csv[p] for p in plan.test],
            edges_of=[":".join(e["edge_type"]) + f"={csv[e['path']]}" for e in plan.edges_of],
            columns=",".join(parquet.text_columns(pairs, dims.pop())),
            delimiter="comma",
            comment="",
            header=False,
            ids=id_kinds.pop() if cfg.ids == "auto" else cfg.ids,
            relation_ids=rel_kind if cfg.relation_ids == "auto" and rel_kind is not None else cfg.relation_ids,
        )
        try:
            summary = _native.convert(as_dict(text), provenance, progress)
        except StrataError as e:
            raise type(e)(parquet.rename_error(str(e), staged, pairs)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    summary["converter"] = "parquet"
    summary["input_bytes"] = sum(p.stat().st_size for p in files)
    return summary


def convert_dicts(
    out: str | Path,
    num_nodes_dict: Mapping[str, int],
    edge_index_dict: Mapping[tuple[str, str, str], np.ndarray],
    *,
    node_feat_dict: Mapping[str, np.ndarray] | None = None,
    node_label_dict: Mapping[str, np.ndarray] | None = None,
    y_dict: Mapping[str, np.ndarray] | None = None,
    split_dict: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    edge_weight_dict: Mapping[tuple[str, str, str], np.ndarray] | None = None,
    edge_time_dict: Mapping[tuple[str, str, str], np.ndarray] | None = None,
    progress: ProgressFn | None = None,
    **options,
) -> dict:
    """Converts a typed graph held in OGB/PyG-style dicts into a store at ``out``.

    ``num_nodes_dict`` {type: count} fixes the node types and their id order;
    ``edge_index_dict`` {(src_type, relation, dst_type): (2, E) local ids} the edge types, in
    its order. Optional: ``node_feat_dict`` {type: (count, dim)}, ``node_label_dict`` (or PyG's
    ``y_dict``) {type: (count,) labels, -1 or NaN unlabelled}, ``split_dict`` (OGB's
    ``get_idx_split()``: {"train": {type: local ids}, ...}), ``edge_weight_dict`` and
    ``edge_time_dict`` {edge type: (E,)}. The arrays are saved as ``.npy`` files beside ``out``
    and streamed through the typed NumPy converter; ``options`` are ``ConvertConfig`` fields
    (``memory``, ``overwrite``, ``split``, ``seed``, ``name``, ...). Returns the summary.
    """
    if node_label_dict is not None and y_dict is not None:
        raise ConfigError("convert_dicts: give node_label_dict or y_dict, not both")
    out = Path(out)
    parent = out.absolute().parent
    if not parent.is_dir():
        raise InputNotFoundError(f"{parent}: the output's parent directory does not exist")
    staging = staging_dir(parent, out.name, "arrays")
    try:
        hetero.stage_dicts(
            staging,
            num_nodes_dict,
            edge_index_dict,
            node_feat_dict=node_feat_dict,
            node_label_dict=node_label_dict if node_label_dict is not None else y_dict,
            split_dict=split_dict,
            edge_weight_dict=edge_weight_dict,
            edge_time_dict=edge_time_dict,
        )
        cfg = ConvertConfig(**options, inputs=[staging], out=out, format="numpy")
        return convert(cfg, progress)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _convert_planetoid(cfg: ConvertConfig, plan: Plan, provenance: dict, progress: ProgressFn | None) -> dict:
    """Reads the Planetoid dataset's pickles, stages its arrays as ``.npy`` files beside the
    store and converts those with the NumPy converter."""
    directory, name = plan.dataset
    data = read_planetoid(directory, name)
    parent = Path(cfg.out).absolute().parent
    if not parent.is_dir():
        raise InputNotFoundError(f"{parent}: the output's parent directory does not exist")
    staging = staging_dir(parent, Path(cfg.out).name, "arrays")
    try:
        arrays = {
            "edges": data.edge_index,
            "features": data.x,
            "labels": data.y,
            "node_train": data.train_idx,
            "node_valid": data.val_idx,
            "node_test": data.test_idx,
        }
        for key, arr in arrays.items():
            np.save(staging / f"{key}.npy", arr)
        numpy_cfg = replace(
            cfg,
            inputs=[staging],
            format="numpy",
            name=cfg.name or name,
            features=None,
            labels=None,
            node_train=None,
            node_valid=None,
            node_test=None,
            valid=[],
            test=[],
        )
        summary = _native.convert(as_dict(numpy_cfg), provenance, progress)
        summary["converter"] = "planetoid"
        return summary
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: Readers of the formats the front end stages for the native converters (``Plan.staged_as``),
#: by format name.
_STAGERS = {"parquet": _convert_parquet, "planetoid": _convert_planetoid}


def _named(items, most: int = 6) -> str:
    """``items`` joined by commas, the first ``most`` of them and a count of the rest."""
    items = list(items)
    rest = f", and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + rest


def format_summary(s: dict) -> str:
    """The one-paragraph summary printed at the end of a conversion."""
    edges = s["num_edges"]
    total = sum(edges.values())
    split_text = " / ".join(f"{edges[k]:,} {k}" for k in ("train", "valid", "test") if k in edges)
    rel = f" and {s['num_relations']:,} relations" if s["num_relations"] else ""
    if s.get("node_types"):
        nt, et = s["node_types"], s["edge_types"]
        rel = f" of {len(nt)} types ({_named(f'{n} {c:,}' for n, c in nt)}) and {len(et)} edge types " + _named(
            f"({a}, {r}, {b})" for a, r, b in et
        )
    secs = s["seconds"]
    feats = ""
    if s.get("features"):
        f = s["features"]
        feats = f", {f['dim']}-dim {f['dtype']} features"
    if s.get("labels"):
        feats += f", {s['labels']['num_classes']} classes"
    if s.get("node_splits"):
        ns = s["node_splits"]
        feats += " (nodes " + " / ".join(f"{ns[k]:,} {k}" for k in ("train", "valid", "test") if k in ns) + ")"
    stages = ", ".join(f"{st['name']} {fmt_duration(st['seconds'])}" for st in s["stages"])
    return (
        f"Converted {total:,} edges ({split_text}) among {s['num_nodes']:,} nodes{rel}{feats} "
        f"from {s['input_files']} {s['converter']} input file{'s' if s['input_files'] != 1 else ''} "
        f"({fmt_bytes(s['input_bytes'])}) in {fmt_duration(secs)}: {fmt_count(s['input_rows'] / max(secs, 1e-9))} "
        f"edges/s, {s['input_bytes'] / max(secs, 1e-9) / 1e6:.1f} MB/s of input. "
        f"Store {s['store']}: {fmt_bytes(s['store_bytes'])} on disk, {s['id_dtype']} ids, CSR/CSC over "
        f"{s['num_topology_edges']:,} edges, built within a {fmt_bytes(s['memory'])} budget ({stages})."
    )
