"""The [generate.rmat], [generate.kg] and [generate.sbm] sections (see docs/generators.md).

Defaults here are the ones users see; every field is passed to the native generator, and a test
checks that these defaults equal the native ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from .schema import option, section


@section("generate.rmat")
class RmatConfig:
    out: Path = option(help="output file", short="o")
    scale: int = option(help="log2 of the number of vertices (n = 2^scale); at most 31 for bin32", max=(1 << 32) - 1)
    edge_factor: int = option(16, help="edges per vertex: m = edge_factor * 2^scale")
    a: float = option(0.57, help="probability of the top-left quadrant at each level (Graph500: 0.57)")
    b: float = option(0.19, help="probability of the top-right quadrant (Graph500: 0.19)")
    c: float = option(0.19, help="probability of the bottom-left quadrant (Graph500: 0.19); d = 1 - a - b - c")
    seed: int = option(1, help="random seed; equal options give byte-identical output")
    format: Literal["bin32", "tsv", "npy"] = option(
        "bin32", help="bin32: little-endian int32 (src, dst) pairs (GridGraph); tsv: text lines; npy: (m, 2) array"
    )
    threads: int = option(0, help="worker threads; 0 = one per core (the output does not depend on it)")
    overwrite: bool = option(False, help="replace an existing output file")


@section("generate.kg")
class KgConfig:
    out: Path = option(help="output directory (train.txt, valid.txt, test.txt)", short="o")
    entities: int = option(10000, help="number of entities")
    relations: int = option(50, help="number of relations")
    triples: int = option(200000, help="triples over all three splits")
    valid_fraction: float = option(0.05, help="fraction of triples in valid.txt")
    test_fraction: float = option(0.05, help="fraction of triples in test.txt")
    cluster_size: int = option(50, help="entities per latent type; a head's type and the relation fix the tail's type")
    tail_spread: int = option(4, help="popularity spread of tails within a type (smaller: more predictable)")
    head_skew: float = option(1.0, help="skew of head popularity within a relation, in [0.1, 10]")
    relation_skew: float = option(0.5, help="skew of relation frequencies")
    inverse_fraction: float = option(0.2, help="fraction of relations that come in inverse pairs")
    noise: float = option(0.1, help="fraction of pure-noise triples (1.0 removes all structure)")
    seed: int = option(1, help="random seed; equal options give byte-identical output")
    threads: int = option(0, help="worker threads; 0 = one per core")
    overwrite: bool = option(False, help="replace an existing output directory")


@section("generate.sbm")
class SbmConfig:
    out: Path = option(help="output directory (edges.npy, features.npy, labels.npy, *_idx.npy)", short="o")
    nodes: int = option(100000, help="number of nodes")
    classes: int = option(8, help="number of classes (communities)")
    avg_degree: float = option(10.0, help="mean degree; nodes * avg_degree / 2 edges, each written once")
    p_in: float = option(0.8, help="fraction of edges inside a community (edge homophily)")
    power_law: float = option(2.5, help="exponent of the power-law degree distribution (> 2)")
    feature_dim: int = option(128, help="features per node")
    feature_dtype: Literal["float32", "float16"] = option("float32", help="feature element type")
    feature_noise: float = option(0.55, help="std of Gaussian noise around each class centroid")
    train_fraction: float = option(0.6, help="fraction of nodes in train_idx.npy")
    valid_fraction: float = option(0.2, help="fraction of nodes in valid_idx.npy")
    test_fraction: float = option(0.2, help="fraction of nodes in test_idx.npy")
    seed: int = option(1, help="random seed; equal options give byte-identical output")
    threads: int = option(0, help="worker threads; 0 = one per core")
    overwrite: bool = option(False, help="replace an existing output directory")


GENERATORS = {"rmat": RmatConfig, "kg": KgConfig, "sbm": SbmConfig}
