"""Stores whose files have the right sizes but wrong values (an id out of range, an offset out
of order): every command that reads the bad array fails with exit 2 and the file named, none
panics or prints a traceback, and ``strata check`` lists every planted problem."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_in_process import in_process
from conftest import run_strata
from strata.errors import StoreFormatError
from strata.store import Store, check_store

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_store_check")

SBM_NODES = 400
GRID = "p2"
#: `strata gnn train` runs in the matrix when PyTorch is installed (`pip install -e '.[torch]'`).
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """Two sound stores: ``sbm`` (features, labels, node splits, CSR and CSC apart, a grid) and
    ``kg`` (relations, names, valid and test edges)."""
    d = tmp_path_factory.mktemp("pristine")
    run_strata("generate", "sbm", "--out", d / "sbm-raw", "--nodes", SBM_NODES, "--classes", "3", "--feature-dim", "8",
               "--avg-degree", "6", "-q")  # fmt: skip
    run_strata("convert", d / "sbm-raw", "--out", d / "sbm.strata", "-q")
    run_strata("grid", "build", d / "sbm.strata", "--name", GRID, "--partitions", "2", "-q")
    run_strata("generate", "kg", "--out", d / "kg-raw", "--entities", "200", "--relations", "5", "--triples", "3000",
               "-q")  # fmt: skip
    run_strata("convert", d / "kg-raw", "--relations", "--out", d / "kg.strata", "-q")
    return {"sbm": d / "sbm.strata", "kg": d / "kg.strata"}


def poke(store: Path, file: str, index, value) -> None:
    """Sets one element of ``file`` (a .npy of the store) in place: same size, wrong value."""
    a = np.load(store / file, mmap_mode="r+")
    a[index] = value
    a.flush()
    del a


def edit_manifest(path: Path, edit) -> None:
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def set_in(keys: list, value):
    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value

    return edit


def reshape_features(store: Path) -> None:
    """Rewrites features.npy's header as (2N, dim/2): the same bytes, the wrong shape."""
    rows, dim = np.load(store / "features.npy", mmap_mode="r").shape
    header = (store / "features.npy").read_bytes()[:4096]
    old, new = f"({rows}, {dim})".encode(), f"({2 * rows}, {dim // 2})".encode()
    assert old in header and len(old) == len(new)
    with open(store / "features.npy", "r+b") as f:
        f.write(header.replace(old, new))


def grid(file: str, index, value):
    return lambda s: poke(s / "grids" / GRID, file, index, value)


def at(file: str, index, value):
    return lambda s: poke(s, file, index, value)


def manifest(keys: list, value):
    return lambda s: edit_manifest(s / "manifest.json", set_in(keys, value))


def shift(file: str, index):
    """Moves one id of ``file`` to the next node: still in range, but a different edge."""

    def corrupt(store: Path) -> None:
        old = int(np.load(store / file, mmap_mode="r")[index])
        poke(store, file, index, (old + 1) % SBM_NODES)

    return corrupt


#: Engines that open a store to train or serve, which refuse one that fails `strata check`.
GATED = {"serve", "gnn", "embed", "build"}

