"""Filtered and sampled evaluation on a torch device (``device = torch-cpu``: the torch evaluator
behind the evaluator's ranker seam, on torch's CPU device) against the Rust evaluator: the same
queries, candidates, filters and tie rule, so MRR, MR, Hits@k and the per-direction MRRs are
equal, for every model the device scores, filtered and sampled, with and without reciprocal
relations; a run trained on either engine evaluates on either device.

Exact equality holds where no candidate scores within float rounding of its answer (the two
sides compute the same products in different orders). The tables here are trained from random
normal rows (``init_scale`` 0.1) on a generated graph, so no two nodes share a row and no score
ties its answer's exactly; a tie at the last bit would still count half on both sides, but which
side of it a rounding falls could differ, so the data avoids them rather than the test
tolerating them.

Where torch sees a GPU the parity tests run on ``cuda`` too (``gpu_devices``), with the same
exact equality: the evaluator's products there are full float32 as well (torch's default, TF32
off; a TF32 product's 10-bit mantissa would move scores by about 1e-3 and reorder near
candidates), so CUDA differs from the Rust evaluator only in the order of its sums, as the CPU
twin does."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import gpu_devices, run_strata  # noqa: E402
from strata.config import EmbedTrainConfig  # noqa: E402
from strata.embed import Run, train  # noqa: E402

BASE = dict(
    epochs=1, dim=16, chunk_size=200, negatives=64, threads=1, seed=3, eval_every=0, tensorboard=False,
    init_scale=0.1, partitions=2, memory="256M", eval_negatives=50,
)  # fmt: skip

#: The CPU twin, and the GPU where torch sees one.
DEVICES = gpu_devices("torch-cpu")

MODELS = {
    "dot": dict(model="dot"),
    "distmult": dict(model="distmult"),
    "complex": dict(model="complex"),
    "transe-l2": dict(model="transe"),
    "transe-l1": dict(model="transe", transe_norm=1, loss="margin", margin=1.0),
    "rotate": dict(model="rotate", loss="logistic", gamma=6.0),
    # PyTorch-BigGraph's operators and comparators that score heads through a reversed row.
    "pbg-none-cos": dict(model="pbg"),
    "pbg-linear-dot": dict(model="pbg", operator="linear", comparator="dot"),
    "pbg-translation-l2": dict(model="pbg", operator="translation", comparator="l2", loss="margin", margin=1.0),
}


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    """A small generated knowledge graph (200 entities, 8 relations, 4,000 triples)."""
    d = tmp_path_factory.mktemp("kg")
    run_strata("generate", "kg", "--out", d / "raw", "--entities", "200", "--relations", "8", "--triples", "4000", "-q")
    run_strata("convert", d / "raw", "--relations", "--out", d / "kg.strata", "-q")
    return d / "kg.strata"


@pytest.fixture(scope="module")
def runs(kg, tmp_path_factory):
    """Runs trained on the CPU engine, one per (model, reciprocal), made when first asked."""
    made: dict = {}

    def get(model: str, reciprocal: bool) -> Run:
        key = (model, reciprocal)
        if key not in made:
            d = tmp_path_factory.mktemp(f"{model}-{reciprocal}")
            made[key] = train(EmbedTrainConfig(store=kg, run_dir=d, reciprocal=reciprocal, **{**BASE, **MODELS[model]}))
        return made[key]

    return get


def metrics(result: dict) -> dict:
    """The ranking figures of an evaluation, without its time."""
    return {k: v for k, v in result["metrics"].items() if k != "seconds"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("protocol", ["filtered", "sampled"])
@pytest.mark.parametrize("reciprocal", [True, False], ids=["reciprocal", "reversed"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_device_ranks_equal_the_rust_evaluators(runs, model, reciprocal, protocol, device):
    run = runs(model, reciprocal)
    # eval_negatives 50 with chunk_size 200: the sampled protocol's 100 candidates per batch
    # repeat nodes and answers, so its exclusions (an answer drawn as its own candidate) occur.
    cpu = run.evaluate("test", protocol=protocol, device="cpu")
    dev = run.evaluate("test", protocol=protocol, device=device)
    assert metrics(dev) == metrics(cpu)
    assert cpu["metrics"]["queries"] > 0 and cpu["metrics"]["head_mrr"] is not None
    assert cpu["metrics"]["mrr"] > 1 / 200, cpu  # trained: better than a random ranking


@pytest.mark.parametrize("device", DEVICES)
def test_validation_and_test_on_the_device_equal_the_rust_evaluator(kg, tmp_path, device):
    """A run trained on the device validates each epoch and tests its best checkpoint there;
    the CPU evaluator gives the same figures for the same checkpoints."""
    run = train(EmbedTrainConfig(store=kg, run_dir=tmp_path / "run", device=device,
                                 **{**BASE, "epochs": 2, "eval_every": 1, "model": "complex"}))  # fmt: skip
    last = run.history[-1]["valid"]
    again = run.evaluate("valid", checkpoint="last", device="cpu")["metrics"]
    assert {k: v for k, v in last.items() if k != "seconds"} == {k: v for k, v in again.items() if k != "seconds"}
    tested = run.evaluate("test", checkpoint="best", device="cpu")["metrics"]
    assert {k: v for k, v in run.test.items() if k != "seconds"} == {k: v for k, v in tested.items() if k != "seconds"}


def test_embed_eval_device_option(runs, strata_cli):
    run = runs("complex", True)

    def cli(*extra):
        proc = strata_cli("embed", "eval", run.path, "--json", "--split", "test", *extra, check=False)
        return proc

    on_cpu, on_device = cli(), cli("--device", "torch-cpu")
    assert on_device.returncode == 0, on_device.stderr
    assert metrics(json.loads(on_device.stdout)) == metrics(json.loads(on_cpu.stdout))
    bad = cli("--device", "tpu")
    assert bad.returncode == 2 and "embed.eval.device" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    if not torch.cuda.is_available():
        proc = cli("--device", "cuda")
        assert proc.returncode == 2 and "CUDA is not available" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_device_run_predicts_and_scores_on_the_cpu_engine(kg, tmp_path, strata_cli):
    """One run format: a run trained on the device predicts and scores triples through the CPU
    engine with the table it exported (the evaluation and resume are in test_embed_device.py)."""
    run = train(EmbedTrainConfig(store=kg, run_dir=tmp_path / "run", device="torch-cpu",
                                 **{**BASE, "model": "distmult"}))  # fmt: skip
    run.export(tmp_path / "npy")
    emb = np.load(tmp_path / "npy" / "embeddings.npy")
    rel = np.load(tmp_path / "npy" / "relations.npy")
    names = (tmp_path / "npy" / "node_names.txt").read_text().split("\n")
    rel_names = (tmp_path / "npy" / "relation_names.txt").read_text().split("\n")
    top = json.loads(strata_cli("embed", "predict", run.path, "--head", names[0], "--relation", rel_names[0],
                                "--top", "5", "--json").stdout)["predictions"]  # fmt: skip
    expected = emb @ (emb[0] * rel[0])
    best = np.argsort(-expected, kind="stable")[:5]
    assert [p["node"] for p in top] == best.tolist()
    assert [p["score"] for p in top] == pytest.approx(expected[best].tolist(), rel=1e-5)
    triples = tmp_path / "triples.tsv"
    triples.write_text("".join(f"{names[h]}\t{rel_names[1]}\t{names[t]}\n" for h, t in [(1, 2), (3, 4)]))
    out = strata_cli("embed", "score", run.path, triples).stdout.strip().split("\n")
    scores = [float(line.split("\t")[3]) for line in out]
    assert scores == pytest.approx([float(emb[h] @ (emb[t] * rel[1])) for h, t in [(1, 2), (3, 4)]], rel=1e-5)


def test_excluded_candidates_come_over_as_unsigned_32_bit_rows():
    """``RankJob``'s excluded counts and rows are u32: read as int32 for the copy, they keep
    their values past 2^31 (a partition's rows may run that far)."""
    from strata.embed.device import evaluate

    values = np.array([0, 7, 2**31 - 1, 2**31, 2**32 - 1], dtype="<u4")
    got = evaluate._u32(memoryview(values.tobytes()), torch.device("cpu"))
    assert got.dtype == torch.int64 and got.tolist() == values.astype(np.int64).tolist()
