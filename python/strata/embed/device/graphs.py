"""CUDA graphs of the training step: a chunk's small kernels replayed as one launch.

A chunk at B1's settings (1,000 edges sharing 1,000 negatives, ComplEx, both sides) is about
130 kernels of a few microseconds each (``benches/bench_embed_step.py``). Issued one by one
from Python, the host takes milliseconds per chunk while the GPU idles between them. The step
reads no device value on the host (:func:`step.train_chunk`), so on ``cuda`` it is captured
once and replayed for every further chunk that would launch the same kernels on the same
memory; a chunk's inputs (its edges, weights and random streams, and its bucket's layout) are
copied into the graph's static tensors first.

A piece's chunks in a row of one size and one context are captured :data:`RUN` at a time, one
graph for the run: one replay, and one copy of the run's inputs, train them all. On an H200 the
host's work around a replay (the copies of a chunk's inputs and the launch, about 0.18 ms) was
as long as a chunk's kernels at B1's settings (0.23 ms), so a graph per chunk left the device
idle half the time; a run pays it once for :data:`RUN` chunks. The chunks left over (a piece's
last, shorter chunk; the tail of a row shorter than a run) replay graphs of one chunk.

A graph is keyed by everything its kernels bake in: the chunks' count and size, whether they are weighted,
the training context's settings and the device addresses and shapes of the tables it reads and
writes: the slot buffer, which holds every resident partition, and the relations. Where the
bucket's partitions sit in the buffer is a small tensor (``Ctx.layout``) that a replay copies
in, so one graph serves every bucket of a run. The first chunk of a key runs eagerly; the
second eagerly on the capture stream, so that CUDA's lazy setup for that stream (cuBLAS's
workspace among it) happens outside a capture; the third is captured and replayed. At most
:data:`CAPACITY` graphs are kept, the least recently used dropped first. They share one memory
pool: they replay one at a time on one stream and keep nothing between replays. Bernoulli
corruption, whose sides' sizes depend on the draws, always runs eagerly, as do featurized
entities, whose bags' sizes do, and everything after a capture fails (the run goes on, and says
so once).

On the CPU twin (``torch-cpu``) the same bookkeeping runs with a capture that records nothing:
a "replay" copies the chunk's inputs into the graph's static tensors and runs the step on them,
as the captured kernels read them. So CI covers everything but CUDA's capture itself: the
keys, the warm-up, the static inputs.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from strata.device import kernels
from strata.embed.device import step, vs_all

#: Graphs kept at once (each holds a chunk's intermediates: tens of MiB at B1's settings; a
#: run reuses one chunk's: what a chunk frees in a capture, the next chunk of it is given).
CAPACITY = 32
#: Chunks of one size and context that one graph captures and one replay trains.
RUN = 16


def chunk_runs(groups: list[int], bounds: list[int], longest: int) -> list[tuple[int, int]]:
    """A piece's chunks (chunk ``c``: context ``groups[c]``, edges ``bounds[c] .. bounds[c +
    1]``) as runs ``(first, end)`` in order: ``longest`` consecutive chunks of one context and
    one size wherever the piece has them, every other chunk alone (so a piece's tail adds no
    graph of its own length)."""
    runs, c = [], 0
    while c < len(groups):
        size, end = bounds[c + 1] - bounds[c], c + 1
        while end < len(groups) and end - c < longest and groups[end] == groups[c]:
            if bounds[end + 1] - bounds[end] != size:
                break
            end += 1
        runs += [(c, end)] if end - c == longest else [(i, i + 1) for i in range(c, end)]
        c = end
    return runs


def chunks_of(edges: torch.Tensor, weights, streams: torch.Tensor):
    """A run's chunks: ``(edges, weights, streams row)`` of each, the run's ``edges`` (and
    ``weights``) cut into ``len(streams)`` equal slices."""
    b = len(edges) // len(streams)
    for i in range(len(streams)):
        cut = slice(i * b, (i + 1) * b)
        yield edges[cut], None if weights is None else weights[cut], streams[i]


def eager(ctx: step.Ctx, edges, weights, streams: torch.Tensor, total: torch.Tensor) -> tuple[int, float]:
    """Trains a run of chunks op by op, one after another (:func:`chunks_of`; ``streams``: a
    row of :func:`step.piece_streams` per chunk), adding their loss to ``total``;
    ``(directions, flops)`` of them all."""
    directions, flops = 0, 0.0
    for chunk in chunks_of(edges, weights, streams):
        loss, d, f = step.train_chunk(ctx, *chunk)
        total.add_(loss)
        directions, flops = directions + d, flops + f
    return directions, flops


@dataclass
class Graph:
    """A captured run of chunk steps (``None`` on the CPU twin) and the static tensors it
    reads its inputs from."""

    graph: torch.cuda.CUDAGraph | None
    edges: torch.Tensor
    weights: torch.Tensor | None
    streams: torch.Tensor
    layout: torch.Tensor
    directions: int
    flops: float
    #: The layout the static one holds a copy of (a context's layouts are constants, never
    #: written: a replay copies a bucket's once, not every chunk's).
    layout_of: torch.Tensor | None = None

    def replay(self, ctx: step.Ctx, edges, weights, streams: torch.Tensor, total: torch.Tensor) -> tuple[int, float]:
        """Trains a run of chunks by the captured steps: its inputs (the chunks' edges and
        streams, and its bucket's layout when it changed) copied into the static tensors, then
        the graph replayed (on the CPU twin, the steps run on the static tensors with ``ctx``,
        whose settings and tables the graph's key says are the captured ones)."""
        self.edges.copy_(edges)
        if weights is not None:
            self.weights.copy_(weights)
        self.streams.copy_(streams)
        if ctx.layout is not self.layout_of:
            self.layout.copy_(ctx.layout)
            self.layout_of = ctx.layout
        if self.graph is None:
            eager(replace(ctx, layout=self.layout), self.edges, self.weights, self.streams, total)
        else:
            self.graph.replay()
        return self.directions, self.flops


class StepGraphs:
    """Runs chunk steps, capturing and replaying them as CUDA graphs (on the CPU twin, the same
    bookkeeping around steps run on the static inputs)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pool = torch.cuda.graph_pool_handle() if self.cuda else None
        self.graphs: OrderedDict[tuple, Graph] = OrderedDict()
        self.seen: Counter[tuple] = Counter()
        self.broken: str | None = None
        self.captures = self.replays = self.eager_steps = 0

    def run(
        self, ctx_key: tuple, ctx: step.Ctx, edges, weights, streams: torch.Tensor, total: torch.Tensor
    ) -> tuple[int, float]:
        """Trains a run of chunks of one size (edges ``k b x 3`` int64 on the device, ``weights``
        ``k b`` or ``None``, ``streams``: ``k`` rows of :func:`step.piece_streams` on the
        device), adding their loss to ``total``, a float64 scalar that must outlive every graph
        (captured graphs add into it); ``(directions, flops)``."""
        chunks = len(streams)
        if ctx.training != "negative_sampling":
            # 1vsAll and KvsAll: a few large products per chunk, and KvsAll's query count is
            # read on the host, so no graph.
            self.eager_steps += chunks
            directions, flops = 0, 0.0
            for chunk in chunks_of(edges, weights, streams):
                d, f = vs_all.train_chunk(ctx, *chunk, total)
                directions, flops = directions + d, flops + f
            return directions, flops
        gkey = (chunks, len(edges), weights is None, ctx_key)
        graph = self.graphs.get(gkey)
        if graph is None and self.broken is None and ctx.corrupt != "bernoulli" and ctx.feat is None:
            seen = self._seen(gkey)
            if seen == 2:
                self.eager_steps += chunks
                with self._on_side_stream():
                    return eager(ctx, edges, weights, streams, total)
            if seen > 2:
                graph = self._capture(gkey, ctx, edges, weights, streams, total)
        if graph is None:
            self.eager_steps += chunks
            return eager(ctx, edges, weights, streams, total)
        self.graphs.move_to_end(gkey)
        self.replays += chunks
        return graph.replay(ctx, edges, weights, streams, total)

    def report(self) -> str:
        """How the chunk steps ran since the last report (one line)."""
        line = (
            f"device: {self.replays:,} chunk steps replayed from CUDA graphs ({self.captures} captured,"
            f" runs of up to {RUN} chunks a graph),"
            f" {self.eager_steps:,} op by op"
        )
        if self.broken is not None:
            line += f" (capture failed: {self.broken})"
        # Said each epoch, not only once at the failure: a bench reads these lines.
        gone = kernels.failed()
        if gone:
            named = ", ".join(f"{name} ({reason})" for name, reason in gone.items())
            line += f"; Triton kernels replaced by their torch twins: {named}"
        self.replays = self.captures = self.eager_steps = 0
        return line

    def _seen(self, gkey: tuple) -> int:
        """How many chunks of ``gkey`` have come, this one included."""
        if len(self.seen) > 64 * CAPACITY:
            self.seen.clear()
        self.seen[gkey] += 1
        return self.seen[gkey]

    @contextmanager
    def _on_side_stream(self):
        """Runs the block on the capture stream, ordered after and before the default one."""
        if not self.cuda:
            yield
            return
        side, main = self.stream, torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        try:
            with torch.cuda.stream(side):
                yield
        finally:
            main.wait_stream(side)

    def _capture(self, gkey: tuple, ctx: step.Ctx, edges, weights, streams, total: torch.Tensor) -> Graph | None:
        """Captures the run of steps of ``gkey`` with static copies of the inputs and keeps it
        (not run yet: the caller replays it); ``None``, and eager steps from then on, if it
        fails."""
        static = (edges.clone(), None if weights is None else weights.clone())
        streams = streams.clone()
        layout = ctx.layout.clone()
        graph = torch.cuda.CUDAGraph() if self.cuda else None
        if graph is None:
            # The CPU twin records nothing; its replays run the steps on the static inputs. The
            # run's counts are its chunks', computed from shapes alone.
            counts = [step.chunk_counts(ctx, step.stacks_of(ctx, *chunk)) for chunk in chunks_of(*static, streams)]
            directions, flops = sum(d for d, _ in counts), sum(f for _, f in counts)
        else:
            try:
                with self._on_side_stream():
                    # Thread-local: a CUDA call of another thread meanwhile (a GNN pipeline's
                    # producer, a tensor freed by the collector there) neither fails nor spoils
                    # the capture, as under the default global mode it would.
                    graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                    try:
                        directions, flops = eager(replace(ctx, layout=layout), *static, streams, total)
                    finally:
                        graph.capture_end()
            except RuntimeError as err:
                self.broken = str(err).splitlines()[0]
                print(f"device: CUDA graph capture failed ({self.broken}); the step runs op by op", file=sys.stderr)
                return None
        self.captures += 1
        self.graphs[gkey] = Graph(graph, *static, streams, layout, directions, flops)
        if len(self.graphs) > CAPACITY:
            self.graphs.popitem(last=False)
        return self.graphs[gkey]