# name: (store, corruption, the file messages must name, commands that read it: a set, "all", or
# "store": the store fails `strata check`, so every engine in GATED refuses it, and so does `run`
# where it builds its grid)
CASES = {
    "csr_indptr": ("sbm", at("csr_indptr.npy", 5, 10**9), "csr_indptr.npy", "store"),
    "csr_indices": ("sbm", at("csr_indices.npy", 3, 10**6), "csr_indices.npy", "store"),
    "csc_indptr": ("sbm", at("csc_indptr.npy", 7, -5), "csc_indptr.npy", "store"),
    "csc_indices": ("sbm", at("csc_indices.npy", 0, SBM_NODES), "csc_indices.npy", "store"),
    "csc_edge_changed": ("sbm", shift("csc_indices.npy", 17), "csc_indices.npy", "store"),
    "edges_src": ("kg", at("edges_train.npy", (10, 0), 10**7), "edges_train.npy", "store"),
    "edges_rel": ("kg", at("edges_train.npy", (11, 1), 99), "edges_train.npy", "store"),
    "edges_dst": ("sbm", at("edges_train.npy", (2, 1), -1), "edges_train.npy", "store"),
    "edges_valid": ("kg", at("edges_valid.npy", (0, 2), 10**6), "edges_valid.npy", "store"),
    "edges_test": ("kg", at("edges_test.npy", (1, 0), 10**6), "edges_test.npy", "store"),
    "labels": ("sbm", at("labels.npy", 4, 77), "labels.npy", "store"),
    "node_train": ("sbm", at("node_train.npy", 1, 10**5), "node_train.npy", "store"),
    "node_valid": ("sbm", at("node_valid.npy", 0, -2), "node_valid.npy", "store"),
    "node_test": ("sbm", at("node_test.npy", 2, SBM_NODES), "node_test.npy", "store"),
    "out_degree": ("sbm", at("out_degree.npy", 3, 999), "out_degree.npy", "store"),
    "features_nan": ("sbm", at("features.npy", (3, 2), np.nan), "features.npy row 3: column 2 is NaN", "store"),
    "features_inf": ("sbm", at("features.npy", (5, 0), -np.inf), "features.npy row 5: column 0 is -inf", "store"),
    "node_names": ("kg", at("node_names_offsets.npy", 5, 10**9), "node_names_offsets.npy", "store"),
    "stats": ("sbm", manifest(["stats", "out_degree", "max"], 10**6), "manifest.json", "store"),
    "features_shape": ("sbm", reshape_features, "features", "all"),
    "manifest_counts": ("kg", manifest(["graph", "num_nodes"], 150), "the graph requires", "all"),
    "grid_offsets": ("sbm", grid("block_index.npy", 2, 10**8), "block_index.npy", {"run"}),
    "grid_local_ids": ("sbm", grid("edges.npy", (5, 1), 10**6), "edges.npy", {"run"}),
}


def commands(kind: str, store: Path, scratch: Path) -> dict[str, list]:
    """Every command that applies to a store of ``kind``, reading as much of it as it can."""
    cmds = {
        "info": ["info", store],
        "check": ["check", store],
        "embed": ["embed", "train", store, "--run-dir", scratch / "run", "--epochs", "1", "--dim", "8", "-q"],
        "build": ["grid", "build", store, "--name", "fresh", "--partitions", "2", "-q"],
        "run": ["run", "pagerank", store, "--iterations", "2", "--out", scratch / "pr", "-q"]
        + (["--grid", GRID] if kind == "sbm" else []),
    }
    if kind == "sbm":
        cmds["serve"] = ["serve", f"g={store}", "--state-dir", scratch / "state", "--listen", "127.0.0.1:0"]
        if HAVE_TORCH:
            cmds["gnn"] = ["gnn", "train", store, "--run-dir", scratch / "gnn", "--epochs", "1", "--fanouts", "3,3",
                           "--batch-size", "64", "--hidden", "8", "-q"]  # fmt: skip
    return cmds


