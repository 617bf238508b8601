"""The training step of the embedding engine on a torch device, the twin of the Rust worker's.

One chunk of one bucket, exactly as ``strata_embed``'s CPU worker trains it: the same shared
negatives (drawn through :mod:`strata.device.rng` from the chunk's key, so a device picks what
the Rust engine picks), the same scores, losses and regularizers, and one Adagrad step per
touched row with the gradients of every side and role summed. The gradients are torch's
autograd of the same forward arithmetic: the forward pass is the model's matrix products, and
autograd's backward is the same products transposed (Legend §6's reuse of the forward results
without a hand-written kernel per model).

Shapes: node rows ``dim`` floats, relation rows ``rel_dim``; ``edges`` is ``b x 3`` int64
``(source local row, relation, destination local row)``; ``weights`` ``b`` floats or ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from strata.device import rng

#: Added under square roots of distances, as the Rust models do.
EPS = 1e-9
#: Added to Adagrad's denominator, as ``SharedRows::adagrad``.
ADAGRAD_EPS = 1e-9

#: The score models the device step implements, and their relation row widths.
MODELS = ("dot", "distmult", "complex", "transe", "rotate")


def rel_dim(model: str, dim: int) -> int:
    """Reals per relation row of ``model`` at node dimension ``dim``."""
    return {"dot": 0, "distmult": dim, "complex": dim, "transe": dim, "rotate": dim // 2}[model]


def check_model(model: str) -> None:
    """Raises a ``ValueError`` naming ``model`` when the device step does not implement it."""
    if model not in MODELS:
        raise ValueError(
            f"model {model} is not supported with a torch device (supported: {', '.join(MODELS)});"
            " train it with device = cpu (the Rust engine)"
        )


@dataclass
class Table:
    """Rows and their Adagrad state: ``params`` ``rows x width``, ``state`` ``rows x width``
    (per-element Adagrad) or ``rows x 1`` (``adagrad_row``)."""

    params: torch.Tensor
    state: torch.Tensor


#: Where ``Ctx.layout`` holds each value: the buffer rows where the bucket's source and
#: destination partitions start (``END_BASE``), their rows (``END_ROWS``), the rows of every
#: resident partition (``RESIDENT_ROWS``), then the negative pool's table (``POOL``: for
#: ``resident`` each partition's end in the resident rows then its buffer row less its start
#: there; for ``all`` each partition id's first buffer row).
END_BASE, END_ROWS, RESIDENT_ROWS, POOL = slice(0, 2), slice(2, 4), 4, 5


def layout(pool: str, bases: list[int], sizes: list[int], bucket: tuple[int, int], part_of: list | None) -> list[int]:
    """The values of ``Ctx.layout`` for resident partitions of ``sizes`` rows starting at buffer
    rows ``bases``, the bucket's source and destination partitions ``bucket`` (indices in them)
    and ``part_of`` each partition id's index (see :data:`END_BASE`)."""
    src, dst = bucket
    ends = [bases[src], bases[dst], sizes[src], sizes[dst], sum(sizes)]
    if pool == "resident":
        starts = np.cumsum([0, *sizes]).tolist()
        return ends + starts[1:] + [b - a for b, a in zip(bases, starts, strict=False)]
    if pool == "all":
        return ends + [bases[p] for p in part_of]
    return ends


@dataclass
class Ctx:
    """What every chunk of a bucket trains against (``BucketCtx`` of the Rust worker).

    ``nodes`` is the slot buffer: every resident partition's rows, a node's row the buffer row
    where its partition's slot starts plus its row there; ``layout`` (int64 on the device) says
    where the bucket's partitions sit (:func:`layout`), so that the kernels read the placement
    from memory and a captured step serves every bucket of the same settings."""

    model: str
    dim: int
    transe_norm: int
    loss: str
    margin: float
    gamma: float
    adversarial: float | None
    lr: float
    nodes: Table
    rels: Table | None
    inverse_offset: int
    corrupt: str
    head_prob: torch.Tensor | None
    negatives: int
    degree_fraction: float
    pool: str
    layout: torch.Tensor
    part_size: int
    num_nodes: int
    reg: str
    reg_weight: float
    #: LibKGE's weighted form (``reg_weighted``), and the relation rows' own weight
    #: (``relation_reg_weight``; ``None``: ``reg_weight``).
    reg_weighted: bool = False
    rel_reg_weight: float | None = None
    #: Dropout rates of gathered entity and relation rows (``entity_dropout``,
    #: ``relation_dropout``).
    entity_dropout: float = 0.0
    relation_dropout: float = 0.0

    @property
    def rel_dim(self) -> int:
        return rel_dim(self.model, self.dim)


