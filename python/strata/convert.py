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
from .datasets.planetoid import datasets_in, read_planetoid
from .errors import ConfigError, InputError, InputNotFoundError, StrataError
from .paths import staging_dir
from .units import fmt_bytes, fmt_count, fmt_duration

ProgressFn = Callable[..., bool]

TEXT_SUFFIXES = (".txt", ".tsv", ".csv", ".edges", ".el", ".gz")
SPLIT_STEMS = {"train": ("train",), "valid": ("valid", "validation", "val", "dev"), "test": ("test",)}
NUMPY_NAMES = {
    "edges": ("edges.npy", "edge_index.npy"),
    "valid": ("valid_edges.npy",),
    "test": ("test_edges.npy",),
    "features": ("features.npy", "x.npy", "node_feat.npy"),
    "labels": ("labels.npy", "y.npy", "node_label.npy"),
    "node_train": ("train_idx.npy", "train_mask.npy", "node_train.npy"),
    "node_valid": ("valid_idx.npy", "val_idx.npy", "valid_mask.npy", "val_mask.npy", "node_valid.npy"),
    "node_test": ("test_idx.npy", "test_mask.npy", "node_test.npy"),
}


@dataclass
class Plan:
    """What to convert: the format and the input files per role."""

    format: str
    train: list[Path]
    valid: list[Path] = field(default_factory=list)
    test: list[Path] = field(default_factory=list)
    numpy: dict[str, Path] = field(default_factory=dict)
    planetoid: tuple[Path, str] | None = None
    #: The directory of a typed NumPy conversion (format ``numpy-typed``).
    typed: Path | None = None


def _split_files(directory: Path) -> dict[str, list[Path]]:
    """Text files of a directory by split, recognised by their stem (train.txt, valid.tsv.gz, ...)."""
    found: dict[str, list[Path]] = {"train": [], "valid": [], "test": []}
    for p in sorted(directory.iterdir()):
        if not p.is_file():
            continue
        stem = p.name.split(".")[0].lower()
        for split, stems in SPLIT_STEMS.items():
            if stem in stems:
                found[split].append(p)
    return found


def plan_inputs(cfg: ConvertConfig) -> Plan:
    """Decides the format and the role of each input from the config and the files."""
    inputs = list(cfg.inputs)
    if cfg.edges_of:
        if inputs or cfg.valid or cfg.test:
            raise ConfigError(
                "convert: --edges-of files hold the train edges: give no input, --valid or --test files "
                "beside them (--split makes a random split)"
            )
        return Plan("text", [])
    if not inputs:
        raise ConfigError("convert: no input given (a file, several files, or a directory)")
    for p in inputs + cfg.valid + cfg.test:
        if not p.exists() and not (
            cfg.format in ("auto", "planetoid") and p.parent.is_dir() and p.name.startswith("ind.")
        ):
            raise InputNotFoundError(f"{p}: no such file or directory")
    fmt = cfg.format
    if len(inputs) == 1 and inputs[0].is_dir():
        d = inputs[0]
        planetoid = datasets_in(d)
        numpy_edges = [d / n for n in NUMPY_NAMES["edges"] if (d / n).exists()]
        if fmt == "planetoid" or (fmt == "auto" and planetoid):
            if not planetoid:
                raise InputNotFoundError(
                    f"{d}: no complete set of Planetoid files ind.NAME.{{x,tx,allx,y,ty,ally,graph,test.index}}"
                )
            name = (cfg.name or (planetoid[0] if len(planetoid) == 1 else "")).lower()
            if name not in planetoid:
                raise ConfigError(
                    f"convert.name: {d} holds Planetoid datasets {', '.join(planetoid)}; choose one with --name"
                )
            return Plan("planetoid", [], planetoid=(d, name))
        has_types = cfg.node_types is not None or (d / hetero.NODE_TYPES_FILE).exists()
        if fmt in ("auto", "numpy") and has_types and any(d.glob("edges_e*.npy")):
            return Plan("numpy-typed", [], typed=d)
        if fmt == "numpy" or (fmt == "auto" and numpy_edges):
            if not numpy_edges:
                raise InputNotFoundError(f"{d}: no edges.npy")
            found = {
                role: next((d / n for n in names if (d / n).exists()), None) for role, names in NUMPY_NAMES.items()
            }
            return Plan("numpy", [numpy_edges[0]], numpy={k: v for k, v in found.items() if v is not None})
        splits = _split_files(d)
        if not splits["train"]:
            raise InputNotFoundError(
                f"{d}: found no train file (train.txt, train.tsv, ...), edges.npy, or Planetoid files"
            )
        text_fmt = "bin32" if fmt == "bin32" else "text"
        if fmt in ("auto", "parquet") and all(parquet.is_parquet(p) for p in splits["train"]):
            text_fmt = "parquet"
        return Plan(text_fmt, splits["train"], cfg.valid or splits["valid"], cfg.test or splits["test"])
    if any(p.is_dir() for p in inputs):
        raise ConfigError("convert: give one directory, or files, not both")
    if fmt == "auto":
        if all(parquet.is_parquet(p) for p in inputs):
            fmt = "parquet"
        elif inputs[0].name.startswith("ind.") and not inputs[0].exists():
            fmt = "planetoid"
        elif all(p.suffix == ".npy" for p in inputs):
            fmt = "numpy"
        elif all(p.suffix in (".bin", ".bin32") for p in inputs):
            fmt = "bin32"
        else:
            fmt = "text"
    if fmt == "planetoid":
        prefix = inputs[0]
        return Plan("planetoid", [], planetoid=(prefix.parent, prefix.name.split(".", 1)[1]))
    if fmt == "numpy":
        if len(inputs) != 1:
            raise ConfigError("convert: numpy takes one edges .npy (use --valid/--test for more)")
        return Plan("numpy", inputs)
    return Plan(fmt, inputs, list(cfg.valid), list(cfg.test))


