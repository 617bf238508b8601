"""`strata embed train --device` under torchrun: each rank trains on its own device (the CPU
twin, ``torch-cpu``, on every rank here; ``cuda`` is ``cuda:LOCAL_RANK``, over NCCL) with the
distributed scheduler as it is, and rank 0 validates and tests on its device.

Two ranks take buckets by timing, so a two-rank run is not reproducible in floating point
(docs/distributed.md, "Determinism"), and the scheduler needs a buffer of two partitions, so a
one-bucket run that would be is not possible: the device run is checked as the Rust engine's
two-rank runs are (test_embed_dist.py): every bucket trained once an epoch, the commit chain,
and a test MRR far above a random ranking's. That the distributed epoch keeps the slots on the
device through the slot hooks is checked by the ranks themselves: each loads ``HELD_ONLY``,
which fails a piece whose partition or relation rows the backend did not hold (a piece that
would have to copy them in and back). The run draws negatives over every node, those of
partitions on disk from banks the ranks share, whose gradient rounds change the rows the
devices hold.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("torch")

from conftest import run_strata
from strata.embed import Run
from strata.embed.train import rank_device
from strata.torchrun import Environment
from test_embed_dist import check_epochs
from torchrun_env import free_port, rank_env, run_session

#: Imported by every process of the launch (``sitecustomize``): the device backend refuses to
#: train a piece with a table it does not hold.
HELD_ONLY = """
from strata.embed.device import backend

_ctx = backend.TorchCompute._ctx


def _held_only(self, c, staged, *bank):
    ctx = _ctx(self, c, staged, *bank)
    if staged:
        raise RuntimeError("a piece used a slot the slot hooks had not handed to the device")
    return ctx


backend.TorchCompute._ctx = _held_only
"""

OPTIONS = ["--dim", "16", "--chunk-size", "200", "--negatives", "64", "--threads", "1", "--seed", "5",
           "--partitions", "4", "--negative-pool", "all", "--bank-sync-every", "1", "--epochs", "2",
           "--eval-every", "1", "--relation-sync-every", "2", "--dist-prefetch", "--model", "complex",
           "--dist-timeout", "120", "-q"]  # fmt: skip


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    """A small generated knowledge graph (200 entities, 8 relations, 4,000 triples)."""
    d = tmp_path_factory.mktemp("kg")
    run_strata("generate", "kg", "--out", d / "raw", "--entities", "200", "--relations", "8", "--triples", "4000", "-q")
    run_strata("convert", d / "raw", "--relations", "--out", d / "kg.strata", "-q")
    return d / "kg.strata"


def train_two_ranks(kg, run, *options: str, env=None):
    """``strata embed train`` in two ranks under torchrun on loopback, without restarts; the
    finished launch (killed whole past a generous bound)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        "-m", "strata", "embed", "train", str(kg), "--run-dir", str(run), *OPTIONS, *options,
    ]  # fmt: skip
    proc = run_session(cmd, env or rank_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((run / "run.json").read_text())


def test_two_ranks_train_validate_and_test_on_their_devices(kg, tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HELD_ONLY)
    env = rank_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path / "site"), env.get("PYTHONPATH")) if p)
    meta = train_two_ranks(kg, tmp_path / "run", "--device", "torch-cpu", env=env)
    assert meta["config"]["device"] == "torch-cpu"
    banks = [part for part in meta["memory_plan"]["parts"] if part["name"] == "negative banks"]
    assert banks and banks[0]["bytes"] > 0, meta["memory_plan"]
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
