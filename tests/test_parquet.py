"""Parquet edge tables through ``strata convert`` (docs/convert.md, "Parquet"): the roles and
named columns of ``--columns``, integer and string ids, weights and times, typed graphs from a
rel column and from ``--edges-of``, and bad inputs refused naming file, row group, row and
column, with exit 2 and no store."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import needs
from strata.config import ConvertConfig
from strata.convert import convert
from strata.errors import ConfigError
from strata.store import Store, check_store

pa = needs("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(path: Path, columns: dict, row_group_size: int | None = None) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def refused(proc, out: Path, *needles: str) -> None:
    """Exit 2, each needle in stderr, no traceback, no store and no staging left beside it."""
    assert proc.returncode == 2, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name or "-parquet-" in p.name]


def test_named_columns_with_weights_and_times_match_the_text_conversion(tmp_path, strata_cli):
    rows = [(u, v) for u in range(5) for v in range(5) if u != v]
    src, dst = (np.array(c, np.int64) for c in zip(*rows, strict=True))
    write(tmp_path / "e.parquet", {"from": src, "to": dst, "w": (src * 10 + dst) / 4, "t": -src * 100 - dst},
          row_group_size=7)  # fmt: skip
    (tmp_path / "e.tsv").write_text("".join(f"{u}\t{v}\t{(u * 10 + v) / 4}\t{-u * 100 - v}\n" for u, v in rows))
    pq_out, tsv_out = tmp_path / "p.strata", tmp_path / "t.strata"
    strata_cli("convert", tmp_path / "e.parquet", "--columns", "src=from,dst=to,weight=w,time=t", "--out", pq_out,
               "--split", "0.6,0.2,0.2", "--seed", "3", "-q")  # fmt: skip
    strata_cli("convert", tmp_path / "e.tsv", "--columns", "src,dst,weight,time", "--out", tsv_out,
               "--split", "0.6,0.2,0.2", "--seed", "3", "-q")  # fmt: skip
    p, t = Store(pq_out), Store(tsv_out)
    assert p.format_version == 2 and p.edge_attributes == {"weights": True, "times": True}
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(p.edges(split), t.edges(split))
        np.testing.assert_array_equal(p.edge_weights(split), t.edge_weights(split))
        np.testing.assert_array_equal(p.edge_times(split), t.edge_times(split))
    for name in ("csr_indptr", "csr_indices", "csr_weights", "csc_times"):
        np.testing.assert_array_equal(p.array(name), t.array(name))
    assert check_store(pq_out)["ok"]


def test_string_ids_are_node_names(tmp_path, strata_cli):
    names = pa.array(["bob", "ann", "a,b", "ann"]).dictionary_encode()
    write(tmp_path / "e.parquet", {"src": names, "dst": ["ann", "#c", "bob", "a,b"]})
    out = tmp_path / "g.strata"
    summary = convert(ConvertConfig(inputs=[tmp_path / "e.parquet"], out=out))
    assert summary["converter"] == "parquet" and summary["input_bytes"] == (tmp_path / "e.parquet").stat().st_size
    s = Store(out)
    # Names are numbered in sorted order; '#c' is a name (no comment lines) and 'a,b' one name.
    assert [s.node_name(i) for i in range(s.num_nodes)] == ["#c", "a,b", "ann", "bob"]
    np.testing.assert_array_equal(s.edges("train"), [[3, 2], [2, 0], [1, 3], [2, 1]])


def test_typed_graph_from_a_rel_column_and_from_edges_of(tmp_path, strata_cli):
    (tmp_path / "node_types.tsv").write_text("paper\t3\nauthor\t2\n")
    (tmp_path / "edge_types.tsv").write_text("paper\tcites\tpaper\nauthor\twrites\tpaper\n")
    types = ["--node-types", tmp_path / "node_types.tsv", "--edge-types", tmp_path / "edge_types.tsv"]
    write(tmp_path / "all.parquet", {"s": [0, 3, 4], "r": ["cites", "writes", "writes"], "d": [1, 2, 0]})
    rel_out = tmp_path / "rel.strata"
    strata_cli("convert", tmp_path / "all.parquet", "--columns", "src=s,rel=r,dst=d", *types, "--out", rel_out, "-q")
    # --edges-of files hold local ids: author 0 and 1 are global 3 and 4.
    write(tmp_path / "cites.parquet", {"src": [0], "dst": [1]})
    write(tmp_path / "writes.parquet", {"src": [0, 1], "dst": [2, 0]})
    of_out = tmp_path / "of.strata"
    strata_cli("convert", "--edges-of", f"paper:cites:paper={tmp_path / 'cites.parquet'}",
               f"author:writes:paper={tmp_path / 'writes.parquet'}", *types, "--out", of_out, "-q")  # fmt: skip
    for out in (rel_out, of_out):
        s = Store(out)
        assert s.edge_types == [("paper", "cites", "paper"), ("author", "writes", "paper")]
        np.testing.assert_array_equal(s.edges("train"), [[0, 0, 1], [3, 1, 2], [4, 1, 0]])
        assert check_store(out)["ok"]


#: Rows 3.. are row group 1 (3 rows a group): row 3 is its row 0.
NULL = "row group 1, row 0:"
BAD = [
    ({"src": [0, 1], "dst": [1, 2]}, "src,dst=to", ["no column 'to' for role dst", "the file's columns are src, dst"]),
    ({"src": [0.0, 1.0], "dst": [1, 2]}, "src,dst", ["column 'src' (src) is double", "integers or strings"]),
    ({"src": [0, 1], "dst": ["a", "b"]}, "src,dst", ["both hold integers or both strings, got int and string"]),
    ({"src": [0, 1], "dst": [1, 2], "w": ["x", "y"]}, "src,dst,weight=w", ["column 'w' (weight) is string"]),
    ({"src": [0, 1, 2, 3, 4], "dst": [1, 2, 3, None, 0]}, "src,dst", [f"{NULL} column 'dst' (dst) is null"]),
    ({"src": [0, 1, 2, -3, 4], "dst": [1, 2, 3, 4, 0]}, "src,dst", [f"{NULL} src '-3' is not a non-", "'src')"]),
    ({"src": [0, 1], "dst": [1, 2]}, "src,dst,colour", ["unknown role 'colour'"]),
    ({"src": [0, 1], "dst": [1, 2]}, "src=a,src=b,dst", ["role 'src' appears more than once"]),
    ({"dst": [0, 1]}, "dst", ["need the roles src and dst"]),
]


@pytest.mark.parametrize(("columns", "spec", "needles"), BAD)
def test_bad_parquet_names_file_row_group_row_and_column(tmp_path, strata_cli, columns, spec, needles):
    write(tmp_path / "e.parquet", columns, row_group_size=3)
    out = tmp_path / "out.strata"
    proc = strata_cli("convert", tmp_path / "e.parquet", "--columns", spec, "--num-nodes", "5", "--out", out,
                      check=False)  # fmt: skip
    refused(proc, out, *needles)
    if "column" in needles[0] or "row group" in needles[0]:
        assert "e.parquet: " in proc.stderr


def test_a_file_that_is_not_parquet_is_named(tmp_path, strata_cli):
    (tmp_path / "e.parquet").write_text("0\t1\n")
    out = tmp_path / "out.strata"
    refused(strata_cli("convert", tmp_path / "e.parquet", "--out", out, check=False), out,
            "e.parquet: not a readable Parquet file")  # fmt: skip


def test_text_options_and_mixed_inputs_are_refused(tmp_path, strata_cli):
    write(tmp_path / "e.parquet", {"src": [0], "dst": [1]})
    (tmp_path / "e.tsv").write_text("0\t1\n")
    out = tmp_path / "out.strata"
    refused(strata_cli("convert", tmp_path / "e.parquet", "--header", "--out", out, check=False), out,
            "--header, --delimiter and --comment apply to text inputs, not parquet inputs")  # fmt: skip
    refused(strata_cli("convert", tmp_path / "e.parquet", "--format", "parquet", "--valid", tmp_path / "e.tsv",
                       "--out", out, check=False), out, "give Parquet files only")  # fmt: skip


def test_without_pyarrow_the_message_says_how_to_install_it(tmp_path, monkeypatch):
    write(tmp_path / "e.parquet", {"src": [0], "dst": [1]})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=r"read with pyarrow, which is not installed; pip install pyarrow"):
        convert(ConvertConfig(inputs=[tmp_path / "e.parquet"], out=tmp_path / "out.strata"))
    assert not (tmp_path / "out.strata").exists()


def test_a_killed_conversions_staging_is_removed_by_the_next(tmp_path, strata_cli):
    import os
    import subprocess

    write(tmp_path / "e.parquet", {"src": np.array([0, 1, 2]), "dst": np.array([1, 2, 0])})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".g.strata-parquet-{gone.stdout.strip()}"
    stale.mkdir()
    (stale / "0.csv").write_text("0,1\n")
    alive = tmp_path / f".g.strata-parquet-{os.getpid()}"
    alive.mkdir()
    strata_cli("convert", tmp_path / "e.parquet", "--out", tmp_path / "g.strata", "-q")
    assert not stale.exists() and alive.is_dir(), "only the staging of a process that is gone goes"
    assert Store(tmp_path / "g.strata").num_nodes == 3


def test_a_name_with_a_line_break_is_refused(tmp_path, strata_cli):
    """Names are one line each (the staging CSV, exports and TSV outputs are line-based): a
    line break in one is refused, naming row group, row and column; a tab is kept."""
    write(tmp_path / "e.parquet", {"src": ["a\tb", "c", "e"], "dst": ["c", "d", "x\ny"]}, row_group_size=2)
    out = tmp_path / "out.strata"
    proc = strata_cli("convert", tmp_path / "e.parquet", "--out", out, check=False)
    refused(proc, out, "e.parquet: row group 1, row 0: column 'dst' (dst) holds a line break")
    write(tmp_path / "tab.parquet", {"src": ["a\tb", "c"], "dst": ["c", "d"]})
    strata_cli("convert", tmp_path / "tab.parquet", "--out", out, "-q")
    assert Store(out).num_nodes == 3


def test_a_damaged_file_is_refused_naming_it(tmp_path):
    """Every byte of a small file's pages flipped in turn (a seeded sample of offsets): the
    conversion succeeds or is refused with Strata's own error (an id the flip made sparse is
    a ConfigError of num_nodes); a page that does not decode (corrupt compressed data, a bad
    page header) is an InputError naming the file, and nothing else escapes (no OSError,
    UnicodeDecodeError or ArrowException)."""
    import random

    from strata.errors import InputError, StrataError

    good = write(tmp_path / "ok.parquet", {"src": list(range(40)), "dst": [(v * 7 + 1) % 41 for v in range(40)],
                                          "w": [float(v) for v in range(40)]})  # fmt: skip
    data = good.read_bytes()
    offsets = sorted(random.Random(3).sample(range(4, len(data) - 8), 60))
    refusals = []
    for at in offsets:
        bad = bytearray(data)
        bad[at] ^= 0xFF
        path = tmp_path / f"flip{at}.parquet"
        path.write_bytes(bytes(bad))
        try:
            convert(ConvertConfig(inputs=[path], columns="src,dst,weight=w", out=tmp_path / f"g{at}"))
        except InputError as e:
            assert f"flip{at}.parquet" in str(e), e
            refusals.append(str(e))
        except StrataError:
            pass
    assert any("does not decode" in r for r in refusals), refusals
