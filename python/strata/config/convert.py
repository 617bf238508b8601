"""The [convert] section."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from .schema import Fractions, Size, option, section


@section("convert")
class ConvertConfig:
    inputs: list[Path] = option(
        [],
        positional=True,
        help="input files (train edges), or one directory holding train/valid/test files, "
        "NumPy arrays (edges.npy, ...) or Planetoid files (ind.NAME.*)",
    )
    out: Path = option(help="store directory to create", short="o")
    format: Literal["auto", "text", "numpy", "bin32", "planetoid"] = option(
        "auto", help="input format; auto decides from the file names and contents"
    )
    valid: list[Path] = option([], help="files of validation edges (text or bin32), or one .npy for numpy")
    test: list[Path] = option([], help="files of test edges (text or bin32), or one .npy for numpy")
    relations: bool = option(False, help="text lines are (src, relation, dst) triples; same as columns = src,rel,dst")
    columns: str = option(
        "",
        help="meaning of each text field, comma-separated: src, dst, rel, or _ to ignore "
        "(default src,dst; src,rel,dst with --relations)",
    )
    delimiter: Literal["auto", "tab", "comma", "whitespace"] = option(
        "auto", help="field separator of text inputs; auto detects per file from its first data line"
    )
    comment: str = option("#", help="lines starting with this are skipped; empty for none")
    header: bool = option(False, help="each text file starts with a header line to skip")
    ids: Literal["auto", "string", "int"] = option(
        "auto",
        help="node ids: int uses non-negative integers as ids directly, string renumbers names densely "
        "(sorted order); auto picks int when the first lines hold only plain integers",
    )
    relation_ids: Literal["auto", "string", "int"] = option("auto", help="relation ids, as for ids")
    num_nodes: int | None = option(None, help="number of nodes with integer ids (default: largest id + 1)")
    num_relations: int | None = option(None, help="number of relations with integer relation ids")
    split: Fractions | None = option(
        None, help="random edge split train,valid,test, e.g. 0.9,0.05,0.05 (exact counts; not with --valid/--test)"
    )
    seed: int = option(0, help="seed of the random edge and node splits")
    symmetrize: bool = option(False, help="treat the graph as undirected: CSR/CSC hold every edge both ways")
    features: Path | None = option(None, help="numpy: node features (nodes, dim)")
    feature_dtype: Literal["auto", "float32", "float16"] = option(
        "auto", help="stored feature dtype; auto keeps float16 and stores everything else as float32"
    )
    labels: Path | None = option(None, help="numpy: node labels (nodes,), -1 for unlabelled")
    node_train: Path | None = option(None, help="numpy: train nodes (ids, or a boolean mask)")
    node_valid: Path | None = option(None, help="numpy: validation nodes (ids, or a boolean mask)")
    node_test: Path | None = option(None, help="numpy: test nodes (ids, or a boolean mask)")
    node_split: Fractions | None = option(None, help="numpy: random node split over labelled nodes")
    layout: Literal["auto", "rows", "columns"] = option(
        "auto", help="numpy edges as rows (E, 2|3) or columns (2|3, E) like PyG's edge_index"
    )
    name: str | None = option(
        None,
        help="dataset name in the manifest (default: the store's name); "
        "for Planetoid, which dataset of the directory (cora, citeseer)",
    )
    memory: Size = option(Size(1 << 30), help="memory budget of the conversion")
    threads: int = option(0, help="parsing threads; 0 = one per core")
    io_chunk: Size = option(Size(4 << 20), help="size of each aligned I/O request", flag=False)
    overwrite: bool = option(False, help="replace an existing store (atomically, once the new one is complete)")

    def check(self) -> None:
        if self.columns and self.relations and "rel" not in self.columns.split(","):
            raise ConfigError("convert.columns: --relations needs a 'rel' column, got " + repr(self.columns))
        if self.split and (self.valid or self.test):
            raise ConfigError("convert.split: a random split cannot be combined with --valid/--test files")
        if self.io_chunk % 4096 or self.io_chunk == 0:
            raise ConfigError(f"convert.io_chunk: must be a positive multiple of 4096, got {self.io_chunk}")
