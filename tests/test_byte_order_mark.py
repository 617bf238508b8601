"""A UTF-8 byte order mark, which Windows editors and spreadsheet exports write first, opens
no name, triple or statement: an edge list, a config file, a neighbours query file and a file
of triples to score each read it as if it were not there. Kept, it made the first head of an
edge list a node of its own ("\\ufeffa" beside "a")."""

from __future__ import annotations

import json

BOM = "\ufeff"


def test_an_edge_list_config_and_query_files_read_past_a_byte_order_mark(tmp_path, strata_cli):
    raw = tmp_path / "raw"
    raw.mkdir()
    triples = [(f"e{i % 40}", f"r{i % 3}", f"e{(7 * i + 3) % 40}") for i in range(400)]
    lines = ["\t".join(t) for t in triples]
    (raw / "train.txt").write_text(BOM + "\n".join(lines) + "\n", encoding="utf-8")
    store = tmp_path / "kg.strata"
    strata_cli("convert", raw / "train.txt", "--relations", "--out", store, "-q")
    info = json.loads(strata_cli("info", store, "--json").stdout)
    assert info["graph"]["num_nodes"] == 40, info["graph"]

    config = tmp_path / "small.toml"
    config.write_text(BOM + "[embed.train]\ndim = 8\nepochs = 1\nchunk_size = 50\nnegatives = 16\n", encoding="utf-8")
    run = tmp_path / "run"
    meta = json.loads(
        strata_cli("embed", "train", store, "--run-dir", run, "--config", config, "-q", "--json-summary").stdout
    )
    assert meta["config"]["dim"] == 8, meta["config"]

    queries = tmp_path / "queries.txt"
    queries.write_text(BOM + "e0\ne1\n", encoding="utf-8")
    got = json.loads(strata_cli("embed", "neighbors", run, "--nodes-file", queries, "--top", "2", "--json").stdout)
    assert [q["name"] for q in got["results"]] == ["e0", "e1"], got

    scored = tmp_path / "score.txt"
    scored.write_text(BOM + lines[0] + "\n" + lines[1] + "\n", encoding="utf-8")
    out = strata_cli("embed", "score", run, scored, "-q").stdout.splitlines()
    assert [line.rsplit("\t", 1)[0] for line in out] == lines[:2], out