def _edges_of(cfg: ConvertConfig) -> list[dict]:
    """The per-edge-type files of ``--edges-of SRC_TYPE:RELATION:DST_TYPE=FILE`` (GraphBolt's
    ``src:relation:dst`` edge type strings; commas would split the list option)."""
    files = []
    for spec in cfg.edges_of:
        triple, sep, path = spec.partition("=")
        names = triple.split(":")
        if not sep or not path or len(names) != 3 or not all(names):
            raise ConfigError(f"convert.edges_of: expected SRC_TYPE:RELATION:DST_TYPE=FILE, got {spec!r}")
        if not Path(path).is_file():
            raise InputNotFoundError(f"{path}: no such file (convert.edges_of {spec!r})")
        files.append({"path": path, "edge_type": names})
    return files


def _graph_options(cfg: ConvertConfig, out: Path) -> dict:
    return {
        "out": str(out),
        "name": cfg.name,
        "overwrite": cfg.overwrite,
        "memory": int(cfg.memory),
        "threads": cfg.threads,
        "symmetrize": cfg.symmetrize,
        "split": list(cfg.split) if cfg.split else None,
        "seed": cfg.seed,
        "num_nodes": cfg.num_nodes,
        "num_relations": cfg.num_relations,
        "io_chunk": int(cfg.io_chunk),
        "provenance": {"config": as_dict(cfg)},
    }


def _inputs(plan: Plan) -> list[dict]:
    return [{"path": str(p), "split": split} for split in ("train", "valid", "test") for p in getattr(plan, split)]


def _numpy_options(cfg: ConvertConfig, plan: Plan) -> dict:
    found = plan.numpy

    def pick(name: str) -> str | None:
        given = getattr(cfg, name)
        value = given if given is not None else found.get(name)
        return str(value) if value is not None else None

    if len(cfg.valid) > 1 or len(cfg.test) > 1:
        raise ConfigError("convert: numpy takes at most one --valid and one --test .npy")
    valid = cfg.valid[0] if cfg.valid else found.get("valid")
    test = cfg.test[0] if cfg.test else found.get("test")
    return {
        "edges": str(plan.train[0]),
        "valid_edges": str(valid) if valid else None,
        "test_edges": str(test) if test else None,
        "layout": cfg.layout,
        "features": pick("features"),
        "feature_dtype": None if cfg.feature_dtype == "auto" else cfg.feature_dtype,
        "labels": pick("labels"),
        "node_train": pick("node_train"),
        "node_valid": pick("node_valid"),
        "node_test": pick("node_test"),
        "node_split": list(cfg.node_split) if cfg.node_split else None,
    }


def convert(cfg: ConvertConfig, progress: ProgressFn | None = None) -> dict:
    """Runs a conversion; returns the summary (counts, bytes, timings, budget plan)."""
    plan = plan_inputs(cfg)
    out = cfg.out
    graph = _graph_options(cfg, out)
    if plan.format not in ("text", "parquet", "numpy-typed") and (cfg.node_types or cfg.edge_types):
        raise ConfigError(
            "convert: --node-types and --edge-types apply to text and Parquet edge lists and typed NumPy "
            f"directories, not {plan.format} inputs"
        )
    if plan.format != "text" and cfg.edges_of:
        raise ConfigError(f"convert: --edges-of applies to text and Parquet edge lists, not {plan.format} inputs")
    if plan.format not in ("text", "parquet") and cfg.node_bags:
        raise ConfigError(
            f"convert: --node-bags applies to typed text and Parquet edge lists, not {plan.format} inputs"
        )
    edges_of = _edges_of(cfg)
    if plan.format == "parquet" or any(parquet.is_parquet(Path(f["path"])) for f in edges_of):
        return _convert_parquet(cfg, plan, graph, edges_of, progress)
    if plan.format == "text":
        return _native.convert_text(text_job(cfg, plan, edges_of), progress)
    if plan.format == "bin32":
        return _native.convert_binary({"graph": graph, "inputs": _inputs(plan)}, progress)
    if plan.format == "numpy":
        return _native.convert_numpy({"graph": graph, "numpy": _numpy_options(cfg, plan)}, progress)
    if plan.format == "numpy-typed":
        return _native.convert_typed_numpy({"graph": graph, "typed_numpy": _typed_options(cfg, plan)}, progress)
    return _convert_planetoid(cfg, plan, graph, progress)


