"""Input edge cases: names that are not text (NUL bytes, invalid UTF-8), corrupt or truncated
gzip, an output path under a file, and a stdout closed by its reader. Each gets a true message
(naming the file and line where there is one), the documented exit status and no traceback."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_in_process import strata_in_process
from conftest import run_strata

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_input_edges")


def refused(*args, needles: list[str], code: int = 2) -> str:
    proc = run_strata(*args, check=False)
    assert proc.returncode == code, proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    return proc.stderr


BAD_NAMES = [
    # (file name, bytes, extra convert args, expected file:line and words)
    ("nul.tsv", b"a\tb\nc\td\x00x\n", [], ["nul.tsv:2:", "dst name holds a NUL byte at byte 2", "--format bin32"]),
    (
        "latin1.tsv",
        b"a\tb\ncaf\xe9\td\n",
        [],
        ["latin1.tsv:2:", "src name is not valid UTF-8 (byte 0xe9 at byte 4)", "iconv"],
    ),
    ("quoted.csv", b'a,b\n"x\x00y",b\n', [], ["quoted.csv:2:", "src name holds a NUL byte", "names are text"]),
    ("spaces.txt", b"a b\nb c\nc \xff\xfe\n", [], ["spaces.txt:3:", "dst name is not valid UTF-8"]),
    ("rel.tsv", b"a\tr\tb\nb\tr\xc3\tc\n", ["--relations"], ["rel.tsv:2:", "rel name is not valid UTF-8"]),
    # A name cut in the middle of a multi-byte character.
    ("cut.tsv", "a\tb\nx\t\u540d".encode()[:-1] + b"\n", [], ["cut.tsv:2:", "dst name is not valid UTF-8"]),
]


@pytest.mark.parametrize(("name", "data", "extra", "needles"), BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_names_that_are_not_text_are_refused_with_file_and_line(tmp_path, name, data, extra, needles):
    p = tmp_path / name
    p.write_bytes(data)
    out = tmp_path / "g.strata"
    refused("convert", p, *extra, "--out", out, "-q", needles=needles)
    assert sorted(os.listdir(tmp_path)) == [name]


def test_bad_name_in_a_valid_split_file_is_named(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\nb\tc\n")
    (tmp_path / "valid.tsv").write_bytes(b"a\tb\n\xc0\xaf\tc\n")
    refused("convert", tmp_path, "--out", tmp_path / "g.strata", needles=["valid.tsv:2:", "not valid UTF-8"])


def test_utf8_names_round_trip(tmp_path):
    from strata import Store

    p = tmp_path / "u.tsv"
    p.write_text("\u00e9t\u00e9\t\u540d\n\u540d\tz\n", encoding="utf-8")
    run_strata("convert", p, "--out", tmp_path / "g.strata", "-q")
    s = Store(tmp_path / "g.strata")
    assert sorted(s.node_name(i) for i in range(s.num_nodes)) == sorted(["\u00e9t\u00e9", "\u540d", "z"])


def _gz(tmp_path: Path) -> bytes:
    p = tmp_path / "whole.gz"
    with gzip.open(p, "wt") as f:
        f.write("".join(f"n{i}\tn{(i * 7) % 1000}\n" for i in range(20000)))
    data = p.read_bytes()
    p.unlink()
    return data


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "header only"])
def test_corrupt_or_truncated_gzip_is_bad_input(tmp_path, damage):
    data = _gz(tmp_path)
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "corrupt":
        data = data[:200] + bytes(b ^ 0x5A for b in data[200:400]) + data[400:]
    else:
        data = data[:12]
    p = tmp_path / "edges.tsv.gz"
    p.write_bytes(data)
    refused("convert", p, "--out", tmp_path / "g.strata", "-q", needles=["edges.tsv.gz", "corrupt or truncated gzip"])
    assert sorted(os.listdir(tmp_path)) == ["edges.tsv.gz"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("s")
    raw = d / "raw"
    run_strata("generate", "kg", "--out", raw, "--entities", "200", "--relations", "3", "--triples", "2000", "-q")
    run_strata("convert", raw, "--relations", "--out", d / "kg.strata", "-q")
    small = ["--epochs", "1", "--dim", "8", "--negatives", "8", "-q"]
    run_strata("embed", "train", d / "kg.strata", "--run-dir", d / "run", *small)
    return d / "kg.strata"


def test_outputs_under_a_regular_file_get_a_true_message(store, tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    under = blocker / "sub"
    run = store.parent / "run"
    cases = [
        ("convert", store.parent / "raw", "--relations", "--out", under / "g.strata"),
        ("convert", store.parent / "raw", "--relations", "--out", blocker / "g.strata"),
        ("generate", "kg", "--out", under / "kg", "--entities", "10", "--triples", "20"),
        ("embed", "train", store, "--run-dir", under / "run"),
        ("embed", "train", store, "--run-dir", blocker),
        ("embed", "export", run, "--out", under / "emb"),
        ("run", "pagerank", store, "--iterations", "1", "--out", under / "pr"),
        ("plot", run, "--out", under / "plots"),
        ("bench-disk", "--dir", under),
    ]
    # The first case in a child process (its exit status and stderr), the rest in this one.
    cli = strata_in_process(capsys)
    for i, args in enumerate(cases):
        runner = run_strata if i == 0 else cli
        proc = runner(*args, "-q", check=False) if args[0] != "plot" else runner(*args, check=False)
        if args[0] == "plot" and "matplotlib" in proc.stderr:
            continue
        assert proc.returncode == 2, (args, proc.stderr)
        assert "is a file, not a directory" in proc.stderr and str(blocker) in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert blocker.read_text() == "not a directory"
    proc = cli("bench-disk", "--dir", tmp_path / "missing" / "sub", "-q", check=False)
    assert proc.returncode == 2 and "no such directory" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args",
    [["info", "STORE"], ["config", "convert"], ["--help"], ["grid", "info", "STORE"], ["embed", "eval", "RUN", "-q"]],
    ids=lambda a: " ".join(a),
)
def test_a_closed_stdout_ends_quietly(store, args):
    """``strata ... | head -1`` with the reader gone before the first write: no traceback, no
    "Exception ignored" message, and the pipe's conventional exit status (or 0)."""
    argv = [str(store) if a == "STORE" else str(store.parent / "run") if a == "RUN" else a for a in args]
    r, w = os.pipe()
    os.close(r)  # the reader is gone: every write to the pipe fails with EPIPE
    proc = subprocess.run([sys.executable, "-m", "strata", *argv], stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)
    assert proc.returncode in (0, 141), proc.stderr
    for noise in ("Traceback", "Exception ignored", "BrokenPipe"):
        assert noise not in proc.stderr, proc.stderr


