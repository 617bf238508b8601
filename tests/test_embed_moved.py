"""A store moved or copied with its embedding runs inside (or beside) them: every use of a run
finds the store where it lies now, and a copy uses its own store, not the original's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import needs, run_strata

TRAIN = ["--model", "distmult", "--dim", "8", "--chunk-size", "200", "--negatives", "16", "--threads", "1", "-q"]


def recorded_store(run: Path) -> str:
    return json.loads((run / "run.json").read_text())["store"]


def test_a_moved_store_keeps_its_runs_and_a_copy_trains_on_its_own_store(kg, tmp_path):
    store = tmp_path / "a" / "g.strata"
    shutil.copytree(kg, store)
    run_strata("embed", "train", store, "--epochs", "1", *TRAIN)
    triple = (kg.parent / "raw" / "train.txt").read_text().split("\n", 1)[0].split("\t")

    # Copied: both exist, and the copy's run resumes on the copy (it was "run ... belongs to
    # store <the original>, not <the copy>").
    copy = tmp_path / "b" / "g.strata"
    shutil.copytree(store.parent, copy.parent)
    run_strata("embed", "train", copy, "--epochs", "2", *TRAIN)
    assert recorded_store(copy / "runs" / "embed") == str(copy.resolve())
    assert recorded_store(store / "runs" / "embed") == str(store.resolve())

    # Moved: the recorded path is gone, and every use found nothing there (it was
    # "<the old path>: no such store").
    moved = tmp_path / "c"
    store.parent.rename(moved)
    store = moved / "g.strata"
    predicted = run_strata("embed", "predict", store, "--head", triple[0], "--relation", triple[1], "--json", "-q")
    assert len(json.loads(predicted.stdout)["predictions"]) == 10
    run_strata("embed", "eval", store, "--split", "valid", "-q")
    run_strata("embed", "train", store, "--epochs", "2", *TRAIN)
    assert recorded_store(store / "runs" / "embed") == str(store.resolve())


def test_a_run_beside_its_store_follows_the_directory_that_holds_both(kg, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(kg, data / "g.strata")
    run_strata("embed", "train", data / "g.strata", "--run-dir", data / "runs" / "r", "--epochs", "1", *TRAIN)
    moved = tmp_path / "elsewhere"
    data.rename(moved)
    run_strata("embed", "export", moved / "runs" / "r", "--out", tmp_path / "npy", "-q")
    assert json.loads((tmp_path / "npy" / "export.json").read_text())["store"] == str((moved / "g.strata").resolve())


def test_a_run_moved_away_from_its_store_names_the_store_it_trained_on(kg, tmp_path, strata_cli):
    store = tmp_path / "g.strata"
    shutil.copytree(kg, store)
    strata_cli("embed", "train", store, "--run-dir", tmp_path / "r", "--epochs", "1", *TRAIN)
    store.rename(tmp_path / "renamed.strata")
    (tmp_path / "r").rename(tmp_path / "moved")
    proc = strata_cli("embed", "eval", tmp_path / "moved", "-q", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"run {tmp_path / 'moved'} trained on store {store.resolve()}, which is no longer there" in proc.stderr


def test_an_index_moved_with_its_run_still_answers(kg, tmp_path):
    needs("usearch")
    store = tmp_path / "a" / "g.strata"
    shutil.copytree(kg, store)
    run_strata("embed", "train", store, "--epochs", "1", *TRAIN)
    run_strata("embed", "index", store, "--out", store / "index", "-q")
    node = (kg.parent / "raw" / "train.txt").read_text().split("\t", 1)[0]
    store.parent.rename(tmp_path / "b")
    store = tmp_path / "b" / "g.strata"
    # It was "index ... was built from run <the old path>".
    found = run_strata("embed", "neighbors", store, "--node", node, "--index", store / "index", "--json", "-q")
    assert len(json.loads(found.stdout)["results"][0]["neighbors"]) == 10


def test_a_run_copied_into_another_store_keeps_reading_its_own(kg, tmp_path):
    store = tmp_path / "a" / "g.strata"
    shutil.copytree(kg, store)
    run_strata("embed", "train", store, "--epochs", "1", *TRAIN)
    other = tmp_path / "b" / "other.strata"
    other.parent.mkdir()
    run_strata("generate", "kg", "--out", tmp_path / "raw", "--entities", "50", "--triples", "400", "-q")
    run_strata("convert", tmp_path / "raw", "--relations", "--out", other, "-q")
    shutil.copytree(store / "runs", other / "runs")
    # Its relative path leads to a store of another graph: the run keeps the one it trained on
    # (it was "store ... changed since run ... trained on it").
    run_strata("embed", "eval", other / "runs" / "embed", "--split", "valid", "-q")
