"""A node-classification batch's training step: eager over the batch as sampled, or padded to
one of a few fixed shapes and, on a CUDA device, replayed as that shape's CUDA graph.

Eager, a step dispatches every op of its forward pass, backward pass and Adam update from the
host: for G6's GraphSAGE about 4 ms of host time a batch on an H200, more than the device
needs (docs/benchmarks.md, G6). A CUDA graph replays them all as one launch, but it needs
fixed shapes and addresses, while every sampled batch has its own sizes. So a batch is padded:

- A batch's nodes come in hops: ``h_k`` nodes first reached at hop ``k`` (hop 0: the seeds).
  Layer ``l`` of ``H`` (input layer first) reads the rows of hops ``0..H-l`` and writes those of
  hops ``0..H-l-1``. A padded shape gives hop ``k`` ``P_k > h_k`` rows and layer ``l``
  ``E_l >= e_l`` edge slots (:func:`round_up`), and every local id moves to its hop's padded
  place. So a layer's padded destinations are its live destinations and pad rows, never
  another hop's nodes: GCN's degrees and GAT's self-loops see exactly the eager block's.
- Edge slots past ``e_l`` join the dump, the last pad row of hop 0, to itself. Pad rows
  compute values that no live row reads: every layer kind aggregates per destination (mean,
  max, sum, GCN's degrees, GAT's softmax), and a live destination's edges come from live rows.
- The loss is the mean over the live seeds, so the gradients are the eager step's: a row no
  live row reads gets exactly zero. Pad input rows are zeroed in the step, so that a stale
  value cannot make ``0 * inf``.

A shape serves every batch it holds, the smallest that does; a batch that none holds makes a
new one, up to :data:`MAX_SHAPES`, after which such batches train eagerly. On CUDA a shape's
first batch trains op by op on a side stream (the warm-up, which also creates Adam's state),
then the step is captured; off CUDA (the CPU twin the tests compare) the padded step always
runs op by op.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass

import numpy as np

from ..device.capture import capturing, drawing, replay
from ._torch import require_torch
from .models import Block

torch = require_torch()
F = torch.nn.functional

#: Padded shapes kept at most (each holds its inputs and, captured, its graph's memory).
MAX_SHAPES = 4
#: The step's modes: every batch as sampled, or padded (CUDA graphs on a CUDA device).
MODES = ("eager", "graphs")


def captures(device, mode: str) -> bool:
    """Whether a :class:`TrainStep` of ``mode`` on ``device`` captures CUDA graphs."""
    return mode == "graphs" and torch.device(device).type == "cuda"


def adam(params, device, mode: str, **options):
    """``torch.optim.Adam`` (``lr``, ``weight_decay``... in ``options``) for a
    :class:`TrainStep` of ``mode`` on ``device``: capturable (its step counts on the device)
    where the step is captured."""
    return torch.optim.Adam(params, capturable=captures(device, mode), **options)


def round_up(n: int) -> int:
    """``n`` rounded up to one of eight sizes per octave (at most 12.5% more), at least 8."""
    step = 1 << max(0, n.bit_length() - 4)
    return max(8, -(-n // step) * step)


@dataclass(frozen=True)
class Shape:
    """A batch's sizes: ``hops`` the nodes first reached at each hop (hop 0: the seeds) and
    ``edges`` each layer's edges, input layer first."""

    hops: tuple[int, ...]
    edges: tuple[int, ...]

    @staticmethod
    def of(batch) -> Shape:
        return Shape(tuple(map(int, batch.hop_counts)), tuple(int(b.src.numel()) for b in batch.blocks))

    def padded(self) -> Shape:
        """The shape a new padding of this batch takes: each size :func:`round_up`, each hop
        with a pad row at least."""
        return Shape(tuple(round_up(h + 1) for h in self.hops), tuple(map(round_up, self.edges)))

    def holds(self, other: Shape) -> bool:
        """Whether this padded shape holds a batch of sizes ``other``."""
        return (
            len(self.edges) == len(other.edges)
            and all(a > b for a, b in zip(self.hops, other.hops, strict=True))
            and all(a >= b for a, b in zip(self.edges, other.edges, strict=True))
        )

    def size(self) -> int:
        return sum(self.hops) + sum(self.edges)