@dataclass
class Side:
    """One corrupted side of a chunk: tail corruption scores ``(s, r, t')``, head corruption
    ``(t, r^-1, s')``."""

    tail: bool
    edges: torch.Tensor
    weights: torch.Tensor | None


def sides_of(ctx: Ctx, edges: torch.Tensor, weights: torch.Tensor | None, key: int) -> list[Side]:
    """The corrupted sides of a chunk in training order (``Worker::train_chunk``)."""
    if ctx.corrupt == "both":
        return [Side(True, edges, weights), Side(False, edges, weights)]
    if ctx.corrupt == "tail":
        return [Side(True, edges, weights)]
    if ctx.corrupt == "head":
        return [Side(False, edges, weights)]
    # Bernoulli: edge i's head is corrupted when draw i of derive(key, 2) is below its
    # relation's probability.
    u = rng.unit(rng.draw(rng.derive(key, 2), torch.arange(len(edges), device=edges.device)))
    head = u < ctx.head_prob[edges[:, 1]].to(torch.float64)
    out = []
    for tail, mask in ((True, ~head), (False, head)):
        if bool(mask.any()):
            out.append(Side(tail, edges[mask], None if weights is None else weights[mask]))
    return out


def orientation(ctx: Ctx, tail: bool) -> tuple[int, int, int, int, bool]:
    """``(s_end, s_col, d_end, rel_offset, reverse)`` of a side: which end of the bucket (0:
    source partition, 1: destination) and which edge column its sources come from, the end
    of its targets (whose column is the other end's), its relation offset and whether it
    scores the reversed relation."""
    if tail:
        return 0, 0, 1, 0, False
    reverse = ctx.inverse_offset == 0 and ctx.rel_dim > 0
    return 1, 2, 0, ctx.inverse_offset, reverse


