"""`strata embed train|eval|predict|export` and `strata plot` end to end: through the CLI and the
Python API, in memory and out of core, with a kill -9 in the middle, and with bad inputs."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cli_in_process import strata_in_process
from conftest import needs
from strata.config import EmbedTrainConfig
from strata.embed import Run, train
from strata.errors import BudgetError, ConfigError, InputError, RunError

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_embed_train")

SMALL = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "-q"]


def test_train_in_memory_learns_and_writes_its_run(kg, tmp_path, strata_cli):
    run = tmp_path / "run"
    out = strata_cli("embed", "train", kg, "--run-dir", run, "--epochs", "3", *SMALL, "--json-summary").stdout
    meta = json.loads(out)
    assert meta["current"]["epoch"] == 3 and len(meta["history"]) == 3
    assert meta["partitioning"]["partitions"] == 1
    # 400 candidates: a random ranking has an MRR near 0.015.
    assert meta["test"]["mrr"] > 0.2, meta["test"]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]
    assert all(json.loads(line)["valid"]["protocol"] == "filtered" for line in lines)
    timeline = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    assert {iv["lane"] for iv in timeline} >= {"compute", "io"}
    assert sorted(p.name for p in run.glob("table-*.bin")) == ["table-0.bin", "table-1.bin", "table-2.bin"]


def test_out_of_core_training_under_a_small_budget(kg, tmp_path, strata_cli):
    run = tmp_path / "ooc"
    proc = strata_cli(
        "embed",
        "train",
        kg,
        "--run-dir",
        run,
        "--epochs",
        "2",
        "--partitions",
        "6",
        "--ordering",
        "legend",
        "--dim",
        "16",
        "--chunk-size",
        "200",
        "--negatives",
        "64",
    )
    assert "6 partitions on disk, 3 resident at a time" in proc.stderr
    assert "Theorem 3" in proc.stderr
    meta = Run(run).meta
    # run.json keeps the plan printed at start: 3 of the 6 partitions resident.
    table = meta["memory_plan"]["data"][0]
    assert meta["memory_plan"]["engine"] == "embed" and table["name"] == "embedding table"
    assert table["resident"] * 2 == table["bytes"]
    last = meta["history"][-1]
    assert last["swaps"] > 0 and last["partition_loads"] >= last["swaps"]
    assert last["partition_bytes_written"] >= 6 * meta["layout"]["rows"] * 16 * 2 * 4
    assert meta["test"]["mrr"] > 0.15


def test_python_api_train_evaluate_predict_export(kg, tmp_path):
    seen = []
    run = train(
        EmbedTrainConfig(store=kg, run_dir=tmp_path / "api", epochs=2, dim=16, chunk_size=200, negatives=64),
        on_epoch=seen.append,
    )
    assert [r["epoch"] for r in seen] == [1, 2]
    assert run.epochs == 2 and run.test["queries"] > 0
    m = run.evaluate("valid", protocol="sampled", max_queries=200)["metrics"]
    assert m["protocol"] == "sampled" and m["queries"] == 200 and 0 < m["mrr"] <= 1
    names = (kg / "..").resolve()
    head, rel, _ = (names / "raw" / "train.txt").read_text().splitlines()[0].split("\t")
    pred = run.predict(head=head, relation=rel, top=5)["predictions"]
    assert len(pred) == 5 and pred[0]["score"] >= pred[-1]["score"]
    assert run.predict(tail=head, relation=rel, top=3, exclude_known=True)["predictions"][0]["known"] is False


def test_export_is_in_node_id_order(kg, tmp_path, strata_cli):
    """Scores recomputed from the export with NumPy equal the ones `predict` reports, for a
    partitioned run (nodes are permuted across partitions, so a wrong order would not match)."""
    run = tmp_path / "exp"
    strata_cli(
        "embed",
        "train",
        kg,
        "--run-dir",
        run,
        "--epochs",
        "1",
        "--partitions",
        "4",
        "--buffer",
        "4",
        "--model",
        "distmult",
        *SMALL,
    )
    strata_cli("embed", "export", run, "--out", tmp_path / "npy", "-q")
    emb = np.load(tmp_path / "npy" / "embeddings.npy")
    rels = np.load(tmp_path / "npy" / "relations.npy")
    names = (tmp_path / "npy" / "node_names.txt").read_text().splitlines()
    rel_names = (tmp_path / "npy" / "relation_names.txt").read_text().splitlines()
    assert emb.shape == (400, 16) and len(names) == 400 and rels.shape == (16, 16)
    pred = json.loads(
        strata_cli(
            "embed", "predict", run, "--head", names[7], "--relation", rel_names[2], "--top", "3", "--json", "-q"
        ).stdout
    )["predictions"]
    scores = (emb[7] * rels[2]) @ emb.T
    for p in pred:
        assert names[p["node"]] == p["name"]
        assert scores[p["node"]] == pytest.approx(p["score"], rel=1e-4, abs=1e-5)
    assert [p["node"] for p in pred] == list(np.argsort(-scores, kind="stable")[:3])
    # A --top beyond the nodes is every node (it sized a heap: 10^11 aborted on 1.6 TB).
    every = strata_cli(
        "embed", "predict", run, "--head", names[7], "--relation", rel_names[2], "--top", str(10**11), "--json", "-q"
    )
    assert len(json.loads(every.stdout)["predictions"]) == 400
    strata_cli("embed", "export", run, "--out", tmp_path / "tsv", "--format", "tsv", "-q")
    first = (tmp_path / "tsv" / "embeddings.tsv").read_text().splitlines()[0].split("\t")
    assert first[0] == names[0] and np.allclose([float(x) for x in first[1:]], emb[0], rtol=1e-6)
    again = strata_cli("embed", "export", run, "--out", tmp_path / "tsv", check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    strata_cli("embed", "export", run, "--out", tmp_path / "tsv", "--overwrite", "-q")  # an earlier export
    # --overwrite never replaces what is not an export: the run itself, the store, a user's files.
    before = sorted(p.name for p in run.iterdir())
    for target in (run, kg):
        own = strata_cli("embed", "export", run, "--out", target, "--overwrite", check=False)
        assert own.returncode == 2 and "is not an earlier output of this command (no export.json)" in own.stderr
    assert sorted(p.name for p in run.iterdir()) == before and (kg / "manifest.json").is_file()


def test_a_one_bucket_run_reads_its_edges_once(kg, tmp_path):
    """A run of one partition keeps its one piece of edges between epochs: the second epoch
    reads none, and its table is bit for bit that of a run resumed after the first epoch, which
    reads them again (one thread is deterministic). The first run's table is written behind
    its validations, the resumed run's by its epochs (``write_behind = false``): the same
    bytes."""
    options = dict(store=kg, dim=16, chunk_size=200, negatives=64, threads=1, eval_every=1, tensorboard=False)
    whole = train(EmbedTrainConfig(run_dir=tmp_path / "whole", epochs=2, **options))
    first, second = whole.history
    assert first["edge_bytes_read"] > 0 and second["edge_bytes_read"] == 0
    assert all(h["written_behind"]["seconds"] > 0 for h in whole.history)
    # The copy is the table, in the plan the run recorded.
    plan = whole.meta["memory_plan"]
    copy = next(p for p in plan["parts"] if p["name"] == "write-behind copy")
    assert copy["bytes"] == next(d for d in plan["data"] if d["name"] == "embedding table")["bytes"]
    back = dict(options, write_behind=False)
    train(EmbedTrainConfig(run_dir=tmp_path / "resumed", epochs=1, **back))
    resumed = train(EmbedTrainConfig(run_dir=tmp_path / "resumed", epochs=2, **back))
    assert all("written_behind" not in h for h in resumed.history)
    assert resumed.history[-1]["edge_bytes_read"] == first["edge_bytes_read"]
    a = (tmp_path / "whole" / whole.meta["current"]["table"]).read_bytes()
    b = (tmp_path / "resumed" / resumed.meta["current"]["table"]).read_bytes()
    assert a == b and whole.history[-1]["loss"] == resumed.history[-1]["loss"]


def train_out_of_core_pair(store, tmp_path, option: str, epochs: int, **fixed) -> tuple[dict, dict]:
    """`store` trained out of core (5 partitions, a buffer of 3, one thread: deterministic) with
    `option` on and off (and the `fixed` options): the runs and their plans' parts by name, each
    keyed by the option's value, after checking that both runs swapped and trained the same
    table bit for bit."""
    options = dict(store=store, dim=16, chunk_size=200, negatives=64, threads=1, eval_every=0, tensorboard=False)
    options |= dict(epochs=epochs, partitions=5, buffer=3, ordering="beta") | fixed
    runs = {on: train(EmbedTrainConfig(run_dir=tmp_path / str(on), **{option: on}, **options)) for on in (True, False)}
    assert all(h["partition_loads"] > 0 for r in runs.values() for h in r.history)
    a, b = ((tmp_path / str(on) / runs[on].meta["current"]["table"]).read_bytes() for on in (True, False))
    assert a == b and runs[True].history[-1]["loss"] == runs[False].history[-1]["loss"]
    parts = {on: {p["name"]: p for p in r.meta["memory_plan"]["parts"]} for on, r in runs.items()}
    return runs, parts


def test_a_swap_spare_reads_ahead_and_trains_the_same_table(kg, tmp_path):
    """Out of core, the plan's swap spare holds the partition the next swap loads, read ahead
    as soon as the disk is free (the order fixes it in advance), so every swap hands it over
    at once and writes its victim behind; the table is bit for bit that of a run whose swaps
    write, then read."""
    runs, parts = train_out_of_core_pair(kg, tmp_path, "swap_spare", epochs=2, keep_partitions=False)
    assert parts[True]["swap spare"]["bytes"] > 0 and parts[False]["swap spare"]["bytes"] == 0
    for h in runs[True].history:
        assert h["loads_read_ahead"] == h["swaps"] > 0
    assert all(h["loads_read_ahead"] == 0 for h in runs[False].history)


@pytest.mark.parametrize(
    "eval_every,pool", [(0, "partition"), (1, "partition"), (0, "all")], ids=["training", "validating", "banks"]
)
def test_kept_partitions_train_the_same_table_and_later_epochs_load_from_memory(kg, tmp_path, eval_every, pool):
    """Out of core with room in the budget, the plan keeps every partition that leaves the
    buffer in memory: from the second epoch on, loads read nothing from the SSD, an epoch
    writes each partition once, and the table is bit for bit that of a run that reads its
    partitions every time (with validation between epochs, whose scan moves partitions through
    the slots too; with negative banks, whose blocks of the partitions outside the buffer are
    copied from the kept ones at each epoch's start)."""
    fixed = dict(eval_every=eval_every, negative_pool=pool, partitions=8, ordering="legend")
    runs, parts = train_out_of_core_pair(kg, tmp_path, "keep_partitions", epochs=3, **fixed)
    kept = parts[True]["partitions in memory"]
    assert kept["bytes"] == 5 * parts[True]["partition buffer"]["bytes"] // 3, kept
    assert "swap spare" not in parts[True] and "partitions in memory" not in parts[False]
    read = {k: [h["partition_bytes_read"] for h in r.history] for k, r in runs.items()}
    assert read[True][0] > 0 and read[True][1:] == [0, 0], read
    assert all(b > 0 for b in read[False]), read
    # Each partition is written once an epoch (at its last eviction, or by the epoch's end): a
    # partition the epoch loads again (Legend's order evicts some twice) stays in memory
    # meanwhile, where every eviction of the other run writes it.
    written = {k: [h["partition_bytes_written"] for h in r.history] for k, r in runs.items()}
    assert all(a < b for a, b in zip(written[True], written[False], strict=True)), written


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_kept_edges_train_the_same_table_and_later_epochs_read_only_partitions(kg, weighted_kg, tmp_path, weighted):
    """Out of core with room in the budget, the plan keeps the training edges (and their
    weights) in memory after the first epoch reads them: later epochs read no edge bytes from
    the SSD, and the table is bit for bit a run's that reads them every epoch."""
    runs, parts = train_out_of_core_pair(weighted_kg if weighted else kg, tmp_path, "keep_edges", epochs=3)
    edges = len([line for line in (kg.parent / "raw" / "train.txt").read_text().split("\n") if line])
    assert parts[True]["edges in memory"]["bytes"] == edges * (16 if weighted else 12)
    assert "edges in memory" not in parts[False]
    read = {k: [h["edge_bytes_read"] for h in r.history] for k, r in runs.items()}
    assert read[True][0] == read[False][0] == edges * (16 if weighted else 12), read
    assert read[True][1:] == [0, 0] and read[False][1:] == read[False][:1] * 2, read


def test_killed_run_resumes_to_the_same_result(kg, tmp_path):
    """kill -9 in the middle of an epoch: the run resumes from its last checkpoint and ends
    with exactly the table an uninterrupted run produces (one thread is deterministic). The
    epochs take milliseconds (partitions and edges stay in memory after the first): enough of
    them that the kill lands in the middle."""
    epochs = 40
    args = ["--epochs", str(epochs), "--threads", "1", "--partitions", "5", "--buffer", "3", "--ordering", "beta"]
    args += SMALL
    cmd = [sys.executable, "-m", "strata", "embed", "train", str(kg)]
    subprocess.run([*cmd, "--run-dir", str(tmp_path / "whole"), *args], check=True, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--run-dir", str(killed), *args], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if json.loads((killed / "run.json").read_text())["current"]["epoch"] >= 2:
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.01)
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = json.loads((killed / "run.json").read_text())["current"]["epoch"]
    assert 2 <= done < epochs, "kill the run in the middle"
    # The record still opens and its checkpoint files are whole.
    assert Run(killed).epochs == done
    subprocess.run([*cmd, "--run-dir", str(killed), *args], check=True, capture_output=True)
    whole, resumed = Run(tmp_path / "whole"), Run(killed)
    assert resumed.epochs == epochs and [h["epoch"] for h in resumed.history] == list(range(1, epochs + 1))
    metrics = [json.loads(line)["epoch"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert metrics == list(range(1, epochs + 1))
    a = (tmp_path / "whole" / whole.meta["current"]["table"]).read_bytes()
    b = (killed / resumed.meta["current"]["table"]).read_bytes()
    assert a == b, "the resumed run's table differs from the uninterrupted one"
    assert {**whole.test, "seconds": 0} == {**resumed.test, "seconds": 0}


def test_bad_inputs_are_refused_cleanly(kg, tmp_path, strata_cli, capsys):
    cli = strata_in_process(capsys)  # the commands after the first: in this process
    bad = strata_cli(
        "embed", "train", kg, "--run-dir", tmp_path / "r", "--model", "complex", "--dim", "15", check=False
    )
    assert bad.returncode == 2 and "embed.train.dim" in bad.stderr and "even" in bad.stderr
    assert not (tmp_path / "r").exists()
    small = cli("embed", "train", kg, "--run-dir", tmp_path / "r", "--memory", "32M", check=False)
    assert small.returncode == 2 and "memory budget 32.0 MiB cannot hold" in small.stderr
    with pytest.raises(BudgetError):
        train(store=kg, run_dir=tmp_path / "r2", memory="40M", partitions=2)
    notrun = tmp_path / "stuff"
    notrun.mkdir()
    (notrun / "keep.txt").write_text("mine")
    refused = cli("embed", "train", kg, "--run-dir", notrun, *SMALL, check=False)
    assert refused.returncode == 2 and "not a run directory" in refused.stderr
    grid_run = tmp_path / "grid-run"
    grid_run.mkdir()
    (grid_run / "run.json").write_text('{"format": "strata-grid-run"}')
    for target, what in ((grid_run, "another kind of run"), (kg, "a store")):
        other = cli("embed", "train", kg, "--run-dir", target, *SMALL, check=False)
        assert other.returncode == 2 and f"--run-dir {target} is {what}" in other.stderr, other.stderr
    assert (grid_run / "run.json").read_text() == '{"format": "strata-grid-run"}'
    assert (notrun / "keep.txt").read_text() == "mine"
    with pytest.raises(RunError, match="has no embedding run"):
        Run(kg)
    neither = cli("embed", "predict", kg, check=False)
    assert neither.returncode == 2 and "exactly one of --head and --tail" in neither.stderr
    with pytest.raises(ConfigError, match=r"embed\.train\.lr"):
        EmbedTrainConfig(store=kg, lr=0)
    cli("embed", "train", kg, "--run-dir", tmp_path / "ok", "--epochs", "1", *SMALL)
    unknown = cli("embed", "predict", tmp_path / "ok", "--head", "no-such-node", "--relation", "r0", check=False)
    assert unknown.returncode == 2 and "node 'no-such-node' is not in store" in unknown.stderr
    # Refused before the budget plan is shown.
    assert "embedding table" not in unknown.stdout + unknown.stderr
    other = cli("embed", "train", kg, "--run-dir", tmp_path / "ok", "--epochs", "2", "--dim", "8", "-q", check=False)
    assert other.returncode == 2 and "different embed.train.dim" in other.stderr
    # The run resolved auto to one partition; another count asked for was silently ignored.
    parts = cli("embed", "train", kg, "--run-dir", tmp_path / "ok", "--epochs", "2", "--partitions", "2", *SMALL,
                check=False)  # fmt: skip
    assert parts.returncode == 2 and "holds 1 partition(s), not the 2 asked for" in parts.stderr, parts.stderr
    # A job training the run holds its directory's flock: a second job is refused, and the
    # run is left as it was.
    before = (tmp_path / "ok" / "run.json").read_bytes()
    held = os.open(tmp_path / "ok", os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = cli("embed", "train", kg, "--run-dir", tmp_path / "ok", "--epochs", "2", *SMALL, check=False)
    finally:
        os.close(held)
    assert busy.returncode == 2 and "is being trained by another job" in busy.stderr
    assert (tmp_path / "ok" / "run.json").read_bytes() == before
    (tmp_path / "ok" / "run.json").write_text("{not json")
    broken = cli("embed", "eval", tmp_path / "ok", check=False)
    assert broken.returncode == 2 and "run.json: not a run record" in broken.stderr


def test_the_python_api_applies_keyword_overrides_and_leaves_a_missing_store_alone(kg, tmp_path):
    cfg = EmbedTrainConfig(store=kg, run_dir=tmp_path / "r", epochs=4, dim=8, chunk_size=200, negatives=16)
    assert train(cfg, epochs=1).epochs == 1
    absent = tmp_path / "absent.strata"
    with pytest.raises(InputError, match="no such store"):
        train(store=absent)
    assert not absent.exists()  # its default run directory, absent/runs/embed, was not made


def test_a_diverging_epoch_is_refused_and_the_run_resumes_from_its_last_checkpoint(kg, tmp_path, capsys):
    """A rate too large turns the loss into NaN: the epoch is not committed (serialised, its
    NaN would make run.json unreadable), the error says so, and the run goes on from epoch 1."""
    cli = strata_in_process(capsys)
    run = tmp_path / "run"
    cli("embed", "train", kg, "--run-dir", run, "--epochs", "1", *SMALL)
    diverged = cli("embed", "train", kg, "--run-dir", run, "--epochs", "2", "--lr", "1e30", *SMALL, check=False)
    assert diverged.returncode == 1, diverged.stderr
    assert "epoch 2: the loss is NaN: the training diverged at learning rate 1e30" in diverged.stderr
    assert "the run keeps its checkpoint of epoch 1" in diverged.stderr
    assert Run(run).epochs == 1 and len(Run(run).history) == 1
    cli("embed", "train", kg, "--run-dir", run, "--epochs", "2", *SMALL)
    assert Run(run).epochs == 2
    # A checkpoint whose relations hold a NaN is refused naming the file, not trained on.
    state = run / "relation_state-e2.npy"
    values = np.load(state)
    values.flat[3] = np.nan
    np.save(state, values)
    damaged = cli("embed", "train", kg, "--run-dir", run, "--epochs", "3", *SMALL, check=False)
    assert damaged.returncode == 2 and f"{state.name}: value 3 is NaN" in damaged.stderr, damaged.stderr


def test_plot_writes_pngs(kg, tmp_path, strata_cli):
    needs("matplotlib")
    run = tmp_path / "plot"
    strata_cli(
        "embed",
        "train",
        kg,
        "--run-dir",
        run,
        "--epochs",
        "2",
        "--partitions",
        "4",
        "--buffer",
        "2",
        "--ordering",
        "beta",
        *SMALL,
    )
    out = strata_cli("plot", run).stdout.split()
    assert sorted(Path(p).name for p in out) == ["loss.png", "metrics.png", "timeline.png"]
    for p in out:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A line being written when the plot reads is left out; a damaged line is named.
    timeline = run / "timeline.jsonl"
    lines = timeline.read_text().splitlines()
    timeline.write_text("\n".join(lines) + '\n{"epoch": 2, "st')
    assert len(strata_cli("plot", run).stdout.split()) == 3
    timeline.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    damaged = strata_cli("plot", run, check=False)
    assert damaged.returncode == 2 and "timeline.jsonl:2: not an interval" in damaged.stderr, damaged.stderr
    timeline.write_text("\n".join(lines) + "\n")
    assert len(strata_cli("plot", run, "--epoch", "1").stdout.split()) == 3
    beyond = strata_cli("plot", run, "--epoch", "3", check=False)  # drew no timeline, silently
    assert beyond.returncode != 0 and "--epoch 3: " in beyond.stderr and "committed epochs 1 to 2" in beyond.stderr


def test_tensorboard_events_when_installed(kg, tmp_path):
    needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = train(EmbedTrainConfig(store=kg, run_dir=tmp_path / "tb", epochs=2, dim=16, chunk_size=200, negatives=64))
    events = EventAccumulator(str(run.path))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2]
    assert events.Scalars("valid/mrr")[-1].value == pytest.approx(run.history[-1]["valid"]["mrr"], rel=1e-6)


def test_an_exception_in_on_epoch_stops_training_after_that_epoch(kg, tmp_path):
    """The hook's exception reaches the caller as itself, and the run stops at its next step:
    the epoch the hook saw stays committed, no later epoch trains."""

    class Stop(Exception):
        pass

    def stop(record: dict) -> None:
        raise Stop(f"enough after epoch {record['epoch']}")

    cfg = EmbedTrainConfig(store=kg, run_dir=tmp_path / "hook", epochs=4, dim=8, chunk_size=200, negatives=16)
    with pytest.raises(Stop, match="enough after epoch 1"):
        train(cfg, on_epoch=stop)
    assert Run(tmp_path / "hook").meta["current"]["epoch"] == 1