def test_damaged_planetoid_files_are_bad_input(shared_datasets, tmp_path):
    """Truncated and byte-mutated Planetoid pickles (a fixed, seeded set) convert or fail with
    an InputError naming the files; none raises anything else (IndexError, MemoryError, ...)."""
    import random
    import shutil

    from strata.config import ConvertConfig, Size
    from strata.convert import convert
    from strata.errors import InputError

    parts = ["tx", "allx", "y", "ty", "ally", "graph", "test.index"]
    rng = random.Random(15)
    outcomes = {"converted": 0, "refused": 0}
    for case in range(24):
        d = tmp_path / f"c{case}"
        d.mkdir()
        for p in [*parts, "x"]:
            shutil.copy(shared_datasets / "planetoid" / f"ind.citeseer.{p}", d)
        f = d / f"ind.citeseer.{parts[case % len(parts)]}"
        data = bytearray(f.read_bytes())
        if case % 3 == 0:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        f.write_bytes(bytes(data))
        try:
            convert(ConvertConfig(inputs=[d], out=d / "g.strata", memory=Size(256 << 20)))
            outcomes["converted"] += 1
        except InputError as e:
            assert "ind.citeseer." in str(e), e
            outcomes["refused"] += 1
        shutil.rmtree(d)
    assert outcomes["refused"] > 0, outcomes


def _cora_copy(shared_datasets, tmp_path) -> Path:
    import shutil

    d = tmp_path / "cora"
    d.mkdir()
    for f in (shared_datasets / "planetoid").glob("ind.cora.*"):
        shutil.copy(f, d)
        (d / f.name).chmod(0o644)
    return d


class _Calls:
    """A pickle that, unpickled without a check, would call ``os.system``."""

    def __init__(self, witness: Path):
        self.witness = witness

    def __reduce__(self):
        return (os.system, (f"touch {self.witness}",))


def test_a_planetoid_pickle_cannot_call_anything(shared_datasets, tmp_path):
    """A Planetoid pickle naming a callable outside the arrays, sparse matrices and adjacency
    lists the format holds is refused, naming the file and the callable, and nothing runs."""
    import pickle

    d = _cora_copy(shared_datasets, tmp_path)
    witness = tmp_path / "ran"
    (d / "ind.cora.graph").write_bytes(pickle.dumps(_Calls(witness), protocol=2))
    err = refused("convert", str(d), "--out", str(tmp_path / "g"), "-q", needles=["ind.cora.graph", "system"])
    assert "not a readable Planetoid pickle" in err
    assert not witness.exists()
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    "part, content, needles",
    [
        ("test.index", "99999999999999999999\n", ["ind.cora.test.index", "one integer per line"]),
        ("test.index", "-5\n", ["ind.cora.test.index", "node -5 is not in [0, 2708)"]),
        ("graph", {0: [2**70]}, ["ind.cora.graph"]),
        ("graph", {0: [-3, 5]}, ["ind.cora.graph", "node id -3 is negative"]),
    ],
)
def test_planetoid_ids_out_of_range_name_their_file(shared_datasets, tmp_path, part, content, needles):
    """Ids too large for int64, and negative ids, in the test index or the adjacency list: an
    error naming the Planetoid file they are in (not a staging file, not a traceback)."""
    import collections
    import pickle

    d = _cora_copy(shared_datasets, tmp_path)
    f = d / f"ind.cora.{part}"
    if part == "test.index":
        f.write_text(f.read_text() + content)
    else:
        f.write_bytes(pickle.dumps(collections.defaultdict(list, content), protocol=2))
    refused("convert", str(d), "--out", str(tmp_path / "g"), "-q", needles=needles)
