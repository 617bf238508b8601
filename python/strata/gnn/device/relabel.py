"""The Rust sampler's serial relabelling as device ops: a hop's sampled sources not yet in the
local-id map get the next local ids in order of first appearance.

No op here makes an output whose size only the device knows, and nothing is read back: the
counts come back as one-element tensors, so a caller that sizes its buffers by bounds (a batch
replayed as a CUDA graph) waits for nothing, and one that wants exact sizes reads them once.
"""

from __future__ import annotations

import torch

#: Added to a source's position to mark it in the local-id map while first appearances are
#: found: every marked value is below -1 and distinct.
FIRST_MARK = 1 << 62


def relabel_into(
    local: torch.Tensor,
    sources: torch.Tensor,
    valid: torch.Tensor | None,
    first_id: int | torch.Tensor,
    out: torch.Tensor,
    out_at: int | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Relabels the (``valid``) ``sources`` (int64 global ids) through ``local`` (int64, one
    entry per graph node and a spare last one, ``-1`` where a node has no local id yet): the
    ``r``-th fresh node in order of first appearance gets local id ``first_id + r`` and is
    written to ``out[out_at + r]`` (``out``'s last slot takes the writes to skip).

    Returns ``(new, indices, kept)``: ``new`` the number of fresh nodes (one-element tensor),
    ``indices`` the local ids of the valid sources in order, front-packed in a tensor of
    ``len(sources) + 1`` (all of ``local[sources]`` when ``valid`` is None), and ``kept`` the
    number of valid sources (one-element tensor; None when ``valid`` is None)."""
    size, dump = sources.numel(), local.numel() - 1
    fresh = local[sources] < 0
    if valid is not None:
        fresh &= valid
    # Each fresh node's first position, as the least of its positions made negative (below -1,
    # so it never reads as a local id) and taken by a scatter-min into the map itself.
    encoded = torch.arange(size, device=sources.device) - FIRST_MARK
    local.scatter_reduce_(0, sources, torch.where(fresh, encoded, torch.iinfo(torch.int64).max), "amin")
    first = fresh & (local[sources] == encoded)
    rank = torch.cumsum(first, 0)
    local.index_put_((torch.where(first, sources, dump),), rank + (first_id - 1))
    out.index_put_((torch.where(first, rank + (out_at - 1), out.numel() - 1),), sources)
    indices = local[sources]
    if valid is None:
        return rank[-1:], indices, None
    kept = torch.cumsum(valid, 0)
    packed = torch.empty(size + 1, dtype=torch.int64, device=sources.device)
    packed.index_put_((torch.where(valid, kept - 1, size),), indices)
    return rank[-1:], packed, kept[-1:]
