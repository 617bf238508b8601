"""benches/bench_recipes.py on a tiny generated graph with two tiny recipes: the cheaper
(negative sampling) runs first, each recipe records its curve, times, load and test metrics
beside the published figure, the table lands in the markdown section; a run the bench left
unrecorded (as a killed bench leaves it) is resumed by the next call, not started over, and a
finished recipe is skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import run_strata

BENCH = Path(__file__).resolve().parents[1] / "benches" / "bench_recipes.py"

RECIPE = """[embed.train]
model = "{model}"
dim = 16
chunk_size = 200
lr = 0.2
epochs = 3
eval_every = 1
threads = 1
memory = "256M"
{extra}
"""


def bench_cmd(tmp_path: Path, *args: str) -> list[str]:
    cmd = [sys.executable, BENCH, "--out", tmp_path / "out", "--datasets", tmp_path / "data"]
    return [*map(str, [*cmd, "--recipes", tmp_path / "recipes", "--doc", tmp_path / "bench.md", *args])]


def bench(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(bench_cmd(tmp_path, *args), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def tiny_recipes(tmp_path: Path) -> None:
    """A tiny generated graph and two recipes for it, where bench_cmd looks for them."""
    (tmp_path / "data").mkdir()
    run_strata("generate", "kg", "--out", tmp_path / "data" / "tiny", "--entities", "120", "--relations", "3",
               "--triples", "2400", "-q")  # fmt: skip
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "complex-tiny.toml").write_text(RECIPE.format(model="complex", extra="negatives = 32"))
    (recipes / "distmult-tiny.toml").write_text(RECIPE.format(model="distmult", extra='training = "1vsAll"'))


def test_the_recipe_table_runs_cheapest_first_resumes_and_skips_what_finished(tmp_path):
    tiny_recipes(tmp_path)
    bench(tmp_path, "--max-epochs", "1")
    out = tmp_path / "out"
    result = json.loads((out / "recipes.json").read_text())
    # 1vsAll scores all 120 entities per query, negative sampling 32 shared negatives.
    assert result["order"] == ["complex-tiny", "distmult-tiny"]
    for name in result["order"]:
        r = result["recipes"][name]
        assert r["status"] == "epoch cap" and r["epochs"] == 1 and len(r["curve"]) == 1
        assert 0 < r["test"]["mrr"] <= 1 and r["train_seconds"] > 0 and len(r["load"]) == 1
    assert result["recipes"]["distmult-tiny"]["training"] == "1vsAll"
    doc = (tmp_path / "bench.md").read_text()
    assert "<!-- embed-recipes:begin -->" in doc and "| complex-tiny | negative_sampling | 1 (1) | epoch cap |" in doc
    first = json.loads((out / "runs" / "complex-tiny" / "run.json").read_text())["history"]

    # A bench killed after the run committed its epoch but before it recorded the recipe; the
    # next calls run one recipe each, side by side on the same output folder.
    (out / "recipes.json").unlink()
    beside = subprocess.Popen(bench_cmd(tmp_path, "--only", "distmult-tiny", "--max-epochs", "2"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    bench(tmp_path, "--only", "complex-tiny")
    assert beside.wait(timeout=600) == 0, beside.stdout.read()[-3000:]
    result = json.loads((out / "recipes.json").read_text())
    r = result["recipes"]["complex-tiny"]
    assert r["status"] == "finished" and r["epochs"] == 3 and [e for e, _ in r["curve"]] == [1, 2, 3]
    # Neither call dropped the other's entry, and the table lists both recipes.
    assert result["recipes"]["distmult-tiny"]["epochs"] == 2
    assert result["order"] == ["complex-tiny", "distmult-tiny"]
    assert "| distmult-tiny | 1vsAll | 2 (" in (tmp_path / "bench.md").read_text()
    history = json.loads((out / "runs" / "complex-tiny" / "run.json").read_text())["history"]
    # Epoch 1 is the first call's, as it was (same loss and seconds): resumed, not redone.
    assert history[0] == first[0] and len(history) == 3

    stdout = bench(tmp_path, "--only", "complex-tiny")
    assert "complex-tiny: finished after 3 epochs, skipped" in stdout
    assert json.loads((out / "runs" / "complex-tiny" / "run.json").read_text())["history"] == history


def test_out_of_core_calls_train_on_partitions_into_a_table_of_their_own(tmp_path):
    tiny_recipes(tmp_path)
    for bad in (["--partitions", "4"], ["--buffer", "2"], ["--partitions", "1", "--buffer", "1"]):
        proc = subprocess.run(bench_cmd(tmp_path, *bad), capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "--partitions P (at least 2) and --buffer B go together" in proc.stderr
    bench(tmp_path, "--only", "complex-tiny", "--max-epochs", "1", "--partitions", "4", "--buffer", "3")
    meta = json.loads((tmp_path / "out" / "runs" / "complex-tiny" / "run.json").read_text())
    assert meta["partitioning"]["partitions"] == 4
    doc = (tmp_path / "bench.md").read_text()
    assert "<!-- embed-recipes-p4:begin -->" in doc and "<!-- embed-recipes:begin -->" not in doc
    assert "### Recipe table out of core (`--partitions 4 --buffer 3`)" in doc
    assert "| complex-tiny | negative_sampling | 1 (1) | epoch cap |" in doc
    assert "distmult-tiny" not in doc  # untrained out of core: not listed as queued


def test_the_recipes_early_stopping_can_be_overridden(tmp_path):
    """`--early-stopping-patience 0` trains a recipe that stops early (patience 1 here) to its
    epochs, as the GPU session's side by side at the 2-core run's epochs does."""
    tiny_recipes(tmp_path)
    patient = tmp_path / "recipes" / "complex-tiny.toml"
    patient.write_text(RECIPE.format(model="complex", extra="negatives = 32\nearly_stopping_patience = 1"))
    bench(tmp_path, "--only", "complex-tiny", "--early-stopping-patience", "0")
    meta = json.loads((tmp_path / "out" / "runs" / "complex-tiny" / "run.json").read_text())
    assert meta["config"]["early_stopping_patience"] == 0 and len(meta["history"]) == 3
