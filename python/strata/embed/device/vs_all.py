"""1vsAll and KvsAll on a torch device, the twin of the Rust worker's ``train_vs_all``.

A chunk's queries are scored against every candidate entity (the rows of every resident
partition: in memory, the whole table) as one matrix product per corrupted side, with a loss
over every candidate; the backward pass is two more products, and every candidate row takes
one Adagrad step per chunk with its gradients as candidate, source and true target summed.

Exactly as the Rust engine (``train::all_entities``, ``model::all_entities``):
- **Queries.** Side ``k`` of a chunk (``corrupt = both``: tails then heads) draws from stream
  ``derive(key, k)``. 1vsAll asks every edge's query, its true entity the one label; KvsAll asks
  ``(s, r, ?)`` only from the edge whose target is the query's smallest known answer, labelled
  with all of them (:class:`Answers`), so that an epoch asks each distinct query once.
- **Labels and losses.** With label smoothing ``ls`` a label row ``y`` is ``(1 - ls) y + 1/n``.
  ``softmax``: cross-entropy of the softmax over the candidates against ``y`` normalised to sum
  1, gradient ``p - y_hat``; ``logistic``: ``sum softplus(x) - y x`` with ``x`` the score plus
  ``gamma``, gradient ``sigmoid(x) - y``. Each query's term times its edge's weight.
- **Dropout** of the side's source rows, every candidate row and its relation rows (the masks
  from the side's stream, from its first draw); the regularizer sees the rows as stored: the
  side's sources, relations and (1vsAll) true targets, or with ``reg_scope = "table"`` its
  relations only and every candidate row once per chunk, times the chunk's edges.

Shapes: ``n`` candidates of ``dim`` reals; a side's ``b`` queries; scores ``b x n``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.embed.device import adagrad, step
from strata.embed.device.rows import Gathered


@dataclass
class Answers:
    """One side's known answers on the device (``Answers`` of the Rust engine): its distinct
    queries' keys ``s * relations + r`` ascending, where each query's answers start in
    ``answers`` and how many there are (``answers``: the answer of every row, in query then
    answer order)."""

    keys: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor
    answers: torch.Tensor
    relations: int

    @staticmethod
    def index(rows: torch.Tensor) -> Answers:
        """The index of one side's rows ``[s, r, answer]`` (``m x 3`` int64, sorted)."""
        relations = int(rows[:, 1].max()) + 1 if len(rows) else 1
        keys, count = torch.unique_consecutive(rows[:, 0] * relations + rows[:, 1], return_counts=True)
        start = torch.cumsum(count, 0) - count
        return Answers(keys, start, count, rows[:, 2].contiguous(), relations)

    def asked(self, s: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Of edges ``(s, r, t)`` (``b`` each), the indices of those that ask their query (``t``
        is its smallest answer) and the labels of those queries: ``(query, answer)`` index
        pairs, every answer of each."""
        key = s * self.relations + r
        at = torch.searchsorted(self.keys, key).clamp(max=len(self.keys) - 1)
        ask = (self.keys[at] == key) & (self.answers[self.start[at]] == t)
        edges = ask.nonzero().squeeze(1)
        at = at[edges]
        count = self.count[at]
        query = torch.repeat_interleave(torch.arange(len(edges), device=s.device), count)
        # Answer j of a query is row start + j: the row offsets less each query's first.
        first = torch.cumsum(count, 0) - count
        row = torch.repeat_interleave(self.start[at] - first, count) + torch.arange(len(query), device=s.device)
        return edges, (query, self.answers[row])


@dataclass
class Side:
    """One side's queries: their candidate index of the source, relation rows (buffer rows of
    the relation table), labels ``(query, candidate)`` index pairs, the 1vsAll true targets'
    candidate index (``None`` for KvsAll), each query's weight (``None``: unweighted), and
    whether the side scores its relation rows reversed (heads without inverse relations)."""

    src: torch.Tensor
    rel: torch.Tensor
    labels: tuple[torch.Tensor, torch.Tensor]
    one: torch.Tensor | None
    weights: torch.Tensor | None
    reverse: bool


def queries(ctx: step.Ctx, side: int, edges: torch.Tensor, weights: torch.Tensor | None) -> Side:
    """Side ``side``'s queries of a chunk (0: ``(s, r, ?)``, 1: ``(t, r^-1, ?)``), as
    ``Orientation`` and ``VsAllWorker::gather`` of the Rust engine."""
    s_col, d_col = (0, 2) if side == 0 else (2, 0)
    s_first, d_first = ctx.cand_first if side == 0 else ctx.cand_first[::-1]
    s, r, t = edges[:, s_col], edges[:, 1], edges[:, d_col]
    if ctx.answers is None:
        one = d_first + t
        labels = (torch.arange(len(edges), device=edges.device), one)
    else:
        asked, (query, answer) = ctx.answers[side].asked(s, r, t)
        s, r, one = s[asked], r[asked], None
        labels = (query, d_first + answer)
        weights = None if weights is None else weights[asked]
    rel = r + (ctx.inverse_offset if side else 0)
    reverse = side == 1 and ctx.inverse_offset == 0 and ctx.rel_dim > 0
    return Side(s_first + s, rel, labels, one, weights, reverse)


def label_loss(ctx: step.Ctx, scores: torch.Tensor, q: Side) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, d loss / d scores)`` of a side's scores (``b x n``) against its labels: the
    queries' terms times their weights, summed (float64)."""
    n = scores.shape[1]
    ls = ctx.label_smoothing
    # The f32 values of the Rust engine's (1 - ls + 1/n, 1/n).
    off = float(torch.tensor(1.0) / n) if ls > 0.0 else 0.0
    on = float(torch.tensor(1.0 - ls) + off) if ls > 0.0 else 1.0
    y = torch.full_like(scores, off)
    y[q.labels] = on
    if ctx.loss == "softmax":
        y = y / y.sum(1, keepdim=True)
        terms = torch.logsumexp(scores, 1) - (y * scores).sum(1)
        grad = torch.softmax(scores, 1) - y
    elif ctx.loss == "logistic":
        x = scores + ctx.gamma
        terms = (F.softplus(x, threshold=20.0) - y * x).sum(1)
        grad = torch.sigmoid(x) - y
    else:
        raise ValueError(f"loss {ctx.loss} is not supported with training {ctx.training}")
    if q.weights is not None:
        terms, grad = terms * q.weights, grad * q.weights[:, None]
    return terms.to(torch.float64).sum(), grad