class Padded:
    """One padded shape's inputs on the device (a batch is copied in by :meth:`load`), and on
    CUDA its captured step with the step's outputs."""

    def __init__(self, shape: Shape, width: int, device):
        self.shape = shape
        i64 = dict(dtype=torch.int64, device=device)
        #: Where each hop's padded rows start (``C_k``), and the rows in all.
        self.starts = np.cumsum([0, *shape.hops]).tolist()
        rows = self.starts[-1]
        #: The live batch's input rows, hop after hop as sampled (one copy a batch): the step
        #: gathers them into their hops' padded places (:meth:`inputs`).
        self.x = torch.zeros(rows, width, device=device)
        self.src = [torch.zeros(e, **i64) for e in shape.edges]
        self.dst = [torch.zeros(e, **i64) for e in shape.edges]
        self.y = torch.zeros(shape.hops[0], **i64)
        #: The live batch's sizes as a bounded draw gives them (``Batch.drawn_sizes``): the
        #: nodes reached after hops ``0..H``, then each hop's kept edges, hop 1 first; the step
        #: derives each hop's nodes and each layer's edges from them (:meth:`inputs`).
        self.drawn = torch.zeros(2 * len(shape.hops) - 1, **i64)
        self.hop_rows = torch.as_tensor(shape.hops, **i64)
        #: Each padded row's hop and place in it (static: which rows are live is not).
        hop = np.repeat(np.arange(len(shape.hops)), shape.hops)
        self.row_hop = torch.as_tensor(hop, **i64)
        self.row_place = torch.arange(rows, **i64) - torch.as_tensor(np.asarray(self.starts)[hop], **i64)
        self.graph = None
        self.outputs: tuple | None = None

    def load(self, batch, live: Shape) -> None:
        """Copies ``batch`` (of sizes ``live``) into the inputs; nothing is read back, and the
        slots past the live ones keep what they held (the step masks them)."""
        self.x[: len(batch.x)].copy_(batch.x)
        for src, dst, block in zip(self.src, self.dst, batch.blocks, strict=True):
            src[: block.src.numel()].copy_(block.src)
            dst[: block.dst.numel()].copy_(block.dst)
        self.y[: live.hops[0]].copy_(batch.y)
        if batch.drawn_sizes is not None:
            self.drawn.copy_(batch.drawn_sizes)  # one copy on the device
            return
        sizes = (*itertools.accumulate(live.hops), *reversed(live.edges))
        for slot, n in zip(self.drawn, sizes, strict=True):
            slot.fill_(n)  # a kernel argument: no copy from the host to wait for

    def inputs(self) -> tuple[list[Block], object]:
        """The padded blocks and input rows (module doc), from the live sizes on the device."""
        hops, edges, starts = self.shape.hops, self.shape.edges, self.starts
        # The live nodes of each hop and edges of each layer (input layer first); hop k's
        # live rows start at compact id reached[k - 1] (0 for the seeds).
        reached, kept = self.drawn[: len(hops)], self.drawn[len(hops) :]
        h, e = torch.diff(reached, prepend=reached.new_zeros(1)), kept.flip(0)
        row_live = h[self.row_hop]
        live_row = self.row_place < row_live
        compact = torch.where(live_row, reached[self.row_hop] - row_live + self.row_place, 0)
        x = torch.where(live_row[:, None], self.x[compact], 0.0)
        # A compact id at or past hop k's first one moves by the pad rows of hops 0..k-1.
        firsts, pads = reached[:-1], self.hop_rows[:-1] - h[:-1]

        def place(ids):
            return ids + ((ids[:, None] >= firsts) * pads).sum(1)

        dump = starts[1] - 1
        blocks = []
        for layer, width in enumerate(edges):
            live = torch.arange(width, device=h.device) < e[layer]
            src = torch.where(live, place(self.src[layer]), dump)
            dst = torch.where(live, place(self.dst[layer]), dump)
            reach = len(hops) - 1 - layer  # the layer's sources reach hop H - l
            blocks.append(Block(starts[reach + 1], starts[reach], src, dst))
        return blocks, x


def padded_loss(net, padded: Padded):
    """The mean cross-entropy over the live seeds of ``padded``'s batch and how many of them
    ``net`` predicts right (0-d tensors on the device)."""
    blocks, x = padded.inputs()
    out = net(blocks, x)
    live = padded.drawn[0]  # the nodes reached after hop 0: the seeds
    seeds = torch.arange(out.shape[0], device=out.device) < live
    terms = F.cross_entropy(out, padded.y, reduction="none")
    loss = torch.where(seeds, terms, 0.0).sum() / live
    return loss, ((out.argmax(1) == padded.y) & seeds).sum()


