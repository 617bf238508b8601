"""The typed NumPy directory layout (docs/convert.md, "Typed NumPy inputs"), and writing it from
OGB/PyG-style dicts held in memory (the NumPy input format reads it: ``strata_store::convert::source``).

A typed directory holds::

    node_types.tsv                NAME<TAB>COUNT per line, in id order (node type I = line I)
    edge_types.tsv                SRC<TAB>RELATION<TAB>DST per line (edge type K = line K)
    edges_eK.npy                  (2, E) or (E, 2) integers: (src, dst) local ids of edge type K
    edge_weights_eK.npy           (E,) weights of those edges (optional; all edge types or none)
    edge_times_eK.npy             (E,) integer times (optional; all edge types or none)
    valid_edges_eK.npy, test_edges_eK.npy (+ valid_edge_weights_eK.npy, ...)  given edge splits
    features_tI.npy               (count_I, dim) features of node type I
    labels_tI.npy                 (count_I,) integer labels, -1 unlabelled
    node_train_tI.npy, node_valid_tI.npy, node_test_tI.npy   local ids (or boolean masks)

Arrays are named by type index, as the store names its own per-type arrays (``features_tI``),
so type names may hold any character but tab and newline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import ConfigError, InputError

NODE_TYPES_FILE = "node_types.tsv"
EDGE_TYPES_FILE = "edge_types.tsv"
SPLITS = ("train", "valid", "test")

EdgeType = tuple[str, str, str]


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in "\t\n\r"):
        raise ConfigError(f"{what} {name!r}: a type name must be a non-empty string without tabs or newlines")
    return name


def write_types(directory: Path, node_counts: Mapping[str, int], edge_types: list[EdgeType]) -> None:
    """Writes ``node_types.tsv`` (types in the mapping's order) and ``edge_types.tsv``."""
    lines = []
    for name, count in node_counts.items():
        count = int(count)
        if count < 0:
            raise ConfigError(f"num_nodes_dict[{name!r}] is {count}; a count must be >= 0")
        lines.append(f"{_check_name(name, 'node type')}\t{count}\n")
    (directory / NODE_TYPES_FILE).write_text("".join(lines))
    rows = []
    for et in edge_types:
        if not (isinstance(et, tuple) and len(et) == 3):
            raise ConfigError(f"edge type {et!r}: expected a (src_type, relation, dst_type) tuple")
        src, rel, dst = (_check_name(x, "edge type part") for x in et)
        for end in (src, dst):
            if end not in node_counts:
                raise ConfigError(
                    f"edge type {et!r}: '{end}' is not a node type (num_nodes_dict has: {', '.join(node_counts)})"
                )
        rows.append(f"{src}\t{rel}\t{dst}\n")
    (directory / EDGE_TYPES_FILE).write_text("".join(rows))


def _known(key: object, known: Mapping, what: str) -> None:
    if key not in known:
        raise ConfigError(f"{what}: {key!r} is not declared (known: {', '.join(map(repr, known))})")


def stage_dicts(
    directory: Path,
    num_nodes_dict: Mapping[str, int],
    edge_index_dict: Mapping[EdgeType, np.ndarray],
    *,
    node_feat_dict: Mapping[str, np.ndarray] | None = None,
    node_label_dict: Mapping[str, np.ndarray] | None = None,
    split_dict: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    edge_weight_dict: Mapping[EdgeType, np.ndarray] | None = None,
    edge_time_dict: Mapping[EdgeType, np.ndarray] | None = None,
) -> None:
    """Writes OGB/PyG-style dicts into ``directory`` in the typed layout (the module doc).

    ``edge_index_dict`` maps ``(src_type, relation, dst_type)`` to a ``(2, E)`` array of local
    ids; ``node_label_dict`` values are ``(count,)`` or ``(count, 1)`` (float NaN or -1:
    unlabelled); ``split_dict`` is OGB's ``{"train": {type: local ids}, "valid": ..., ...}``.
    Shapes and id ranges are checked by the converter; names here.
    """
    if not num_nodes_dict or not edge_index_dict:
        raise ConfigError("num_nodes_dict and edge_index_dict must each declare at least one type")
    edge_types = list(edge_index_dict)
    write_types(directory, num_nodes_dict, edge_types)
    node_index = {name: i for i, name in enumerate(num_nodes_dict)}
    for what, d in (("edge_weight_dict", edge_weight_dict), ("edge_time_dict", edge_time_dict)):
        for key in d or {}:
            _known(key, edge_index_dict, what)
    for k, et in enumerate(edge_types):
        edges = np.asarray(edge_index_dict[et])
        if edges.ndim != 2 or edges.shape[0] != 2:
            raise InputError(f"edge_index_dict[{et!r}]: expected shape (2, E) of local ids, found {edges.shape}")
        np.save(directory / f"edges_e{k}.npy", edges)
        for name, d in (("edge_weights", edge_weight_dict), ("edge_times", edge_time_dict)):
            if d and et in d:
                np.save(directory / f"{name}_e{k}.npy", np.asarray(d[et]).reshape(-1))
    for what, name, d in (
        ("node_feat_dict", "features", node_feat_dict),
        ("node_label_dict", "labels", node_label_dict),
    ):
        for ntype, values in (d or {}).items():
            _known(ntype, node_index, what)
            values = np.asarray(values)
            if name == "labels":
                values = _labels(values, f"{what}[{ntype!r}]")
            np.save(directory / f"{name}_t{node_index[ntype]}.npy", values)
    for split, per_type in (split_dict or {}).items():
        if split not in SPLITS:
            raise ConfigError(f"split_dict: unknown split {split!r} (train, valid, test)")
        for ntype, ids in per_type.items():
            _known(ntype, node_index, f"split_dict[{split!r}]")
            np.save(directory / f"node_{split}_t{node_index[ntype]}.npy", np.asarray(ids).reshape(-1))


def _labels(values: np.ndarray, what: str) -> np.ndarray:
    """Class ids as int32, -1 where unlabelled (a float NaN or -1)."""
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise InputError(f"{what}: expected one label per node, shape (count,) or (count, 1); found {values.shape}")
    if values.dtype.kind == "f":
        return np.where(np.isnan(values), -1, values).astype(np.int32)
    return values.astype(np.int32)
