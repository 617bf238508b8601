"""The native loader's epoch order and batch keys (``strata_gnn::pipeline``), on torch, so the
device path cuts and keys an epoch's batches exactly as the native path does."""

from __future__ import annotations

import numpy as np
import torch

from ... import _native
from ...device import rng

#: ``strata_gnn::pipeline``'s domain separators of the shuffle and the batch keys.
SHUFFLE_STREAM = 0x5348_5546_4C45
BATCH_STREAM = 0x0042_4154_4348


def batch_key(epoch: int, index: int) -> int:
    """``strata_gnn::pipeline::batch_key``: the sampler's key of batch ``index`` of ``epoch``."""
    return _native.rng_derive(_native.rng_derive(BATCH_STREAM, epoch), index)


def epoch_order(items: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """``items`` in the native loader's order for ``epoch``: its Fisher-Yates shuffle over the
    stream ``derive(derive(seed, SHUFFLE_STREAM), epoch)``, draw ``p`` swapping position ``n - 1
    - p`` with ``below(n - p)``."""
    n = len(items)
    out = np.array(items, dtype=np.int64, copy=True)
    if n < 2:
        return out
    key = rng.derive(rng.derive(seed, SHUFFLE_STREAM), epoch)
    i = torch.arange(n - 1, 0, -1)
    j = rng.below(rng.draw(key, torch.arange(n - 1)), i + 1).tolist()
    values = out.tolist()
    for a, b in zip(i.tolist(), j, strict=True):
        values[a], values[b] = values[b], values[a]
    return np.asarray(values, dtype=np.int64)