def text_job(cfg: ConvertConfig, plan: Plan, edges_of: list[dict] | None = None) -> dict:
    """The text converter's job (``strata_store::convert::TextJob``) for ``plan``'s files."""
    columns = cfg.columns or _default_columns(cfg)
    text = _text_options(cfg, _inputs(plan), [c.strip() for c in columns.split(",")], edges_of or [])
    return {"graph": _graph_options(cfg, cfg.out), "text": text}


def _default_columns(cfg: ConvertConfig) -> str:
    return "src,rel,dst" if cfg.relations else "src,dst"


def _text_options(cfg: ConvertConfig, inputs: list[dict], columns: list[str], edges_of: list[dict]) -> dict:
    """The text converter's options: ``inputs`` as :func:`_inputs` gives them, ``columns`` the
    role of each field."""
    return {
        "inputs": inputs,
        "columns": columns,
        "delimiter": cfg.delimiter,
        "comment": cfg.comment,
        "header": cfg.header,
        "ids": cfg.ids,
        "relation_ids": cfg.relation_ids,
        "node_types": str(cfg.node_types) if cfg.node_types else None,
        "edge_types": str(cfg.edge_types) if cfg.edge_types else None,
        "edges_of": edges_of,
        "node_bags": list(cfg.node_bags),
    }


def _convert_parquet(
    cfg: ConvertConfig, plan: Plan, graph: dict, edges_of: list[dict], progress: ProgressFn | None
) -> dict:
    """Stages each Parquet file as CSV beside the store (:mod:`strata.parquet`), one record
    batch at a time, and converts the CSV files with the text converter."""
    files = [Path(f["path"]) for f in edges_of] + [Path(i["path"]) for i in _inputs(plan)]
    text_files = [str(p) for p in files if not parquet.is_parquet(p)]
    if text_files:
        raise ConfigError(f"convert: give Parquet files only, or text files only; {text_files[0]} is not Parquet")
    if cfg.header or cfg.delimiter != "auto" or cfg.comment != "#":
        raise ConfigError("convert: --header, --delimiter and --comment apply to text inputs, not Parquet")
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
        by_path = dict(zip(files, staged, strict=True))
        typed = [{**f, "path": str(by_path[Path(f["path"])].csv)} for f in edges_of]
        inputs = [{**i, "path": str(by_path[Path(i["path"])].csv)} for i in _inputs(plan)]
        text = _text_options(cfg, inputs, parquet.text_columns(pairs, dims.pop()), typed)
        text.update(delimiter="comma", comment="", header=False)
        if cfg.ids == "auto":
            text["ids"] = id_kinds.pop()
        rel_kind = rel_kinds.pop()
        if cfg.relation_ids == "auto" and rel_kind is not None:
            text["relation_ids"] = rel_kind
        try:
            summary = _native.convert_text({"graph": graph, "text": text}, progress)
        except StrataError as e:
            raise type(e)(parquet.rename_error(str(e), staged, pairs)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    summary["converter"] = "parquet"
    summary["input_bytes"] = sum(p.stat().st_size for p in files)
    return summary


def _typed_options(cfg: ConvertConfig, plan: Plan) -> dict:
    """The typed NumPy inputs of ``plan.typed`` (named as datasets/hetero.py describes)."""
    given = [
        f"--{k.replace('_', '-')}"
        for k in ("features", "labels", "node_train", "node_valid", "node_test", "node_split")
        if getattr(cfg, k) is not None
    ] + [f"--{k}" for k in ("valid", "test") if getattr(cfg, k)]
    if given:
        raise ConfigError(
            f"convert: {', '.join(given)} do not apply to a typed NumPy directory: name its arrays "
            "features_tI.npy, labels_tI.npy, node_train_tI.npy, valid_edges_eK.npy, ... (docs/convert.md)"
        )
    options = hetero.typed_inputs(plan.typed, cfg.node_types, cfg.edge_types)
    options["layout"] = cfg.layout
    options["feature_dtype"] = None if cfg.feature_dtype == "auto" else cfg.feature_dtype
    return options


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


def _convert_planetoid(cfg: ConvertConfig, plan: Plan, graph: dict, progress: ProgressFn | None) -> dict:
    directory, name = plan.planetoid
    data = read_planetoid(directory, name)
    graph["name"] = cfg.name or name
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
            features=None,
            labels=None,
            node_train=None,
            node_valid=None,
            node_test=None,
            valid=[],
            test=[],
        )
        numpy_plan = Plan(
            "numpy", [staging / "edges.npy"], numpy={k: staging / f"{k}.npy" for k in arrays if k != "edges"}
        )
        summary = _native.convert_numpy({"graph": graph, "numpy": _numpy_options(numpy_cfg, numpy_plan)}, progress)
        summary["converter"] = "planetoid"
        return summary
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
