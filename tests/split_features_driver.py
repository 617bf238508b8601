"""One rank of tests/test_gnn_features.py's two-process check of split features, without
torchrun: ``python split_features_driver.py STORE RANK WORLD PORT OUT``. Meets the other ranks at
a TCPStore on 127.0.0.1:PORT (rank 0 hosts it), opens STORE with its rows split, and writes to
OUT (JSON) what it checked: random id sets gathered (local and remote rows) against the store's
feature matrix, an epoch's batches against it, and the rank's plan."""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import numpy as np
import torch

from strata.gnn import features
from strata.gnn.loader import GnnData
from strata.store import Store


def main(store: str, rank: int, world: int, port: int, out: str) -> None:
    tcp = torch.distributed.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=60))
    features.start_rpc(rank, world, tcp, 60)
    data = GnnData(store, split=(rank, world), fanouts=[5, 5], batch_size=32, memory="256M")
    truth = torch.from_numpy(np.array(Store(store).features))
    n = data.num_nodes
    start, end = features.owned_range(n, rank, world)
    rng = np.random.default_rng(rank)
    id_sets = [
        rng.integers(0, n, 500),  # every owner, repeats
        rng.permutation(n)[:300],  # distinct
        np.arange(start, end)[:50],  # own rows only
        np.concatenate([np.arange(0, start), np.arange(end, n)])[:50],  # others' rows only
        np.array([n - 1, 0, n - 1, 0]),  # the extremes, twice
        np.empty(0, dtype=np.int64),
    ]
    gathered = [bool(torch.equal(data.split.gather(ids), truth[torch.from_numpy(ids).long()])) for ids in id_sets]
    batches = [
        bool(torch.equal(b.x, truth[b.nodes])) for b in data.loader(np.arange(n)[rank::world], shuffle=True, epoch=1)
    ]
    result = {
        "gathered": gathered,
        "batches": batches,
        "owned": [start, end],
        "plan": data.plan,
        "remote": data.split.stats(),
    }
    features.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    store, rank, world, port, out = sys.argv[1:]
    main(store, int(rank), int(world), int(port), out)