class TrainStep:
    """Trains node batches (``Batch``: ``blocks``, ``x``, ``y``) of ``net`` with ``opt``, in
    ``mode`` ``eager`` or ``graphs`` (module doc). On CUDA, ``graphs`` needs an optimizer
    whose update can be captured (:func:`adam`)."""

    def __init__(self, net, opt, device, mode: str):
        if mode not in MODES:
            raise ValueError(f"training step: mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.net, self.opt, self.mode, self.device = net, opt, mode, torch.device(device)
        self.capture = captures(self.device, mode)
        self.shapes: list[Padded] = []
        #: The seeds' summed loss and correct predictions since :meth:`take_totals`, added on
        #: the device by each step (inside a replayed graph: no op of the host's a batch).
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.correct = torch.zeros((), dtype=torch.int64, device=self.device)
        #: Batches trained as sampled (``eager``), padded op by op (``padded``: the twin, and
        #: each shape's warm-up), as a replayed graph (``replayed``); graphs ``captured``.
        self.counts = dict.fromkeys(("eager", "padded", "replayed", "captured"), 0)

    def __call__(self, batch):
        """Trains ``batch``; returns its mean loss and correct predictions (0-d tensors on the
        device; a replayed graph's are rewritten by its next replay, so add or read them
        before the next step)."""
        padded = None if self.mode == "eager" else self._padding(batch)
        if padded is not None:
            padded.load(batch, Shape.of(batch))
            if padded.graph is not None:
                replay(padded.graph)
                self.counts["replayed"] += 1
                return padded.outputs
        # Op by op, dropout draws from torch's generator, which a capture on another thread
        # (the device path's sampler) must not see.
        with drawing(self.device):
            if padded is None:
                self.counts["eager"] += 1
                return self._eager(batch)
            self.counts["padded"] += 1
            if not self.capture:
                return self._padded(padded)
            with torch.cuda.device(self.device):
                return self._warm_up_and_capture(padded)

    def take_totals(self) -> tuple[float, int]:
        """The seeds' summed loss and correct predictions since the last call, then zeroed (one
        read from the device)."""
        totals = float(self.loss_sum), int(self.correct)
        self.loss_sum.zero_()
        self.correct.zero_()
        return totals

    def take_counts(self) -> dict:
        """The counts since the last call (:attr:`counts`), then zeroed."""
        counts, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return counts

    def describe(self) -> dict:
        """The mode and the padded shapes made so far (for the run record)."""
        return {
            "mode": self.mode,
            "cuda_graphs": self.capture,
            "shapes": [{"hops": list(p.shape.hops), "edges": list(p.shape.edges)} for p in self.shapes],
        }

    def _padding(self, batch) -> Padded | None:
        """The smallest shape that holds ``batch``, made if none does and there is room."""
        live = Shape.of(batch)
        fits = [p for p in self.shapes if p.shape.holds(live)]
        if fits:
            return min(fits, key=lambda p: p.shape.size())
        if len(self.shapes) >= MAX_SHAPES:
            return None
        padded = Padded(live.padded(), batch.x.shape[1], batch.x.device)
        self.shapes.append(padded)
        return padded

    def _eager(self, batch):
        self.opt.zero_grad()
        out = self.net(batch.blocks, batch.x.float())
        loss = F.cross_entropy(out, batch.y)
        loss.backward()
        self.opt.step()
        loss, correct = loss.detach(), (out.argmax(1) == batch.y).sum()
        self._add(loss, correct, batch.num_seeds)
        return loss, correct

    def _padded(self, padded: Padded):
        # Gradients set to None: a captured backward then writes them afresh on each replay.
        self.opt.zero_grad(set_to_none=True)
        loss, correct = padded_loss(self.net, padded)
        loss.backward()
        self.opt.step()
        loss = loss.detach()
        self._add(loss, correct, padded.drawn[0])
        return loss, correct

    def _add(self, loss, correct, seeds) -> None:
        """Adds a batch's mean ``loss`` over ``seeds`` seeds and its ``correct`` predictions
        to the epoch's sums (:meth:`take_totals`)."""
        self.loss_sum.add_(loss.double() * seeds)
        self.correct.add_(correct)

    def _warm_up_and_capture(self, padded: Padded):
        """Trains ``padded``'s batch op by op on a side stream, then captures its step; returns
        the batch's loss and correct predictions."""
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            outputs = self._padded(padded)
        current.wait_stream(side)
        for t in outputs:
            t.record_stream(current)
        self._capture(padded)
        return outputs

    def _capture(self, padded: Padded) -> None:
        """Captures ``padded``'s step; a capture that fails leaves every later batch eager, as
        said once on stderr."""
        try:
            graph = torch.cuda.CUDAGraph()
            # The data path's thread keeps sampling on the device meanwhile.
            with capturing(graph):
                outputs = self._padded(padded)
        except Exception as e:
            self.mode = "eager"
            print(f"strata: the training step could not be captured as a CUDA graph ({type(e).__name__}: {e}); "
                  "batches train op by op", file=sys.stderr)  # fmt: skip
            return
        padded.graph, padded.outputs = graph, outputs
        self.counts["captured"] += 1
