"""Bad input gets a clear message naming the file (and line), a non-zero exit, and no store
that looks complete."""

from __future__ import annotations

import json
import os
import resource
import shutil
from pathlib import Path

import numpy as np
import pytest

from strata.config import ConvertConfig, Size
from strata.convert import convert
from strata.errors import StoreFormatError


def leftovers(d: Path) -> list[str]:
    """Partial stores and Planetoid staging directories left in ``d``."""
    return sorted(p.name for p in d.iterdir() if ".partial-" in p.name or "-arrays-" in p.name)


def fails(strata_cli, tmp_path: Path, *args, needles: list[str], code: int = 2, **kwargs) -> str:
    out = tmp_path / "out.strata"
    proc = strata_cli("convert", *args, "--out", out, "-q", check=False, **kwargs)
    assert proc.returncode == code, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert not out.exists()
    assert leftovers(tmp_path) == []
    return proc.stderr


def test_malformed_line_reports_file_and_line(tmp_path, strata_cli):
    p = tmp_path / "e.tsv"
    p.write_text("a\tr\tb\n" * 5 + "c\td\n")
    fails(strata_cli, tmp_path, p, "--relations", needles=["e.tsv:6:", "expected 3 fields, found 2"])


def test_binary_data_given_as_text_is_named(tmp_path, strata_cli):
    """`generate rmat` writes int32 pairs; under a name without .bin, auto reads it as text."""
    p = tmp_path / "graph"
    p.write_bytes(np.array([[64, 6], [33, 10], [7, 9]], dtype="<i4").tobytes())
    fails(strata_cli, tmp_path, p, needles=["graph:1: holds a NUL byte: the file is binary", "--format bin32"])


def test_a_store_given_as_input_is_named(tmp_path, strata_cli):
    """It was "found no train file (train.txt, ...)", as for an empty directory."""
    p = tmp_path / "e.tsv"
    p.write_text("a\tb\nb\tc\n")
    store = tmp_path / "g.strata"
    strata_cli("convert", p, "--out", store, "-q")
    fails(strata_cli, tmp_path, store, needles=[f"{store}: is a Strata store already", "strata reorder"])


def test_numeric_id_out_of_range(tmp_path, strata_cli):
    p = tmp_path / "e.txt"
    p.write_text("0 1\n1 7\n")
    fails(strata_cli, tmp_path, p, "--ids", "int", "--num-nodes", "5", needles=["e.txt:2:", "dst id 7 is out of range"])
    q = tmp_path / "n.txt"
    q.write_text("0 1\n1 -7\n")
    fails(strata_cli, tmp_path, q, "--ids", "int", needles=["n.txt:2:", "dst '-7' is not a non-negative integer"])


def test_empty_inputs(tmp_path, strata_cli):
    p = tmp_path / "empty.tsv"
    p.write_text("")
    fails(strata_cli, tmp_path, p, needles=["empty.tsv", "no edges"])
    d = tmp_path / "nofiles"
    d.mkdir()
    fails(strata_cli, tmp_path, d, needles=["found no train file"])


def test_missing_and_unreadable_paths(tmp_path, strata_cli):
    fails(strata_cli, tmp_path, tmp_path / "nope.tsv", needles=["nope.tsv", "no such file"])
    (tmp_path / "dangling.tsv").symlink_to(tmp_path / "gone.tsv")
    fails(strata_cli, tmp_path, tmp_path / "dangling.tsv", needles=["dangling.tsv", "no such file"])
    good = tmp_path / "train.tsv"
    good.write_text("a b\n")
    (tmp_path / "valid_dir").mkdir()
    fails(
        strata_cli,
        tmp_path,
        good,
        "--valid",
        tmp_path / "valid_dir",
        needles=["valid_dir", "is a directory, expected a file"],
    )
    if os.geteuid() != 0:  # root reads anything, so permissions can only be tested as a user
        locked = tmp_path / "locked.tsv"
        locked.write_text("a b\n")
        locked.chmod(0)
        fails(strata_cli, tmp_path, locked, needles=["locked.tsv", "ermission denied"], code=1)


