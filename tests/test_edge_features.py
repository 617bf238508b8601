"""Edge features from text (``--columns ...,feat:D``) and Parquet (``feat=COLUMN`` items) into
``edge_features_train`` (docs/formats.md, "Version 2"): carried through ``--split`` with their
edges, read through ``strata.Store``, passing ``strata check``; bad features refused naming the
file, line or row and the field, with exit 2 and no store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import needs
from strata.store import Store, check_store

ROWS = [(u, v) for u in range(6) for v in range(6) if u != v]


def features(e: np.ndarray) -> np.ndarray:
    """The 3 features the inputs give edge (u, v): u/4, v/4 and u*10+v."""
    u, v = e[:, 0].astype(np.float32), e[:, 1].astype(np.float32)
    return np.stack([u / 4, v / 4, u * 10 + v], axis=1)


def text_edges(path) -> None:
    path.write_text("".join(f"{u}\t{v}\t{u / 4}\t{v / 4}\t{u * 10 + v}\t{u + v}\n" for u, v in ROWS))


def assert_features_follow_their_edges(out) -> None:
    s = Store(out)
    assert s.edge_attributes == {"weights": False, "times": True, "features": {"dim": 3, "dtype": "float32"}}
    assert sum(s.num_edges.values()) == len(ROWS)
    train = s.edges("train")
    f = s.edge_features()
    assert f.dtype == np.float32 and f.shape == (len(train), 3)
    np.testing.assert_array_equal(f, features(train))
    np.testing.assert_array_equal(s.edge_times("train"), train[:, 0] + train[:, 1])
    assert not s.has("edge_features_valid")
    assert check_store(out)["ok"]


def test_text_features_follow_their_edges_through_the_split(tmp_path, strata_cli):
    text_edges(tmp_path / "e.tsv")
    out = tmp_path / "g.strata"
    strata_cli("convert", tmp_path / "e.tsv", "--columns", "src,dst,feat:3,time", "--split", "0.5,0.25,0.25",
               "--out", out, "-q")  # fmt: skip
    assert_features_follow_their_edges(out)
    assert strata_cli("check", out, "-q").returncode == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["arrays"]["edge_features_train"]["shape"] == [len(Store(out).edges("train")), 3]


def test_parquet_features_from_a_list_column_and_a_number_column(tmp_path, strata_cli):
    pa = needs("pyarrow")
    import pyarrow.parquet as pq

    e = np.array(ROWS, np.int64)
    f = features(e)
    uv = pa.FixedSizeListArray.from_arrays(pa.array(f[:, :2].ravel()), 2)
    table = pa.table({"a": e[:, 0], "b": e[:, 1], "uv": uv, "id": f[:, 2].astype(np.float64), "t": e.sum(axis=1)})
    pq.write_table(table, tmp_path / "e.parquet", row_group_size=10)
    out = tmp_path / "g.strata"
    strata_cli("convert", tmp_path / "e.parquet", "--columns", "src=a,feat=uv,dst=b,feat=id,time=t",
               "--split", "0.5,0.25,0.25", "--out", out, "-q")  # fmt: skip
    assert_features_follow_their_edges(out)


@pytest.mark.parametrize(
    ("columns", "text", "needles"),
    [
        ("src,dst,feat:2", "0\t1\t0.5\t1\n1\t2\tabc\t1\n", ["e.tsv:2:", "feature 'abc' is not a number"]),
        ("src,dst,feat:2", "0\t1\t0.5\t1e39\n", ["e.tsv:1:", "feature '1e39' is not a finite float32"]),
        ("src,dst,feat:2", "0\t1\t0.5\n", ["e.tsv:1:"]),
        ("src,dst,feat:0", "0\t1\n", ["'feat:0': feat:D needs a feature count D from 1 to 8388608"]),
        ("src,feat:1,dst,feat:1", "0\t1\t1\t2\n", ["'feat:' appears more than once"]),
    ],
)
def test_bad_text_features(tmp_path, strata_cli, columns, text, needles):
    (tmp_path / "e.tsv").write_text(text)
    out = tmp_path / "g.strata"
    proc = strata_cli("convert", tmp_path / "e.tsv", "--columns", columns, "--out", out, check=False)
    assert proc.returncode == 2, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert "Traceback" not in proc.stderr and not out.exists()


def test_bad_parquet_features(tmp_path, strata_cli):
    pa = needs("pyarrow")
    import pyarrow.parquet as pq

    lists = pa.array([[1.0, 2.0], [3.0, None], [5.0, 6.0]], pa.list_(pa.float32(), 2))
    pq.write_table(pa.table({"src": [0, 1, 2], "dst": [1, 2, 0], "f": lists, "s": ["x", "y", "z"]}),
                   tmp_path / "e.parquet", row_group_size=2)  # fmt: skip
    out = tmp_path / "g.strata"
    for spec, needle in [
        ("src,dst,feat=f", "e.parquet: row group 0, row 1: column 'f' (feat) is null"),
        ("src,dst,feat=s", "column 's' (feat) is string: edge features must be numbers or fixed-size lists"),
    ]:
        proc = strata_cli("convert", tmp_path / "e.parquet", "--columns", spec, "--out", out, check=False)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and not out.exists()