def strata(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "strata", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_command_refuses_a_corrupt_array(case, pristine, tmp_path, capsys):
    kind, corrupt, needle, readers = CASES[case]
    if readers == "store":
        readers = GATED | ({"run"} if kind == "kg" else set())
    store = tmp_path / f"{kind}.strata"
    shutil.copytree(pristine[kind], store)
    corrupt(store)
    for name, args in commands(kind, store, tmp_path).items():
        if name == "serve":
            if readers != "all" and name not in readers:
                continue  # the store registers fine, and the server would serve it until stopped
            # A child process: a server that starts by mistake is stopped by the timeout.
            proc = strata(*args, timeout=60)
            code, out = proc.returncode, proc.stdout + proc.stderr
        else:
            code, out = in_process(args, capsys)
        assert "Traceback" not in out and "panicked" not in out, f"{case}: strata {name}\n{out}"
        assert code in (0, 2), f"{case}: strata {name} exited {code}\n{out}"
        if name == "check" or readers == "all" or name in readers:
            assert code == 2, f"{case}: strata {name} accepted the store\n{out}"
            assert needle in out, f"{case}: strata {name} does not name {needle}\n{out}"
        if name in readers and name != "check":
            assert f"strata {args[0]}" in out and "error:" in out, out


def test_check_lists_every_planted_problem(pristine, tmp_path):
    store = tmp_path / "sbm.strata"
    shutil.copytree(pristine["sbm"], store)
    planted = [
        ("edges_train.npy", (4, 0), SBM_NODES + 3, 4),
        ("edges_train.npy", (9, 1), -7, 9),
        ("csc_indices.npy", 6, 10**6, 6),
        ("labels.npy", 8, 3, 8),
        ("node_test.npy", 0, -1, 0),
        ("out_degree.npy", 11, 10**4, 11),
        ("features.npy", (12, 0), np.inf, 12),
    ]
    for file, index, value, _ in planted:
        poke(store, file, index, value)
    poke(store / "grids" / GRID, "edges.npy", (3, 0), 10**6)
    proc = strata("check", store, "--json-summary", "-q")
    assert proc.returncode == 2, proc.stderr
    report = json.loads(proc.stdout)
    found = {(p["file"], p["row"]) for p in report["listed"]}
    for file, _, _, row in planted:
        assert (file, row) in found, (file, row, report["listed"])
    assert (f"grids/{GRID}/edges.npy", 3) in found, report["listed"]
    # The corrupt edges also make CSR and CSC disagree with the train edges there.
    assert any(p["file"] == "csc_indices.npy" and p["row"] is None for p in report["listed"]), report["listed"]
    assert report["problems"] >= len(planted) + 1 and not report["ok"]
    text = strata("check", store, "-q")
    assert text.returncode == 2
    assert "edges_train.npy row 4: src 403 is out of range [0, 400)" in text.stdout, text.stdout
    assert "labels.npy row 8: label 3 is out of range [-1, 3)" in text.stdout, text.stdout


def test_check_passes_sound_stores_and_caps_the_list(pristine, tmp_path):
    for kind in ("sbm", "kg"):
        report = check_store(pristine[kind])
        assert report["ok"] and report["problems"] == 0, report["listed"]
        assert "csr_indices.npy" in report["files_checked"]
    assert f"grids/{GRID}/edges.npy" in check_store(pristine["sbm"])["files_checked"]
    proc = strata("check", pristine["kg"])
    assert proc.returncode == 0 and "no problems" in proc.stdout, proc.stdout + proc.stderr
    store = tmp_path / "kg.strata"
    shutil.copytree(pristine["kg"], store)
    a = np.load(store / "edges_train.npy", mmap_mode="r+")
    a[:50, 0] = 10**6
    a.flush()
    del a
    report = check_store(store, max_problems=5)
    assert [p["row"] for p in report["listed"] if p["file"] == "edges_train.npy"] == [0, 1, 2, 3, 4]
    # 45 more rows, and the ranges where the train edges no longer match CSR and CSC.
    assert (
        report["unlisted"]["edges_train.npy"] >= 45 and report["problems"] == 5 + report["unlisted"]["edges_train.npy"]
    )


def test_a_grid_built_on_its_own_is_checked_by_itself(tmp_path):
    """`strata grid build INPUT --out DIR` makes a grid no store holds; check reads it alone
    (it was refused as a directory without a store's manifest)."""
    edges = tmp_path / "edges.tsv"
    edges.write_text("".join(f"{i}\t{(i * 7 + 3) % 50}\n" for i in range(200)))
    grid_dir = tmp_path / "g"
    run_strata("grid", "build", edges, "--out", grid_dir, "--partitions", "2", "-q")
    proc = strata("check", grid_dir)
    assert proc.returncode == 0 and f"grid {grid_dir}: no problems" in proc.stdout, proc.stdout + proc.stderr
    assert {"edges.npy", "block_index.npy", "in_degree.npy"} <= set(check_store(grid_dir)["files_checked"])
    poke(grid_dir, "edges.npy", (3, 0), 10**6)
    proc = strata("check", grid_dir, "--json-summary", "-q")
    report = json.loads(proc.stdout)
    assert proc.returncode == 2 and ("edges.npy", 3) in {(p["file"], p["row"]) for p in report["listed"]}, report


def test_one_corrupt_indptr_entry_is_one_problem(pristine, tmp_path):
    store = tmp_path / "sbm.strata"
    shutil.copytree(pristine["sbm"], store)
    indptr = np.load(store / "csr_indptr.npy")
    # In range, but above the entries after it: every good entry after it looks decreasing.
    spike = int(indptr[150])
    poke(store, "csr_indptr.npy", 100, spike)
    report = check_store(store)
    assert [(p["file"], p["row"]) for p in report["listed"]] == [("csr_indptr.npy", 100)], report["listed"]
    assert report["problems"] == 1
    want = f"csr_indptr.npy row 100: indptr {spike} is out of range [{indptr[99]}, {indptr[101] + 1})"
    assert report["listed"][0]["message"] == want
    # Below the entry before it: that entry alone.
    poke(store, "csr_indptr.npy", 100, int(indptr[100]))
    poke(store, "csc_indptr.npy", 200, 0)
    report = check_store(store)
    assert [(p["file"], p["row"]) for p in report["listed"]] == [("csc_indptr.npy", 200)], report["listed"]


def test_check_lists_every_structural_problem(pristine, tmp_path):
    store = tmp_path / "kg.strata"
    shutil.copytree(pristine["kg"], store)
    (store / "in_degree.npy").unlink()
    with open(store / "csr_indices.npy", "r+b") as f:
        f.truncate((store / "csr_indices.npy").stat().st_size - 4)
    report = check_store(store)
    messages = " | ".join(p["message"] for p in report["listed"])
    assert "in_degree.npy is missing" in messages and "csr_indices.npy is truncated" in messages, messages
    assert report["problems"] == 2


def test_the_python_loaders_raise_store_format_error(pristine, tmp_path):
    pytest.importorskip("torch", reason="the GNN loaders need PyTorch (pip install -e '.[torch]')")
    from strata.gnn import LinkLoader, NodeLoader

    for file, index, value in (
        ("csc_indices.npy", 2, SBM_NODES + 1),
        ("labels.npy", 0, -3),
        ("node_train.npy", 3, 10**6),
        ("edges_train.npy", (1, 0), SBM_NODES),
    ):
        store = tmp_path / file
        shutil.copytree(pristine["sbm"], store)
        poke(store, file, index, value)
        loader = LinkLoader if file == "edges_train.npy" else NodeLoader
        with pytest.raises(StoreFormatError, match=f"{file} row"):
            loader(store, fanouts=[3], batch_size=32, memory="256M")
    # Values in range that break a cross-check: CSC no longer holds CSR's edges, a NaN feature.
    for corrupt, needle in (
        (shift("csc_indices.npy", 40), r"csc_indices.npy: the edges into nodes \[\d+, \d+\) differ"),
        (at("features.npy", (7, 1), np.nan), "features.npy row 7: column 1 is NaN"),
    ):
        store = tmp_path / f"cross-{needle[:8]}"
        shutil.copytree(pristine["sbm"], store)
        corrupt(store)
        for loader in (NodeLoader, LinkLoader):
            with pytest.raises(StoreFormatError, match=needle):
                loader(store, fanouts=[3], batch_size=32, memory="256M")
    assert Store(pristine["sbm"]).checked("labels", "label", -1, 3).shape == (SBM_NODES,)


def test_a_trained_run_refuses_a_store_corrupted_since(pristine, tmp_path):
    store = tmp_path / "kg.strata"
    shutil.copytree(pristine["kg"], store)
    run = tmp_path / "run"
    run_strata("embed", "train", store, "--run-dir", run, "--epochs", "1", "--dim", "8", "--partitions", "2", "-q")
    head = Store(store).node_name(3)
    offset = int(np.load(store / "node_names_offsets.npy", mmap_mode="r")[100])
    poke(store, "edges_test.npy", (0, 2), 10**6)
    poke(store, "node_names_offsets.npy", 100, 10**9)
    for args, needle in (
        (["eval", run], "edges_test.npy row 0: dst 1000000 is out of range [0, "),
        (["predict", run, "--head", head, "--relation", Store(store).relation_names[0]], "node_names_offsets.npy row"),
        (["export", run, "--out", tmp_path / "out", "--format", "tsv"], "node_names_offsets.npy row"),
        (["export", run, "--out", tmp_path / "out2"], "node_names_offsets.npy row"),
    ):
        proc = strata("embed", *args, "-q")
        assert proc.returncode == 2 and needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "panicked" not in proc.stderr
    # The bucket index is the store's too: a local id out of its partition is named at the row.
    index = next((store / "partitions").iterdir())
    # The store is sound again (`embed train` refuses a store that fails `strata check`).
    poke(store, "edges_test.npy", (0, 2), 0)
    poke(store, "node_names_offsets.npy", 100, offset)
    poke(index, "edges.npy", (7, 2), 10**6)
    proc = strata("embed", "train", store, "--run-dir", tmp_path / "again", "--epochs", "1", "--dim", "8",
                  "--partitions", "2", "-q")  # fmt: skip
    assert proc.returncode == 2 and "edges.npy row 7: dst_local 1000000 is out of range" in proc.stderr, proc.stderr


def test_check_finds_unsorted_names(pristine, tmp_path):
    store = tmp_path / "kg.strata"
    shutil.copytree(pristine["kg"], store)
    poke(store, "node_names_bytes.npy", 0, 0xFF)  # name 0 now sorts after name 1
    report = check_store(store)
    names = [p for p in report["listed"] if p["file"] == "node_names_bytes.npy"]
    assert [p["row"] for p in names] == [1] and "names must be sorted and unique" in names[0]["message"], names
    assert report["problems"] == 1, report["listed"]


def test_a_passed_check_is_recorded_and_redone_when_the_store_changes(pristine, tmp_path):
    store = tmp_path / "sbm.strata"
    shutil.copytree(pristine["sbm"], store)
    (store / "checked.json").unlink(missing_ok=True)
    build = ["grid", "build", store, "--partitions", "2", "-q", "--overwrite"]
    run_strata(*build, "--name", "a")
    stamp = json.loads((store / "checked.json").read_text())
    assert set(stamp["files"]) >= {"manifest.json", "csc_indices.npy", "features.npy"}, stamp
    # The stamp is what lets the next open skip the pass: a stale one (sizes, times) is ignored.
    old = float(np.load(store / "features.npy", mmap_mode="r")[3, 2])
    poke(store, "features.npy", (3, 2), np.nan)
    proc = run_strata(*build, "--name", "b", check=False)
    assert proc.returncode == 2 and "features.npy row 3: column 2 is NaN" in proc.stderr, proc.stderr
    assert "strata check" in proc.stderr, proc.stderr
    poke(store, "features.npy", (3, 2), old)
    run_strata(*build, "--name", "b")
    assert json.loads((store / "checked.json").read_text()) != stamp
    # `strata check` records a pass too, and a store it refuses carries no stamp.
    (store / "checked.json").unlink()
    assert strata("check", store, "-q").returncode == 0 and (store / "checked.json").is_file()
    shift("csc_indices.npy", 3)(store)
    assert strata("check", store, "-q").returncode == 2
    proc = strata("serve", f"g={store}", "--state-dir", tmp_path / "state", "--listen", "127.0.0.1:0", timeout=60)
    assert proc.returncode == 2 and "csc_indices.npy: the edges into nodes" in proc.stderr, proc.stderr
