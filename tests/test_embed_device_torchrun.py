"""`strata embed train --device` under torchrun: each rank trains on its own device (the CPU
twin, ``torch-cpu``, on every rank here; ``cuda`` is ``cuda:LOCAL_RANK``, over NCCL) with the
distributed scheduler as it is, and rank 0 validates and tests on its device.

Two ranks take buckets by timing, so a two-rank run is not reproducible in floating point
(docs/distributed.md, "Determinism"), and the scheduler needs a buffer of two partitions, so a
one-bucket run that would be is not possible: the device run is checked as the Rust engine's
two-rank runs are (test_embed_dist.py): every bucket trained once an epoch, the commit chain,
and a test MRR far above a random ranking's.
"""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")

from conftest import run_strata
from strata.embed import Run
from strata.embed.train import rank_device
from strata.torchrun import Environment
from test_embed_dist import check_epochs
from torchrun_env import free_port, rank_env, run_session

OPTIONS = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--threads", "1", "--seed", "5",
           "--partitions", "4", "--negative-pool", "resident", "--epochs", "2", "--eval-every", "1",
           "--relation-sync-every", "2", "--dist-prefetch", "--model", "complex", "--dist-timeout", "120",
           "-q"]  # fmt: skip


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    """A small generated knowledge graph (200 entities, 8 relations, 4,000 triples)."""
    d = tmp_path_factory.mktemp("kg")
    run_strata("generate", "kg", "--out", d / "raw", "--entities", "200", "--relations", "8", "--triples", "4000", "-q")
    run_strata("convert", d / "raw", "--relations", "--out", d / "kg.strata", "-q")
    return d / "kg.strata"


def train_two_ranks(kg, run, *options: str):
    """``strata embed train`` in two ranks under torchrun on loopback, without restarts; the
    finished launch (killed whole past a generous bound)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        "-m", "strata", "embed", "train", str(kg), "--run-dir", str(run), *OPTIONS, *options,
    ]  # fmt: skip
    proc = run_session(cmd, rank_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((run / "run.json").read_text())


def test_two_ranks_train_validate_and_test_on_their_devices(kg, tmp_path):
    meta = train_two_ranks(kg, tmp_path / "run", "--device", "torch-cpu")
    assert meta["config"]["device"] == "torch-cpu"
    check_epochs(tmp_path / "run", 16)
    # Rank 0 validated each epoch and tested the best checkpoint on its device; the CPU
    # evaluator gives the same figures for the same checkpoint.
    assert all(h["valid"]["queries"] > 0 for h in meta["history"])
    tested = Run(tmp_path / "run").evaluate("test", checkpoint="best", device="cpu")["metrics"]
    assert {k: v for k, v in meta["test"].items() if k != "seconds"} == {
        k: v for k, v in tested.items() if k != "seconds"
    }
    # 200 candidates: a random ranking has an MRR near 0.03.
    assert meta["test"]["mrr"] > 0.08, meta["test"]


def test_a_rank_takes_its_local_gpu():
    env = Environment(rank=3, world_size=4, addr="127.0.0.1", port=1, local_rank=1)
    assert rank_device("cuda", env) == "cuda:1"
    assert rank_device("cuda:0", env) == "cuda:0" and rank_device("torch-cpu", env) == "torch-cpu"
    assert rank_device("cuda", None) == "cuda"