def train_side(
    ctx: step.Ctx, q: Side, cands: torch.Tensor, rel: torch.Tensor, stream: torch.Tensor, repeat: bool
) -> tuple[torch.Tensor, ...]:
    """``(loss, d src, d one, d rel, d cands)``: a side's loss against the candidates ``cands``
    (``n x dim``, as stored) with its relation rows ``rel`` (``b x rel_dim``, as the side scores
    them) and its stream (``1``), and the gradients of its source rows, its true targets' rows
    (1vsAll; empty for KvsAll), its relation rows and the candidates. ``repeat``: the chunk's
    other side asked its edges already (1vsAll's head side of ``corrupt = both``)."""
    src = cands[q.src]
    one = cands[q.one] if q.one is not None else cands.new_zeros((0, ctx.dim))
    (s, _, c, r), masks = step.dropout(ctx, (src[None], one[:0][None], cands[None], rel[None]), stream, first_draw=0)
    a = step.combine(ctx.query, s[0], r[0])
    loss, g = label_loss(ctx, a @ c[0].T, q)
    d_src, d_rel = step.combine_grads(ctx.query, s[0], r[0], g @ c[0])
    d_cands = g.T @ a
    d_src, _, d_cands, d_rel = (
        x if m is None else x * m[0] for x, m in zip((d_src, None, d_cands, d_rel), masks, strict=True)
    )
    reg, (d_src, d_one, d_rel) = step.regularize(
        ctx,
        (src[None], one[None], rel[None]),
        (d_src[None], torch.zeros_like(one)[None], d_rel[None]),
        [step.reg_rows(ctx, repeat)],
    )
    return (loss if reg is None else loss + reg), d_src[0], d_one[0], d_rel[0], d_cands


def train_chunk(ctx: step.Ctx, edges: torch.Tensor, weights: torch.Tensor | None, streams: torch.Tensor, total):
    """Trains one chunk in place (``Worker::train_vs_all``) with its streams
    (a row of :func:`step.piece_streams`), adding its loss to ``total``; ``(directions, flops)``: the
    queries asked and ``ScoreModel::flops`` of each side against the candidates."""
    cands = ctx.nodes.params.index_select(0, ctx.cand_rows).float()
    n = len(cands)
    grad = torch.zeros_like(cands)
    sides = [queries(ctx, side, edges, weights) for side in {"both": [0, 1], "tail": [0], "head": [1]}[ctx.corrupt]]
    rels = None
    if ctx.rels is not None:
        keys = step.cat([q.rel for q in sides])
        rels = Gathered.of(ctx.rels, keys)
    rel_grads, directions, at = [], 0, 0
    for k, q in enumerate(sides):
        b = len(q.src)
        rel = rels.take(at, b) if rels is not None else cands.new_zeros((b, 0))
        at += b
        if q.reverse:
            rel = step.reverse_relation(ctx.query, rel)
        repeat = k == 1 and ctx.corrupt == "both" and ctx.answers is None
        loss, d_src, d_one, d_rel, d_cands = train_side(ctx, q, cands, rel, streams[k : k + 1, None], repeat)
        total.add_(loss)
        grad += d_cands
        grad.index_add_(0, q.src, d_src)
        if q.one is not None:
            grad.index_add_(0, q.one, d_one)
        rel_grads.append(step.reverse_relation(ctx.query, d_rel) if q.reverse else d_rel)
        directions += b
    if ctx.reg_table and ctx.reg != "none" and ctx.reg_weight != 0.0:
        # Every candidate row once per chunk, times its edges (LibKGE's unweighted lp).
        value, d = step.norm(ctx, cands, step.layouts(ctx.query)[0])
        weight = ctx.reg_weight * len(edges) / step.POWER[ctx.reg]
        total.add_(value.to(torch.float64) * weight)
        grad += d * weight
    every = torch.ones(n, dtype=torch.bool, device=cands.device)
    salt = streams[step.SALT : step.SALT + 1]
    adagrad.step(ctx.nodes, ctx.cand_rows, every, grad, ctx.lr, salt)
    if rels is not None:
        rels.step(step.cat(rel_grads), ctx.lr, salt)
    return directions, 6.0 * directions * n * ctx.dim