def negatives(ctx: Ctx, side: Side, k: int, key: int) -> torch.Tensor:
    """The buffer rows of the side's shared negatives (``n``), drawn from ``derive(key, k)``: a
    degree-weighted part (targets of the side's edges) then uniform from the pool."""
    _, _, d_end, _, _ = orientation(ctx, side.tail)
    device = side.edges.device
    n = ctx.negatives
    # The f32 product, rounded half away from zero, as the Rust worker.
    n_degree = math.floor(float(torch.tensor(n, dtype=torch.float32) * ctx.degree_fraction) + 0.5)
    n_degree = min(n_degree, n)
    bits = rng.draw(rng.derive(key, k), torch.arange(n, device=device))
    base = ctx.layout[END_BASE][d_end]
    parts = []
    if n_degree:
        targets = side.edges[:, 2 * d_end]
        parts.append(base + targets[rng.below(bits[:n_degree], len(side.edges))])
    u = bits[n_degree:]
    if ctx.pool == "partition":
        parts.append(base + rng.below(u, ctx.layout[END_ROWS][d_end]))
    elif ctx.pool == "resident":
        table = ctx.layout[POOL:]
        ends, shift = table[: len(table) // 2], table[len(table) // 2 :]
        r = rng.below(u, ctx.layout[RESIDENT_ROWS])
        parts.append(r + shift[torch.searchsorted(ends, r, right=True)])
    else:
        pos = rng.below(u, ctx.num_nodes)
        parts.append(ctx.layout[POOL:][pos // ctx.part_size] + pos % ctx.part_size)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def reverse_relation(model: str, rows: torch.Tensor) -> torch.Tensor:
    """The rows that score ``(t, r', h)`` like a tail query (``ScoreModel::reverse_relation``)."""
    if model in ("transe", "rotate"):
        return -rows
    if model == "complex":
        h = rows.shape[1] // 2
        return torch.cat([rows[:, :h], -rows[:, h:]], 1)
    return rows


def combine(model: str, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The query rows ``a = phi(s, r)`` (``b x dim``)."""
    if model == "dot":
        return s
    if model == "distmult":
        return s * r
    if model == "transe":
        return s + r
    h = s.shape[1] // 2
    sr, si = s[:, :h], s[:, h:]
    if model == "complex":
        rr, ri = r[:, :h], r[:, h:]
    else:  # rotate: r holds phases
        rr, ri = torch.cos(r), torch.sin(r)
    return torch.cat([sr * rr - si * ri, sr * ri + si * rr], 1)


def scores(ctx: Ctx, a: torch.Tensor, t: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive scores (``b``) and negative scores (``b x n``) of query rows ``a``."""
    model = ctx.model
    if model in ("dot", "distmult", "complex"):
        return (a * t).sum(1), a @ neg.T
    if model == "transe" and ctx.transe_norm == 2:
        pos = -(((a - t) ** 2).sum(1) + EPS).sqrt()
        a_sq, n_sq = (a * a).sum(1), (neg * neg).sum(1)
        sq = (a @ neg.T * -2.0 + a_sq[:, None] + n_sq[None, :]).clamp(min=0.0)
        return pos, -(sq + EPS).sqrt()
    if model == "transe":
        return -(a - t).abs().sum(1), -(a[:, None, :] - neg[None, :, :]).abs().sum(2)
    h = a.shape[1] // 2

    def dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        diff = x - y
        return -((diff[..., :h] ** 2 + diff[..., h:] ** 2 + EPS).sqrt()).sum(-1)

    return dist(a, t), dist(a[:, None, :], neg[None, :, :])


def loss_terms(ctx: Ctx, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Each edge's loss term (``b``) of positive scores ``pos`` and negative scores ``neg``."""
    adv = None
    if ctx.adversarial is not None and ctx.loss in ("logistic", "margin"):
        # n softmax(alpha scores), a constant in the gradient (RotatE's detach).
        adv = torch.softmax(ctx.adversarial * neg.detach(), 1) * neg.shape[1]
    if ctx.loss == "softmax":
        return torch.logsumexp(torch.cat([pos[:, None], neg], 1), 1) - pos
    if ctx.loss == "logistic":
        g, n = ctx.gamma, neg.shape[1]
        u = 1.0 / n if adv is None else adv / n
        return F.softplus(-(pos + g), threshold=20.0) + (F.softplus(neg + g, threshold=20.0) * u).sum(1)
    if ctx.loss == "margin":
        h = F.relu(ctx.margin - pos[:, None] + neg)
        return (h if adv is None else h * adv).sum(1)
    raise ValueError(f"loss {ctx.loss} is not supported with a torch device")


def regularizer(ctx: Ctx, rows: torch.Tensor, layout: str) -> torch.Tensor:
    """``sum R(x)`` over ``rows`` (N3: cubes of magnitudes, L2: squares); complex rows take the
    modulus of each coordinate."""
    if layout == "skip":
        return rows.new_zeros(())
    if layout == "complex":
        h = rows.shape[1] // 2
        sq = rows[:, :h] ** 2 + rows[:, h:] ** 2
    else:
        sq = rows * rows
    # N3's m^3 as (m^2)^1.5: its gradient 3 m x is finite at 0, unlike sqrt's.
    return (sq**1.5).sum() if ctx.reg == "n3" else sq.sum()


#: The ``p`` of each regularizer's norm (``R(x) = |x|^p``): the weighted form divides by it.
POWER = {"n3": 3.0, "l2": 2.0}


def regularization(ctx: Ctx, rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor], k: int) -> torch.Tensor:
    """Side ``k``'s regularization term (``model::regularize``) of its source, target and
    relation rows as stored: ``w / b`` times ``sum R`` of each (weighted: ``w / p``, and the
    head side of ``corrupt = both`` takes only its inverse relation rows, whose edges the tail
    side penalised already); relation rows with their own weight."""
    s, t, r = rows
    b = s.shape[0]
    rel_weight = ctx.reg_weight if ctx.rel_reg_weight is None else ctx.rel_reg_weight
    zero = s.new_zeros((), dtype=torch.float64)
    if ctx.reg == "none" or (ctx.reg_weight == 0.0 and rel_weight == 0.0) or b == 0:
        return zero
    nodes, rels = True, True
    if ctx.reg_weighted and k == 1 and ctx.corrupt == "both":
        nodes, rels = False, ctx.inverse_offset > 0
    scale = 1.0 / POWER[ctx.reg] if ctx.reg_weighted else 1.0 / b
    node_layout, rel_layout = layouts(ctx.model)
    total = zero
    if nodes and ctx.reg_weight != 0.0:
        term = regularizer(ctx, s, node_layout) + regularizer(ctx, t, node_layout)
        total = total + (term * (ctx.reg_weight * scale)).to(torch.float64)
    if rels and ctx.rel_dim and rel_weight != 0.0:
        total = total + (regularizer(ctx, r, rel_layout) * (rel_weight * scale)).to(torch.float64)
    return total


def dropped(
    ctx: Ctx, rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], key: int, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Side ``k``'s source, target, negative and relation rows with inverted dropout
    (``model::dropout``): each real kept with its factor ``1 / (1 - rate)`` unless its 32
    random bits fall below ``rate * 2^32``, two reals a draw, the masks drawn in the Rust
    worker's order (source, target, negatives at the entity rate, then relations) from the
    side's stream ``derive(key, k)`` after its ``negatives`` draws."""
    if not (ctx.entity_dropout > 0.0 or (ctx.relation_dropout > 0.0 and ctx.rel_dim > 0)):
        return rows
    stream = rng.derive(key, k)
    at = ctx.negatives
    out = []
    for x, rate in zip(rows, (ctx.entity_dropout,) * 3 + (ctx.relation_dropout,), strict=True):
        count = x.numel()
        if rate <= 0.0 or count == 0:
            out.append(x)
            continue
        draws = (count + 1) // 2
        bits = rng.draw(stream, torch.arange(at, at + draws, device=x.device))
        at += draws
        halves = torch.stack([bits & 0xFFFF_FFFF, rng.shr(bits, 32)], 1).reshape(-1)[:count]
        # The rate is an f32's value; its cut and factor as the Rust engine computes them (the
        # factor an f32, so a Python float holds it exactly: no host -> device copy per chunk).
        cut = int(rate * 4294967296.0)
        keep = float(np.float32(1.0) / (np.float32(1.0) - np.float32(rate)))
        mask = torch.where(halves < cut, 0.0, keep).reshape(x.shape)
        out.append(x * mask)
    return tuple(out)


def layouts(model: str) -> tuple[str, str]:
    """The coordinate layouts of node rows and relation rows."""
    return {
        "dot": ("real", "real"),
        "distmult": ("real", "real"),
        "transe": ("real", "real"),
        "complex": ("complex", "complex"),
        "rotate": ("complex", "skip"),
    }[model]


class Gathered:
    """The unique rows a chunk touches in a table (``keys``: row indices), as one leaf tensor
    whose gradient sums every use.

    The set is found by sorting the keys, with a fixed-size result: one leaf row per key, the
    first ``count`` of them the unique keys in ascending order (``torch.unique``'s), the rest
    unused (row 0, no use, no gradient). Nothing depends on the count on the host, so a chunk
    runs without a host synchronisation and can be captured in a CUDA graph."""

    def __init__(self, table: Table, keys: torch.Tensor):
        self.table = table
        self.keys, self.inverse, self.valid = unique_static(keys)
        self.leaf = table.params.index_select(0, self.keys).requires_grad_()

    def take(self, start: int, count: int) -> torch.Tensor:
        """Rows of uses ``start .. start + count`` of the keys given (their gradient is added
        back with ``index_add``: no sort, no synchronisation)."""
        return self.leaf.index_select(0, self.inverse[start : start + count])

    def step(self, lr: float) -> None:
        """Applies one Adagrad step per unique row with its summed gradient (``SharedRows::
        adagrad``: ``state + g^2`` then ``params - lr g / (sqrt(state) + eps)``; per row with the
        mean square for ``adagrad_row``).

        The steps are added (``index_add_``) at every leaf row's key: the unused ones have no
        gradient, so they add exact zeros (to row 0), and each used row gets one addend, so the
        sums are exactly the Rust engine's."""
        grad = self.leaf.grad
        row_wise = self.table.state.shape[1] == 1
        sq = (grad * grad).sum(1, keepdim=True) / grad.shape[1] if row_wise else grad * grad
        acc = self.table.state.index_select(0, self.keys) + sq
        update = lr / (acc.sqrt() + ADAGRAD_EPS) * grad if row_wise else lr * grad / (acc.sqrt() + ADAGRAD_EPS)
        self.table.state.index_add_(0, self.keys, sq)
        self.table.params.index_add_(0, self.keys, update, alpha=-1.0)


def unique_static(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(slots, inverse, valid)`` of int64 ``keys`` (``n``), each ``n`` long: ``slots[:count]``
    the distinct keys ascending and ``slots[count:]`` zero, ``inverse`` each key's slot, and
    ``valid`` the mask of the first ``count`` slots, where ``count`` stays on the device."""
    n = keys.numel()
    if n == 0:
        return keys, keys, keys.new_zeros(0, dtype=torch.bool)
    ordered, order = torch.sort(keys)
    first = torch.ones(n, dtype=torch.bool, device=keys.device)
    first[1:] = ordered[1:] != ordered[:-1]
    slot = torch.cumsum(first, 0) - 1
    inverse = torch.empty_like(slot).scatter_(0, order, slot)
    slots = torch.zeros_like(keys).scatter_(0, slot, ordered)
    valid = torch.arange(n, device=keys.device) <= slot[-1]
    return slots, inverse, valid


def train_chunk(
    ctx: Ctx, edges: torch.Tensor, weights: torch.Tensor | None, key: int | torch.Tensor
) -> tuple[torch.Tensor, int, float]:
    """Trains one chunk in place (``Worker::train_chunk``) with the chunk's random key (a
    ``u64``, or its int64 bit pattern in a 0-dim device tensor, as a captured CUDA graph takes
    it): returns its loss (summed over its sides, weights and regularizer included: a float64
    scalar on the device, which the caller adds up and reads once per piece), its positive
    edge-directions and its floating-point operations (``ScoreModel::flops`` per side).

    Except for ``corrupt = bernoulli`` (whose sides' sizes depend on the draws) nothing here
    reads a device value on the host."""
    sides = sides_of(ctx, edges, weights, key)
    node_keys, rel_keys, plan = [], [], []
    ends = ctx.layout[END_BASE]
    for k, side in enumerate(sides):
        s_end, s_col, d_end, rel_offset, reverse = orientation(ctx, side.tail)
        e = side.edges
        neg = negatives(ctx, side, k, key)
        node_keys += [ends[s_end] + e[:, s_col], ends[d_end] + e[:, 2 - s_col], neg]
        if ctx.rels is not None:
            rel_keys.append(e[:, 1] + rel_offset)
        plan.append((side, len(e), len(neg), reverse))
    nodes = Gathered(ctx.nodes, torch.cat(node_keys))
    rels = Gathered(ctx.rels, torch.cat(rel_keys)) if ctx.rels is not None else None
    total = torch.zeros((), dtype=torch.float64, device=edges.device)
    at, rel_at = 0, 0
    for k, (side, b, n, reverse) in enumerate(plan):
        s, t = nodes.take(at, b), nodes.take(at + b, b)
        neg = nodes.take(at + 2 * b, n)
        at += 2 * b + n
        if rels is not None:
            r = rels.take(rel_at, b)
            rel_at += b
            if reverse:
                r = reverse_relation(ctx.model, r)
        else:
            r = s.new_zeros((b, 0))
        # The scores see the dropped rows, the regularizer the rows as stored.
        ds, dt, dneg, dr = dropped(ctx, (s, t, neg, r), key, k)
        pos, neg_scores = scores(ctx, combine(ctx.model, ds, dr), t=dt, neg=dneg)
        terms = loss_terms(ctx, pos, neg_scores)
        if side.weights is not None:
            terms = terms * side.weights
        side_loss = terms.to(torch.float64).sum()
        total = total + side_loss + regularization(ctx, (s, t, r), k)
    total.backward()
    with torch.no_grad():
        nodes.step(ctx.lr)
        if rels is not None:
            rels.step(ctx.lr)
    return (total.detach(), *chunk_counts(ctx, len(edges)))


def chunk_counts(ctx: Ctx, b: int) -> tuple[int, float]:
    """``(directions, flops)`` of a chunk of ``b`` edges: each side trains every edge (the
    Bernoulli sides split them), ``ScoreModel::flops`` per side."""
    directions = 2 * b if ctx.corrupt == "both" else b
    return directions, 6.0 * directions * ctx.negatives * ctx.dim