def test_output_exists_and_parent_missing(tmp_path, strata_cli):
    p = tmp_path / "e.tsv"
    p.write_text("a b\n")
    (tmp_path / "out.strata").mkdir()
    proc = strata_cli("convert", p, "--out", tmp_path / "out.strata", check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    proc = strata_cli("convert", p, "--out", tmp_path / "no" / "such" / "x.strata", check=False)
    assert proc.returncode == 2 and "parent directory does not exist" in proc.stderr


def _limit_file_size():
    # Python ignores SIGXFSZ, so writes past the limit fail with EFBIG like on a full disk.
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


def test_full_disk_leaves_nothing(tmp_path, strata_cli):
    p = tmp_path / "e.txt"
    p.write_text("".join(f"{i} {(i * 7919) % 50000}\n" for i in range(60000)))
    err = fails(
        strata_cli, tmp_path, p, "--memory", "64M", needles=["disk is full"], code=1, preexec_fn=_limit_file_size
    )
    assert "e.txt" not in err.split("disk is full")[0] or ".npy" in err


def test_budget_too_small(tmp_path, strata_cli):
    p = tmp_path / "e.txt"
    p.write_text("0 1\n")
    fails(strata_cli, tmp_path, p, "--memory", "100K", needles=["memory budget of 100 KiB is too small"])


def test_options_the_input_format_does_not_read_are_refused(tmp_path, strata_cli):
    # A text edge list with --features made a store without features, without a word.
    p = tmp_path / "e.tsv"
    p.write_text("a\tb\nb\tc\n")
    np.save(tmp_path / "x.npy", np.ones((3, 4), dtype=np.float32))
    for extra, flag in [(["--features", tmp_path / "x.npy"], "--features"), (["--layout", "columns"], "--layout")]:
        fails(strata_cli, tmp_path, p, *extra, needles=[f"convert: {flag} would be ignored: the text converter"])
    # NumPy pairs said to be triples: converted without relations before.
    np.save(tmp_path / "pairs.npy", np.array([[0, 1], [1, 2]], dtype=np.int64))
    fails(
        strata_cli,
        tmp_path,
        tmp_path / "pairs.npy",
        "--relations",
        needles=["pairs.npy", "--relations: the edge array has 2 columns"],
    )


def test_gzip_and_csv_with_header(tmp_path, strata_cli):
    import gzip

    p = tmp_path / "edges.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write('source,target\n"a,1",b\nb,"c ""x"""\n')
    out = tmp_path / "g.strata"
    strata_cli("convert", p, "--header", "--out", out, "-q")
    from strata import Store

    s = Store(out)
    assert [s.node_name(i) for i in range(s.num_nodes)] == ["a,1", "b", 'c "x"']
    # Python API misuse: -1 was pyo3's OverflowError (and an integer-id store's last node).
    for node in (-1, 3):
        with pytest.raises(IndexError, match=rf"node id {node} is out of range \(0..3\)"):
            s.node_name(node)
    # A bool or a float passed the range check and was named as if it were an id.
    for node in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="node must be an integer id"):
            s.node_name(node)
    assert s.node_name(np.int64(1)) == "b"
    # An unknown split was None, as if the store lacked a split it could never hold.
    for read in (s.edges, s.edge_weights, s.edge_times):
        with pytest.raises(StoreFormatError, match="has no edge split 'valid'; its splits: train"):
            read("valid")
    assert s.edge_weights("train") is None
    with pytest.raises(ValueError, match="node split must be one of train, valid, test, got 'validation'"):
        s.node_split("validation")
    assert s.node_split("valid") is None


def make_store(tmp_path: Path, strata_cli) -> Path:
    p = tmp_path / "e.tsv"
    p.write_text("a\tb\nb\tc\nc\ta\n")
    out = tmp_path / "s.strata"
    strata_cli("convert", p, "--out", out, "-q")
    return out


def test_truncated_array_is_named(tmp_path, strata_cli):
    store = make_store(tmp_path, strata_cli)
    f = store / "csr_indices.npy"
    with open(f, "r+b") as h:
        h.truncate(f.stat().st_size - 4)
    proc = strata_cli("info", store, check=False)
    assert proc.returncode == 2
    assert "array 'csr_indices': csr_indices.npy is truncated" in proc.stderr


def test_newer_format_version(tmp_path, strata_cli):
    store = make_store(tmp_path, strata_cli)
    m = json.loads((store / "manifest.json").read_text())
    m["format_version"] = 7
    (store / "manifest.json").write_text(json.dumps(m))
    proc = strata_cli("info", store, check=False)
    assert proc.returncode == 2
    assert "format version 7" in proc.stderr and "upgrade Strata" in proc.stderr


def test_interrupted_conversion_leaves_nothing(tmp_path):
    p = tmp_path / "e.txt"
    p.write_text("".join(f"{i} {i + 1}\n" for i in range(200000)))
    calls = []

    def progress(event, *args):
        calls.append(event)
        if event == "update":
            raise KeyboardInterrupt

    cfg = ConvertConfig(inputs=[p], out=tmp_path / "g.strata", memory=Size(64 << 20))
    with pytest.raises(KeyboardInterrupt):
        convert(cfg, progress)
    assert "update" in calls
    assert not (tmp_path / "g.strata").exists()
    assert leftovers(tmp_path) == []


def test_numpy_bad_shapes_through_cli(tmp_path, strata_cli):
    d = tmp_path / "arrays"
    d.mkdir()
    np.save(d / "edges.npy", np.array([[0, 1], [1, 7]], dtype=np.int64))
    np.save(d / "features.npy", np.zeros((5, 4), dtype=np.float32))
    # Without --num-nodes the features' rows are the node count: the edge beyond them says so (it
    # read "num_nodes is 5", as if the edges alone were wrong).
    fails(strata_cli, tmp_path, d, needles=[
        "edges.npy: edge 1: dst id 7 is out of range: num_nodes (the rows of", "features.npy, one per node) is 5"
    ])  # fmt: skip
    np.save(d / "edges.npy", np.array([[0, 1], [1, 2]], dtype=np.int64))
    np.save(d / "features.npy", np.zeros((3, 4), dtype=np.float32))
    np.save(d / "labels.npy", np.array([0.5, 1, 2]))
    fails(strata_cli, tmp_path, d, needles=["labels.npy", "labels must be integers"])
    shutil.rmtree(d)


@pytest.mark.parametrize(
    ("values", "dtype", "extra", "needle"),
    [
        ([[1.0], [np.nan], [0.0], [2.0]], np.float32, [], "row 1, column 0: NaN is not a finite float32 number"),
        ([[1.0], [2.0], [1e300], [0.0]], np.float64, [], "row 2, column 0: inf is not a finite float32 number"),
        ([[1.0, 7e4], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], np.float32, ["--feature-dtype", "float16"],
         "row 0, column 1: 70000 is not a finite float16 number"),
    ],
)  # fmt: skip
def test_features_that_are_not_finite_as_stored_are_refused(tmp_path, strata_cli, values, dtype, extra, needle):
    """A NaN or an infinity among the node features, or a value beyond the stored dtype's range,
    is refused naming the file, row and column: `strata check` and every model would refuse it
    later."""
    np.save(tmp_path / "edges.npy", np.array([[0, 1], [1, 2], [2, 3]]))
    np.save(tmp_path / "feat.npy", np.array(values, dtype=dtype))
    fails(strata_cli, tmp_path, tmp_path / "edges.npy", "--features", tmp_path / "feat.npy", *extra,
          needles=["feat.npy: " + needle])  # fmt: skip


def test_a_features_path_that_is_a_directory_is_bad_input(tmp_path, strata_cli):
    np.save(tmp_path / "edges.npy", np.array([[0, 1], [1, 2]]))
    (tmp_path / "fdir").mkdir()
    fails(strata_cli, tmp_path, tmp_path / "edges.npy", "--features", tmp_path / "fdir", needles=["fdir", "directory"])


@pytest.mark.parametrize("dim", ["4294967296", "18446744073709551615", "99999999999999999999999"])
def test_an_edge_feature_count_beyond_a_line_is_refused(tmp_path, strata_cli, dim):
    """``feat:D`` is bounded by what a line can hold (16 MiB, two bytes a feature) before
    anything is sized from it: no allocation failure, no overflow."""
    (tmp_path / "e.tsv").write_text("1\t2\n3\t4\n")
    fails(strata_cli, tmp_path, tmp_path / "e.tsv", "--columns", f"src,dst,feat:{dim}",
          needles=[f"'feat:{dim}': feat:D needs a feature count D from 1 to 8388608"])  # fmt: skip


def test_a_node_count_beyond_the_disk_is_refused_before_writing(tmp_path, strata_cli):
    """Node counts that would fill the disk (given as num_nodes, or as a node type's count) are
    refused at once with the disk's free space and the least the store needs, leaving nothing."""
    (tmp_path / "e.tsv").write_text("0 1\n")
    fails(strata_cli, tmp_path, tmp_path / "e.tsv", "--num-nodes", "99999999999999",
          needles=["free, too little: the topology (CSR and CSC) of 99999999999999 nodes", "PiB"])  # fmt: skip
    (tmp_path / "nt.tsv").write_text("user\t9223372036854775807\n")
    (tmp_path / "et.tsv").write_text("user\tfollows\tuser\n")
    (tmp_path / "t.tsv").write_text("0\tfollows\t1\n")
    fails(strata_cli, tmp_path, tmp_path / "t.tsv", "--columns", "src,rel,dst", "--node-types", tmp_path / "nt.tsv",
          "--edge-types", tmp_path / "et.tsv", needles=["free, too little", "9223372036854775807 nodes"])  # fmt: skip


def npy_with_header(path: Path, header: str, data: bytes = b"") -> Path:
    """A version 1 .npy file whose header dict is ``header`` as given (NumPy would not write it)."""
    text = header.encode()
    text += b" " * ((64 - (11 + len(text)) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data)
    return path


@pytest.mark.parametrize(
    "header, needle",
    [
        # (2, 2^61) int64 is 2^65 bytes: wrapped to 0, it streamed nothing until killed.
        ("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2305843009213693952), }", "(more than 2^64 bytes)"),
        ("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), 'descr': '<f4'}", "header: 'descr' appears twice"),
        ("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2)", "header: expected '}' at byte"),
        ("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }, 'x': 1", "header: unexpected text after the"),
    ],
)
def test_npy_headers_numpy_does_not_write_are_refused(tmp_path, strata_cli, header, needle):
    """Each was read somehow before: the first key of two, a dict left open, text after it."""
    path = npy_with_header(tmp_path / "e.npy", header, np.array([[0, 1], [1, 2]], dtype="<i8").tobytes())
    err = fails(strata_cli, tmp_path, path, needles=["e.npy: ", needle], timeout=60)
    assert "fortran_order" not in err, "the header's text is not echoed"
