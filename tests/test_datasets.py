"""``strata datasets``: catalogue, resumable downloads, checksums, extraction and every recipe,
against a local HTTP server (no internet)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import run_strata
from datasets_fixtures import (
    FileServer,
    gz,
    kg_zip,
    ogb_arrays,
    ogb_csv_zip,
    ogb_npz_zip,
    write_zip,
)
from strata.cli.main import main
from strata.config import ConfigError, FetchConfig, load
from strata.datasets import ogb
from strata.datasets.download import download, extract, parse_checksum, part_path
from strata.datasets.fetch import MIRROR_ENV, fetch, file_url
from strata.datasets.registry import CATALOGUE, get
from strata.errors import DownloadError, InputError
from strata.store import Store
from torchrun_env import free_port


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    with FileServer(root) as s:
        yield s


def fetch_cfg(name: str, tmp_path: Path, server: FileServer, **kw) -> FetchConfig:
    return load(FetchConfig, flags={"name": name, "dir": tmp_path / "data", "mirror": server.url, **kw})


# --- catalogue ------------------------------------------------------------------------------------


def test_catalogue_entries_are_well_formed():
    expected = {
        "FB15k-237",
        "WN18RR",
        "Cora",
        "CiteSeer",
        "ogbn-arxiv",
        "ogbn-products",
        "ogbn-mag",
        "ogbn-papers100M",
        "soc-LiveJournal1",
        "twitter-2010",
        "com-friendster",
        "Freebase86m",
    }
    assert set(CATALOGUE) == expected
    for ds in CATALOGUE.values():
        names = [f.name for f in ds.files]
        assert len(set(names)) == len(names), ds.name
        for f in ds.files:
            assert f.url.startswith("https://"), f.url
            if f.checksum:
                parse_checksum(f.checksum)
    assert CATALOGUE["Cora"].checksums == "sha256"
    assert CATALOGUE["ogbn-products"].symmetrize and not CATALOGUE["ogbn-arxiv"].symmetrize


def test_lookup_ignores_case_and_suggests():
    assert get("ogbn-ARXIV").name == "ogbn-arxiv"
    with pytest.raises(ConfigError, match="did you mean 'CiteSeer'"):
        get("citeseer2")


def test_mirror_url_and_environment(tmp_path, server, monkeypatch):
    ds = CATALOGUE["ogbn-arxiv"]
    assert file_url(ds, ds.files[0], None) == "https://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip"
    assert file_url(ds, ds.files[0], "http://m/x/") == "http://m/x/ogbn-arxiv/arxiv.zip"
    edges = b"0\t1\n"
    (server.root / "soc-LiveJournal1").mkdir()
    (server.root / "soc-LiveJournal1" / "soc-LiveJournal1.txt.gz").write_bytes(gz(edges))
    monkeypatch.setenv(MIRROR_ENV, server.url)
    fetch(load(FetchConfig, flags={"name": "soc-LiveJournal1", "dir": tmp_path, "convert": False}))
    assert server.requests == [("/soc-LiveJournal1/soc-LiveJournal1.txt.gz", None)]


def test_cli_lists_every_dataset(strata_cli):
    out = strata_cli("datasets", "list").stdout
    for name in CATALOGUE:
        assert name in out
    assert "sha256" in out


def test_cli_list_json(capsys):
    assert main(["datasets", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(CATALOGUE)


# --- downloads ------------------------------------------------------------------------------------


def payload(n: int = 300_000) -> bytes:
    return np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8).tobytes()


def serve(server: FileServer, rel: str, data: bytes) -> str:
    path = server.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return f"{server.url}/{rel}"


def test_interrupted_download_resumes_with_a_range_request(tmp_path, server):
    data = payload()
    url = serve(server, "d/blob.bin", data)
    server.cut["/d/blob.bin"] = 100_000
    dest = tmp_path / "blob.bin"
    with pytest.raises(DownloadError, match=r"run again to resume"):
        download(url, dest, retries=0)
    assert part_path(dest).stat().st_size == 100_000 and not dest.exists()
    assert download(url, dest, retries=0)
    assert server.ranges("/d/blob.bin") == [None, "bytes=100000-"]
    assert dest.read_bytes() == data and not part_path(dest).exists()
    assert not download(url, dest)
    assert len(server.requests) == 2


def test_a_retry_within_one_call_resumes(tmp_path, server):
    data = payload()
    url = serve(server, "d/blob.bin", data)
    server.cut["/d/blob.bin"] = 50_000
    dest = tmp_path / "blob.bin"
    assert download(url, dest, retries=1)
    assert server.ranges("/d/blob.bin") == [None, "bytes=50000-"]
    assert dest.read_bytes() == data


def test_a_server_ignoring_ranges_restarts_the_file(tmp_path, server):
    data = payload()
    url = serve(server, "d/blob.bin", data)
    server.no_range.add("/d/blob.bin")
    dest = tmp_path / "blob.bin"
    part_path(dest).write_bytes(b"stale bytes")
    assert download(url, dest, retries=0)
    assert server.ranges("/d/blob.bin") == ["bytes=11-"]
    assert dest.read_bytes() == data


def test_a_complete_part_file_is_finished_without_a_transfer(tmp_path, server):
    data = payload(1000)
    url = serve(server, "d/blob.bin", data)
    dest = tmp_path / "blob.bin"
    part_path(dest).write_bytes(data)
    assert download(url, dest, retries=0, checksum=f"sha256:{hashlib.sha256(data).hexdigest()}")
    assert dest.read_bytes() == data


def test_md5_and_sha256_checksums(tmp_path, server):
    data = payload(5000)
    url = serve(server, "d/blob.bin", data)
    assert download(url, tmp_path / "a", checksum=f"md5:{hashlib.md5(data).hexdigest().upper()}")
    wrong = "0" * 64
    with pytest.raises(DownloadError) as e:
        download(url, tmp_path / "b", checksum=f"sha256:{wrong}")
    message = str(e.value)
    assert "b: sha256 mismatch" in message and wrong in message and hashlib.sha256(data).hexdigest() in message
    assert not (tmp_path / "b").exists() and not part_path(tmp_path / "b").exists()
    with pytest.raises(ValueError, match="expected sha256"):
        parse_checksum("sha1:abc")


def test_http_404_names_the_url(tmp_path, server):
    with pytest.raises(DownloadError, match=rf"GET {server.url}/WN18RR/wn18rr.zip: HTTP 404"):
        fetch(fetch_cfg("WN18RR", tmp_path, server))
    assert len(server.requests) == 1


def test_unreachable_host_names_the_url(tmp_path):
    mirror = f"http://127.0.0.1:{free_port()}"
    cfg = load(FetchConfig, flags={"name": "Cora", "dir": tmp_path, "mirror": mirror, "retries": 0})
    with pytest.raises(DownloadError, match=rf"GET {mirror}/Cora/ind.cora.x: cannot reach the server"):
        fetch(cfg)


def test_cli_errors_exit_non_zero(tmp_path, server, capsys):
    code = main(["datasets", "fetch", "FB15k-237", "--dir", str(tmp_path), "--mirror", server.url, "-q"])
    assert code == 1
    assert f"{server.url}/FB15k-237/FB15k-237.zip: HTTP 404" in capsys.readouterr().err
    assert main(["datasets", "fetch", "Cora", "--dir", str(tmp_path), "--mirror", "ftp://x"]) == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err
    assert not (tmp_path / "FB15k-237" / "FB15k-237.strata").exists()


# --- extraction -----------------------------------------------------------------------------------


def test_tar_gz_extraction_and_unsafe_members(tmp_path):
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name, data in (("top/train.txt", b"a\tr\tb\n"), ("top/sub/x.bin", b"\0" * 10)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "top" / "train.txt").read_bytes() == b"a\tr\tb\n"
    assert (tmp_path / "out" / "top" / "sub" / "x.bin").stat().st_size == 10
    evil = write_zip(tmp_path / "evil.zip", {"../escape.txt": b"x"})
    with pytest.raises(InputError, match="outside"):
        extract(evil, tmp_path / "out2")
    assert not (tmp_path / "escape.txt").exists()
    # `tar -C DIR .` names the archive's root `./` and every file `./NAME`.
    dotted = tmp_path / "dotted.tgz"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "edges.txt").write_bytes(b"0 1\n")
    with tarfile.open(dotted, "w:gz") as tf:
        tf.add(tmp_path / "d", arcname=".")
    assert [m.name for m in tarfile.open(dotted).getmembers()] == [".", "./edges.txt"]
    extract(dotted, tmp_path / "out3")
    assert (tmp_path / "out3" / "edges.txt").read_bytes() == b"0 1\n"
    # A file member whose name is the root itself has nowhere to go.
    rootfile = tmp_path / "rootfile.tgz"
    with tarfile.open(rootfile, "w:gz") as tf:
        info = tarfile.TarInfo("./")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(InputError, match="outside"):
        extract(rootfile, tmp_path / "out4")


# --- recipes, end to end --------------------------------------------------------------------------


def test_fb15k237_end_to_end_through_the_cli(tmp_path, server, capsys, shared_datasets):
    kg_zip(shared_datasets / "fb15k-237", "FB15k-237", server.root / "FB15k-237" / "FB15k-237.zip")
    data = tmp_path / "data"
    argv = ["datasets", "fetch", "fb15k-237", "--dir", str(data), "--mirror", server.url, "-q"]
    assert main([*argv, "--json-summary"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["downloaded"] == ["FB15k-237.zip"]
    store = Store(data / "FB15k-237" / "FB15k-237.strata")
    assert store.num_nodes == 14_541 and store.num_relations == 237
    assert store.num_edges == {"train": 272_115, "valid": 17_535, "test": 20_466}
    assert (data / "FB15k-237" / "raw" / "FB15k-237" / "entities.dict").exists()
    # Everything is in place: a second run transfers nothing and keeps the store.
    assert main(argv) == 0
    assert "already exists; --overwrite rebuilds it" in capsys.readouterr().out
    assert len(server.requests) == 1


def test_wn18rr_keeps_zero_padded_entity_names(tmp_path, server, shared_datasets):
    kg_zip(shared_datasets / "wn18rr", "wn18rr", server.root / "WN18RR" / "wn18rr.zip")
    store = Store(fetch(fetch_cfg("WN18RR", tmp_path, server)).store)
    assert store.num_nodes == 40_943 and store.num_relations == 11
    assert store.num_edges == {"train": 86_835, "valid": 3_034, "test": 3_134}
    assert store.node_id("00260881") is not None


def test_cora_with_published_checksums(tmp_path, server, shared_datasets):
    src = shared_datasets / "planetoid"
    for f in CATALOGUE["Cora"].files:
        (server.root / "Cora").mkdir(exist_ok=True)
        (server.root / "Cora" / f.name).write_bytes((src / f.name).read_bytes())
    result = fetch(fetch_cfg("Cora", tmp_path, server))
    store = Store(result.store)
    assert store.num_nodes == 2_708 and store.num_edges == {"train": 10_556}
    assert store.features.shape == (2_708, 1_433)
    assert int(store.labels.max()) + 1 == 7
    assert [len(store.node_split(s)) for s in ("train", "valid", "test")] == [140, 500, 1_000]


def test_checksum_mismatch_leaves_no_file_and_no_store(tmp_path, server, shared_datasets):
    src = shared_datasets / "planetoid"
    (server.root / "Cora").mkdir()
    for f in CATALOGUE["Cora"].files:
        (server.root / "Cora" / f.name).write_bytes((src / f.name).read_bytes())
    graph = server.root / "Cora" / "ind.cora.graph"
    graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
    expected = next(f.checksum for f in CATALOGUE["Cora"].files if f.name == "ind.cora.graph").split(":")[1]
    mismatch = rf"ind.cora.graph: sha256 mismatch: expected {expected}, got [0-9a-f]{{64}}"
    with pytest.raises(DownloadError, match=mismatch):
        fetch(fetch_cfg("Cora", tmp_path, server))
    raw = tmp_path / "data" / "Cora" / "raw"
    assert (raw / "ind.cora.x").exists()
    assert not (raw / "ind.cora.graph").exists() and not part_path(raw / "ind.cora.graph").exists()
    assert not (tmp_path / "data" / "Cora" / "Cora.strata").exists()


def check_node_store(store: Store, a: dict, labels: np.ndarray) -> None:
    assert store.num_nodes == a["num_nodes"]
    got = np.asarray(store.edges("train"))
    assert np.array_equal(got[np.lexsort(got.T[::-1])], a["edges"][np.lexsort(a["edges"].T[::-1])])
    assert np.array_equal(store.features, a["features"])
    assert np.array_equal(store.labels, labels)
    for split in ("train", "valid", "test"):
        assert np.array_equal(np.sort(store.node_split(split)), a[split])


def test_ogb_csv_layout_round_trips(tmp_path, server):
    a = ogb_arrays()
    ogb_csv_zip(server.root / "ogbn-arxiv" / "arxiv.zip", "arxiv", "time", a)
    result = fetch(fetch_cfg("ogbn-arxiv", tmp_path, server, keep_archives=False))
    check_node_store(Store(result.store), a, a["labels"])
    # OGB ships ogbn-arxiv directed (add_inverse_edge False): the CSR holds each edge once.
    assert result.summary["num_topology_edges"] == len(a["edges"])
    raw = tmp_path / "data" / "ogbn-arxiv" / "raw"
    assert not (raw / "arxiv.zip").exists() and (raw / "arxiv" / "split" / "time" / "test.csv.gz").exists()
    assert not list(result.store.parent.glob(".ogbn-arxiv-staging-*"))
    fetch(fetch_cfg("ogbn-arxiv", tmp_path, server, keep_archives=False, overwrite=True, symmetrize=True))
    assert len(server.requests) == 1


@pytest.mark.parametrize("compressed", [True, False])
def test_ogb_npz_layout_round_trips_with_missing_labels(tmp_path, server, compressed):
    a = ogb_arrays(num_nodes=60, num_edges=200, dim=3, seed=1)
    values = a["labels"].astype(np.float32)
    values[::5] = np.nan
    expected = np.where(np.isnan(values), -1, values).astype(np.int32)
    for s in ("train", "valid", "test"):
        a[s] = a[s][expected[a[s]] >= 0]
    ogb_npz_zip(server.root / "ogbn-papers100M" / "papers100M-bin.zip", "papers100M-bin", a, values, compressed)
    result = fetch(fetch_cfg("ogbn-papers100M", tmp_path, server))
    check_node_store(Store(result.store), a, expected)


def test_ogb_staging_in_small_chunks(tmp_path):
    a = ogb_arrays(num_nodes=50, num_edges=300, seed=2)
    archive = ogb_csv_zip(tmp_path / "products.zip", "products", "sales_ranking", a)
    extract(archive, tmp_path / "raw")
    staging = tmp_path / "staging"
    staging.mkdir()
    staged = ogb.stage(ogb.find_root(tmp_path / "raw"), staging, chunk_bytes=64)
    assert staged.layout == "rows" and staged.num_nodes == 50
    assert np.array_equal(np.load(staged.edges), a["edges"])
    assert np.array_equal(np.load(staged.features), a["features"])
    assert np.array_equal(np.load(staged.labels), a["labels"])
    assert np.array_equal(np.load(staged.splits["node_valid"]), a["valid"])


def test_ogb_edge_count_mismatch_is_an_input_error(tmp_path):
    a = ogb_arrays()
    archive = ogb_csv_zip(tmp_path / "arxiv.zip", "arxiv", "time", a)
    extract(archive, tmp_path / "raw")
    (tmp_path / "raw" / "arxiv" / "raw" / "num-edge-list.csv.gz").write_bytes(gz(b"999\n"))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(InputError, match=r"edge.csv.gz: expected shape \(999, 2\)"):
        ogb.stage(ogb.find_root(tmp_path / "raw"), staging, chunk_bytes=1 << 20)


def test_snap_text_gz_stays_compressed_and_is_symmetrized(tmp_path, server):
    edges = [(0, 1), (0, 2), (1, 2), (2, 5), (3, 4)]
    text = b"# Undirected graph\n# Nodes: 6 Edges: 5\n# FromNodeId\tToNodeId\n"
    text += b"".join(b"%d\t%d\n" % e for e in edges)
    name = CATALOGUE["com-friendster"].files[0].name
    (server.root / "com-friendster").mkdir()
    (server.root / "com-friendster" / name).write_bytes(gz(text))
    result = fetch(fetch_cfg("com-friendster", tmp_path, server))
    kept = tmp_path / "data" / "com-friendster" / "raw" / name
    assert gzip.decompress(kept.read_bytes()) == text
    store = Store(result.store)
    assert store.num_nodes == 6 and store.num_edges == {"train": 5}
    assert result.summary["num_topology_edges"] == 10
    indptr, indices = store.csr()
    assert sorted(indices[indptr[2] : indptr[3]].tolist()) == [0, 1, 5]


def test_an_out_holding_something_else_is_refused_before_downloading(tmp_path, server):
    """It said "Store X already exists; --overwrite rebuilds it" and exited 0, for a store of
    another graph and for a plain file alike: a script went on with the wrong graph."""
    edges = b"0\t1\n1\t2\n"
    name = CATALOGUE["com-friendster"].files[0].name
    (server.root / "com-friendster").mkdir()
    (server.root / "com-friendster" / name).write_bytes(gz(edges))
    np.save(tmp_path / "e.npy", np.array([[0, 1]]))
    run_strata("convert", tmp_path / "e.npy", "--out", tmp_path / "other.strata", "-q")
    (tmp_path / "afile").write_text("x")
    for out, needle in [
        ("other.strata", "is the store of 'other', not of com-friendster: choose another --out, or --overwrite"),
        ("afile", "exists and is not a store to keep or replace (store "),
    ]:
        with pytest.raises(ConfigError, match=re.escape(needle)):
            fetch(fetch_cfg("com-friendster", tmp_path, server, out=tmp_path / out))
        assert server.requests == [] and not (tmp_path / "data" / "com-friendster").exists()
    # Its own store is kept; another's is replaced when asked.
    first = fetch(fetch_cfg("com-friendster", tmp_path, server))
    again = fetch(fetch_cfg("com-friendster", tmp_path, server))
    assert again.summary is None and again.store == first.store and "already exists" in again.describe()
    replaced = fetch(fetch_cfg("com-friendster", tmp_path, server, out=tmp_path / "other.strata", overwrite=True))
    assert Store(replaced.store).name == "com-friendster"


def test_freebase_layout_uses_integer_ids_and_counts(tmp_path, server):
    triples = {"train": [(0, 1, 0), (1, 2, 1), (2, 0, 1)], "valid": [(0, 2, 0)], "test": [(1, 0, 1)]}
    members = {f"Freebase/{s}.txt": b"".join(b"%d\t%d\t%d\n" % t for t in rows) for s, rows in triples.items()}
    members["Freebase/entity2id.txt"] = b"5\n/m/a\t0\n/m/b\t1\n/m/c\t2\n/m/d\t3\n/m/e\t4\n"
    members["Freebase/relation2id.txt"] = b"3\n/r/x\t0\n/r/y\t1\n/r/z\t2\n"
    write_zip(server.root / "Freebase86m" / "Freebase.zip", members)
    store = Store(fetch(fetch_cfg("Freebase86m", tmp_path, server)).store)
    assert store.num_nodes == 5 and store.num_relations == 3
    assert store.num_edges == {"train": 3, "valid": 1, "test": 1}
    # DGL-KE's Freebase files are "head tail relation": the store holds (src, rel, dst).
    assert sorted(map(tuple, np.asarray(store.edges("train")).tolist())) == [(0, 0, 1), (1, 1, 2), (2, 1, 0)]
