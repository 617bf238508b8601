"""A batch's sample with every tensor's size a bound known before the batch is drawn, so that on
a GPU the whole batch is one CUDA graph, replayed: the host dispatches no op per hop and waits
for the device once, for the batch's sizes, at the end.

For uniform fanouts (the weighted and whole-neighbourhood choices size their work by the
frontier's in-edges). Hop ``h``'s frontier, every node reached so far, has at most ``C_h``
nodes: ``C_0`` the batch's capacity (its seeds' count rounded up to a power of two, one graph
per capacity) and ``C_{h+1} = min(C_h (1 + k_h), nodes)``. Slots past the live count hold the
local-id map's spare id and choose no edge. The steps are :class:`~.sampler.DeviceSampler`'s own
(its choice, :func:`~.relabel.relabel_into`) over those slots, so a batch equals the Rust
sampler's bit for bit (tested on the CPU twin, where the same steps run op by op).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from ... import _native
from ...device import rng
from ...device.capture import capturing, replay
from .relabel import relabel_into


@dataclass
class Drawn:
    """A drawn batch in bounded buffers: ``nodes`` (global ids, the live ones first), ``sizes``
    (int64: the nodes reached after hops ``0..H``, then each hop's kept edges) and per hop
    ``(indptr, indices, dst)`` (front-packed; ``dst`` each edge slot's destination row). All
    are views of ``flat``, one buffer of ``lengths`` parts, so that a replayed graph's outputs
    go to the batch in one copy (:meth:`copy`)."""

    nodes: torch.Tensor
    sizes: torch.Tensor
    blocks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    flat: torch.Tensor
    lengths: tuple[int, ...]

    @staticmethod
    def packed(nodes: torch.Tensor, sizes: torch.Tensor, blocks: list[tuple]) -> Drawn:
        """The draw's outputs packed into one buffer (one op), as views of it."""
        parts = [nodes, sizes, *(t for block in blocks for t in block)]
        return Drawn.of(torch.cat(parts), tuple(p.numel() for p in parts))

    @staticmethod
    def of(flat: torch.Tensor, lengths: tuple[int, ...]) -> Drawn:
        """The outputs whose parts ``flat`` packs (:meth:`packed`)."""
        nodes, sizes, *rest = flat.split(lengths)
        blocks = [tuple(rest[i : i + 3]) for i in range(0, len(rest), 3)]
        return Drawn(nodes, sizes, blocks, flat, lengths)

    def copy(self) -> Drawn:
        """The outputs in a buffer of their own (one copy), which the next replay leaves as is."""
        return Drawn.of(self.flat.clone(), self.lengths)


class BoundedBatch:
    """The inputs of one capacity's batches (seeds, their count, the hops' keys) and, on
    ``cuda``, the CUDA graph that draws from them, captured at its first batch."""

    def __init__(self, sampler, capacity: int):
        self.sampler = sampler
        nodes = sampler.topology.num_nodes
        self.caps = [capacity]
        for k in sampler.fanouts:
            self.caps.append(min(self.caps[-1] * (1 + k), max(nodes, capacity)))
        device = sampler.device
        self.spare = sampler._local.numel() - 1
        self.seeds = torch.full((capacity,), self.spare, dtype=torch.int64, device=device)
        self.count = torch.zeros(1, dtype=torch.int64, device=device)
        self.keys = torch.zeros(len(sampler.fanouts), dtype=torch.int64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Drawn | None = None
        # A started batch's sizes on their way to the host (page-locked, copied as its draw
        # ends, on ``cuda``), and whether its buffers hold a batch not yet finished.
        sizes = 2 * len(sampler.fanouts) + 1
        self.sizes_out = torch.empty(sizes, dtype=torch.int64, pin_memory=True) if device.type == "cuda" else None
        self.sizes_ready = None
        self.under_way = False

    def start(self, seeds: torch.Tensor, batch_seed: int, graphs: bool) -> Drawn:
        """Draws the batch of ``seeds`` (:meth:`load`, :meth:`run`) and, on ``cuda``, starts
        copying its sizes out; the buffers are the batch's until :meth:`abandon`."""
        if self.under_way:
            raise RuntimeError("sampler: a bounded batch was started again before it was finished")
        self.load(seeds, batch_seed)
        drawn = self.run(graphs)
        self.under_way = True
        if self.sizes_out is not None:
            self.sizes_out.copy_(drawn.sizes, non_blocking=True)
            self.sizes_ready = torch.cuda.Event()
            self.sizes_ready.record()
        return drawn

    def sizes(self, drawn: Drawn) -> list[int]:
        """The started batch's sizes (``Drawn.sizes``), waiting for its draw to end."""
        if self.sizes_ready is None:
            return drawn.sizes.tolist()
        self.sizes_ready.synchronize()
        return self.sizes_out.tolist()

    def abandon(self) -> None:
        """The started batch is done with (finished, its outputs copied, or given up): the
        buffers take the next draw."""
        self.under_way = False
        self.sizes_ready = None

    def load(self, seeds: torch.Tensor, batch_seed: int) -> None:
        """Sets the inputs: ``seeds`` (distinct int64 ids on the device, at most the capacity)
        and the hops' keys of the batch's ``batch_seed``."""
        m = seeds.numel()
        self.seeds[:m].copy_(seeds)
        self.seeds[m:].fill_(self.spare)
        self.count.fill_(m)
        for hop in range(len(self.keys)):
            self.keys[hop].fill_(rng.as_i64(_native.rng_derive(batch_seed, hop)))

    def run(self, graphs: bool) -> Drawn:
        """The batch of the loaded inputs: the graph replayed on ``cuda`` (captured first; with
        ``graphs``), else drawn op by op. A graph's buffers are rewritten by its next replay."""
        if graphs and self.graph is None and self.capturable():
            self._capture()
        if self.graph is not None:
            replay(self.graph)
            self.sampler.counts["replayed"] += 1
            return self.out
        self.sampler.counts["op_by_op"] += 1
        try:
            return self.draw()
        except BaseException:
            self.sampler._local.fill_(-1)  # the map stays clean for the next batch
            raise

    def capturable(self) -> bool:
        """Whether the batch can be a CUDA graph: on ``cuda``."""
        return self.seeds.is_cuda

    def draw(self) -> Drawn:
        """The batch as device ops only (no value read back, no size the device decides); the
        local-id map is clean again at the end."""
        sampler, local, device = self.sampler, self.sampler._local, self.seeds.device
        nodes = torch.full((self.caps[-1] + 1,), self.spare, dtype=torch.int64, device=device)
        nodes[: self.caps[0]] = self.seeds
        local.index_put_((self.seeds,), torch.arange(self.caps[0], device=device))
        live, reached, kept, blocks = self.count, [self.count], [], []
        for hop, fanout in enumerate(sampler.fanouts):
            cap = self.caps[hop]
            alive = torch.arange(cap, device=device) < live
            ids = torch.where(alive, nodes[:cap], 0)
            keys = rng.derive_each(self.keys[hop : hop + 1], ids)
            counts, sources, valid = sampler._choose(ids, keys, fanout, alive)
            new, indices, edges = relabel_into(local, sources, valid, live, nodes, live)
            indptr = torch.zeros(cap + 1, dtype=torch.int64, device=device)
            torch.cumsum(counts, 0, out=indptr[1:])
            # Edge slot e's destination: the row whose span of indptr holds it (spare slots
            # choose no edge, so indptr never falls: the kept edges' rows are the live ones).
            slots = torch.arange(indices.numel(), device=device)
            dst = torch.searchsorted(indptr[1:], slots, right=True)
            blocks.append((indptr, indices, dst))
            live = live + new
            reached.append(live)
            kept.append(edges)
        # index_fill_, not ``local[nodes] = -1``: torch makes that scalar a host tensor and
        # copies it to the device, which a CUDA graph's capture refuses.
        local.index_fill_(0, nodes, -1)
        return Drawn.packed(nodes, torch.cat(reached + kept), blocks)

    def _capture(self) -> None:
        """Captures :meth:`draw` as a CUDA graph after one warm-up draw on a side stream (which
        compiles the Triton kernels and fills the allocator); a capture that fails leaves the
        batches op by op, as said once on stderr."""
        device = self.seeds.device
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                self.draw()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # The model trains on another thread meanwhile: its CUDA calls must neither fail
            # nor spoil this capture.
            with capturing(graph):
                out = self.draw()
        except Exception as e:
            self.sampler._local.fill_(-1)
            self.sampler.graphs = False
            print(f"strata: sampling could not be captured as a CUDA graph ({type(e).__name__}: {e}); "
                  "batches are sampled op by op", file=sys.stderr)  # fmt: skip
            return
        self.graph, self.out = graph, out
        self.sampler.counts["captured"] += 1
