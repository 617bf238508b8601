"""The catalogue of public datasets ``strata datasets`` can fetch.

Each entry names the files on their canonical host, the recipe that turns them into a store,
and a checksum only where a public source publishes one (docs/datasets.md says where each URL,
layout and checksum was confirmed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from .. import _native
from ..errors import ConfigError

#: How a dataset's raw files become a store (see :mod:`strata.datasets.recipes`).
Recipe = Literal["kg", "freebase", "planetoid", "ogb", "snap"]
CHECKSUM_ALGORITHMS = {"sha256": 64, "md5": 32}


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset on its host."""

    url: str
    #: Approximate size in bytes as others report it (exact for files with a published checksum),
    #: for the listing only: downloads check the server's Content-Length. None where unknown.
    size: int | None = None
    #: ``"sha256:<hex>"`` or ``"md5:<hex>"``, only where a public source publishes the digest.
    checksum: str | None = None

    @property
    def name(self) -> str:
        """The file name: the last component of the URL's path."""
        return urlsplit(self.url).path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Dataset:
    """A catalogue entry."""

    name: str
    #: What it is: nodes, edges or triples, features.
    summary: str
    #: The task it is used for, with its classes and split.
    task: str
    recipe: Recipe
    files: tuple[RemoteFile, ...]
    #: Who hosts the files.
    source: str
    #: Store every edge both ways (undirected graphs; OGB's ``add_inverse_edge``).
    symmetrize: bool = False

    @property
    def size(self) -> int | None:
        """Total download size in bytes, when every file's size is known."""
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)

    @property
    def checksums(self) -> str:
        """``sha256``, ``md5``, or ``no`` when no digest is published."""
        algorithms = sorted({f.checksum.split(":", 1)[0] for f in self.files if f.checksum})
        return "+".join(algorithms) if algorithms else "no"


_PLANETOID = "https://github.com/kimiyoung/planetoid/raw/master/data"
_OGB = "https://snap.stanford.edu/ogb/data/nodeproppred"
_SNAP = "https://snap.stanford.edu/data"
_PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
# Published in skygazer42/sky-vgl (vgl/data/public.py) for kimiyoung/planetoid at af6abf46;
# sizes measured from files with these digests.
_PLANETOID_FILES = {
    "cora": (
        (22119, "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab"),
        (148025, "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a"),
        (257305, "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543"),
        (4054, "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1"),
        (28135, "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad"),
        (47959, "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71"),
        (59847, "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d"),
        (5000, "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875"),
    ),
    "citeseer": (
        (31087, "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6"),
        (260321, "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21"),
        (595021, "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668"),
        (3014, "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924"),
        (24135, "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce"),
        (55623, "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95"),
        (61987, "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7"),
        (5000, "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4"),
    ),
}


def _planetoid_files(name: str) -> tuple[RemoteFile, ...]:
    return tuple(
        RemoteFile(f"{_PLANETOID}/ind.{name}.{part}", size, f"sha256:{digest}")
        for part, (size, digest) in zip(_PLANETOID_PARTS, _PLANETOID_FILES[name], strict=True)
    )


_ENTRIES = (
    Dataset(
        "FB15k-237",
        "14,541 entities, 237 relations, 310,116 triples (272,115 / 17,535 / 20,466)",
        "link prediction",
        "kg",
        (RemoteFile("https://data.dgl.ai/dataset/FB15k-237.zip"),),
        "DGL-KE (data.dgl.ai)",
    ),
    Dataset(
        "WN18RR",
        "40,943 entities, 11 relations, 93,003 triples (86,835 / 3,034 / 3,134)",
        "link prediction",
        "kg",
        (RemoteFile("https://data.dgl.ai/dataset/wn18rr.zip"),),
        "DGL-KE (data.dgl.ai)",
    ),
    Dataset(
        "Cora",
        "2,708 nodes, 10,556 edges (both directions), 1,433 binary features",
        "node classification, 7 classes (140 / 500 / 1,000)",
        "planetoid",
        _planetoid_files("cora"),
        "Planetoid (github.com/kimiyoung)",
    ),
    Dataset(
        "CiteSeer",
        "3,327 nodes, 9,104 edges (both directions), 3,703 binary features",
        "node classification, 6 classes (120 / 500 / 1,000)",
        "planetoid",
        _planetoid_files("citeseer"),
        "Planetoid (github.com/kimiyoung)",
    ),
    Dataset(
        "ogbn-arxiv",
        "169,343 nodes, 1,166,243 directed edges, 128-dim features",
        "node classification, 40 classes (time split)",
        "ogb",
        (RemoteFile(f"{_OGB}/arxiv.zip", 81 << 20),),
        "OGB (snap.stanford.edu)",
    ),
    Dataset(
        "ogbn-products",
        "2,449,029 nodes, 61,859,140 undirected edges, 100-dim features",
        "node classification, 47 classes (sales-ranking split)",
        "ogb",
        (RemoteFile(f"{_OGB}/products.zip"),),
        "OGB (snap.stanford.edu)",
        symmetrize=True,
    ),
    Dataset(
        "ogbn-mag",
        "1,939,743 nodes of 4 types (paper, author, institution, field_of_study), 21,111,007 edges of "
        "4 types, 128-dim paper features",
        "node classification of papers, 349 venues (time split)",
        "ogb",
        (RemoteFile(f"{_OGB}/mag.zip"),),
        "OGB (snap.stanford.edu)",
    ),
    Dataset(
        "ogbn-papers100M",
        "111,059,956 nodes, 1,615,685,872 directed edges, 128-dim features",
        "node classification, 172 classes (time split; about 1.5M nodes labelled)",
        "ogb",
        (RemoteFile(f"{_OGB}/papers100M-bin.zip", 57_000_000_000),),
        "OGB (snap.stanford.edu)",
    ),
    Dataset(
        "soc-LiveJournal1",
        "4,847,571 nodes, 68,993,773 directed edges, no features",
        "link prediction, graph analytics",
        "snap",
        (RemoteFile(f"{_SNAP}/soc-LiveJournal1.txt.gz", 248_000_000),),
        "SNAP (snap.stanford.edu)",
    ),
    Dataset(
        "twitter-2010",
        "41,652,230 nodes, 1,468,365,182 directed edges, no features",
        "link prediction, graph analytics",
        "snap",
        (RemoteFile(f"{_SNAP}/twitter-2010.txt.gz", 5_100_000_000),),
        "SNAP (snap.stanford.edu)",
    ),
    Dataset(
        "com-friendster",
        "65,608,366 nodes, 1,806,067,135 undirected edges, no features",
        "link prediction, graph analytics",
        "snap",
        (RemoteFile(f"{_SNAP}/bigdata/communities/com-friendster.ungraph.txt.gz", 9_340_000_000),),
        "SNAP (snap.stanford.edu)",
        symmetrize=True,
    ),
    Dataset(
        "Freebase86m",
        "86,054,151 entities, 14,824 relations, 338,586,276 triples",
        "link prediction",
        "freebase",
        (RemoteFile("https://data.dgl.ai/dataset/Freebase.zip"),),
        "DGL-KE (data.dgl.ai)",
    ),
)

CATALOGUE: dict[str, Dataset] = {d.name: d for d in _ENTRIES}


def get(name: str) -> Dataset:
    """The catalogue entry called ``name`` (case-insensitive); ConfigError with suggestions otherwise."""
    found = {n.lower(): d for n, d in CATALOGUE.items()}.get(name.lower())
    if found is not None:
        return found
    raise ConfigError(f"datasets: {_native.unknown_name('dataset', name, list(CATALOGUE))}")
