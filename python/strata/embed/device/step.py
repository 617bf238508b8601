"""The training step of the embedding engine on a torch device, the twin of the Rust worker's.

One chunk of one bucket, exactly as ``strata_embed``'s CPU worker trains it: the same shared
negatives (drawn through :mod:`strata.device.rng` from the chunk's streams, so a device picks
what the Rust engine picks), the same scores, losses and regularizers, and one Adagrad step per
touched row with the gradients of every side and role summed.

The sides of a chunk that share its edges (``corrupt = both``) are computed as one batch: their
rows stacked on a leading dimension of ``S`` sides, their scores batched matrix products, their
random draws one stream each of the same kernels. The bilinear models' gradients are written
out and reuse the forward results (Legend §6): with query rows ``a = phi(s, r)``, positive
scores ``a . t``, negative scores ``a N^T`` and the loss's gradients ``dpos`` and ``dneg`` of
them, ``da = dpos t + dneg N``, ``dt = dpos a``, ``dN = dneg^T a``, and ``phi``'s own (linear in
``s`` and in ``r``). TransE and RotatE take their scores' gradients from autograd.

Shapes: node rows ``dim`` floats, relation rows ``rel_dim``; ``edges`` is ``b x 3`` int64
``(source local row, relation, destination local row)``; ``weights`` ``b`` floats or ``None``;
a chunk's ``n`` negatives per side (``S x n x dim``), or with ``shared_negatives = false`` each
edge's own ``n`` (``S x b x n x dim``; the products become batched over the edges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from strata.device import kernels, rng
from strata.embed.device import bilinear_rows, complex_rows, pbg_rows, softmax_loss
from strata.embed.device import chunk_keys as fused_keys
from strata.embed.device.rows import Bank, Banked, Feat, Featurized, Gathered, Table, featurized_ends

#: Added under square roots of distances, as the Rust models do.
EPS = 1e-9

#: The score models the device step implements.
MODELS = ("dot", "distmult", "complex", "transe", "rotate", "pbg")
#: The query models whose scores are products of query rows and targets (gradients written
#: out): the named models, and ``pbg`` with their operators and comparator ``dot``.
BILINEAR = ("dot", "distmult", "complex")
#: Streams a chunk draws from: ``derive(key, k)`` for its sides ``k = 0, 1`` and, with
#: ``corrupt = bernoulli``, for the choice of sides (``k = 2``).
STREAMS = 3
#: A chunk's streams tensor holds its key after the streams: the salt of a bf16 table's
#: stochastic rounding (``SharedRows::adagrad``'s).
SALT = STREAMS


def query_model(model: str, operator: str | None) -> str:
    """The model whose query rows ``phi(s, r)`` a model computes: itself, or a ``pbg`` model's
    operator's (:data:`pbg_rows.QUERY`)."""
    return pbg_rows.QUERY[operator] if model == "pbg" else model


def rel_dim(query: str, dim: int) -> int:
    """Reals per relation row of query model ``query`` (:func:`query_model`) at node dimension
    ``dim``."""
    if query in ("linear", "affine"):
        return pbg_rows.rel_dim(query, dim)
    return {"dot": 0, "distmult": dim, "complex": dim, "transe": dim, "rotate": dim // 2}[query]


def check_model(model: str) -> None:
    """Raises a ``ValueError`` naming ``model`` when the device step does not implement it."""
    if model not in MODELS:
        raise ValueError(
            f"model {model} is not supported with a torch device (supported: {', '.join(MODELS)});"
            " train it with device = cpu (the Rust engine)"
        )


#: Where ``Ctx.layout`` holds each value: the buffer rows where the bucket's source and
#: destination partitions start (``END_BASE``), their rows (``END_ROWS``), the rows of every
#: resident partition (``RESIDENT_ROWS``), then the negative pool's table (``POOL``: for
#: ``resident`` each partition's end in the resident rows then its buffer row less its start
#: there; for ``all`` each partition id's first buffer row, -1 for one on disk, and with banks
#: then each partition's rows in its bank; for ``typed`` :func:`typed_table`).
END_BASE, END_ROWS, RESIDENT_ROWS, POOL = slice(0, 2), slice(2, 4), 4, 5


def layout(
    pool: str,
    bases: list[int],
    sizes: list[int],
    bucket: tuple[int, int],
    part_of: list | None,
    typed_spans: list | None = None,
    feat: Feat | None = None,
    bank: Bank | None = None,
    bank_lens: list[int] | None = None,
) -> list[int]:
    """The values of ``Ctx.layout`` for resident partitions of ``sizes`` rows starting at buffer
    rows ``bases``, the bucket's source and destination partitions ``bucket`` (indices in them),
    ``part_of`` each partition id's index (``None``: on disk), a typed run's ``typed_spans`` and
    featurized entities ``feat``, and the negative banks and each partition's rows in them
    (see :data:`END_BASE`)."""
    src, dst = bucket
    ends = [bases[src], bases[dst], sizes[src], sizes[dst], sum(sizes)]
    if pool == "resident":
        starts = np.cumsum([0, *sizes]).tolist()
        return ends + starts[1:] + [b - a for b, a in zip(bases, starts, strict=False)]
    if pool == "all":
        return ends + [-1 if p is None else bases[p] for p in part_of] + (bank_lens or [])
    if pool == "typed":
        return ends + typed_table(bases, typed_spans, feat, bank)
    return ends


def typed_table(bases: list[int], spans: list, feat: Feat | None = None, bank: Bank | None = None) -> list[int]:
    """A typed run's negatives in ``Ctx.layout``: for tail then head corruption, ``L`` running
    ends of its spans' entities, ``L`` shifts and ``L`` bank rows. A draw ``w`` in the span whose
    end first passes it is key ``w + shift`` (a buffer row, or a featurized entity's key from
    ``feat.first``) where the span has no bank rows; in a span of a partition on disk it is key
    ``shift + j`` of its bank, row ``j`` picked among its bank rows by the rest of the draw.
    ``spans`` holds each side's ``(part, first row, entities, bank)`` in draw order (the Rust
    ``NegSpace::spans``; ``bank`` ``None`` or ``(partition, first bank row, bank rows)``; a
    type's span lies wholly before or after the pinned region's first featurized row); both
    sides are padded to one ``L`` with empty spans at their total, which no draw below it
    reaches."""
    width = max(1, *(len(side) for side in spans))
    out = []
    for side in spans:
        ends, shifts, lens, total = [], [], [], 0
        for part, first, entities, banked in side:
            if banked is not None:
                partition, at, _ = banked
                shifts.append(bank.first + partition * bank.capacity + at)
            elif feat is not None and part == feat.part and first >= feat.plain:
                shifts.append(feat.first + first - feat.plain - total)
            else:
                shifts.append(bases[part] + first - total)
            lens.append(0 if banked is None else banked[2])
            total += entities
            ends.append(total)
        pad = width - len(side)
        out += ends + [total] * pad + shifts + [0] * pad + lens + [0] * pad
    return out


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
    #: Negatives per chunk (or per edge) of the side that corrupts tails.
    negatives: int
    degree_fraction: float
    pool: str
    layout: torch.Tensor
    part_size: int
    num_nodes: int
    reg: str
    reg_weight: float
    #: Whether the node table is the run's one slot, so that no copy writes the buffer while a
    #: step runs (out of core the next partition is copied into a free slot meanwhile): only
    #: then may the node rows take the every-row Adagrad step (:meth:`Gathered.of`).
    alone: bool = False
    #: Whether a side's edges share its negatives (false: each edge draws its own).
    shared_negatives: bool = True
    #: Negatives of the side that corrupts heads (``negatives_head``; ``None``: ``negatives``).
    negatives_head: int | None = None
    #: LibKGE's weighted form (``reg_weighted``), and the relation rows' own weight
    #: (``relation_reg_weight``; ``None``: ``reg_weight``).
    reg_weighted: bool = False
    rel_reg_weight: float | None = None
    #: Dropout rates of gathered entity and relation rows (``entity_dropout``,
    #: ``relation_dropout``).
    entity_dropout: float = 0.0
    relation_dropout: float = 0.0
    #: ``dropout_masks = "independent"`` (LibKGE's): the positives' source and relation rows
    #: dropped again with masks of their own (:func:`independent_grads`).
    independent_masks: bool = False
    #: 1vsAll and KvsAll (:mod:`strata.embed.device.vs_all`): ``training``,
    #: ``label_smoothing``, whether ``reg_scope = "table"``, the buffer rows of the candidates
    #: (every resident partition's rows, in the context's order of partitions), the candidate
    #: index of the bucket's source and destination partitions' first rows, and KvsAll's
    #: answers of each side (``vs_all.Answers``).
    training: str = "negative_sampling"
    label_smoothing: float = 0.0
    reg_table: bool = False
    cand_rows: torch.Tensor | None = None
    cand_first: tuple[int, int] = (0, 0)
    answers: tuple | None = None
    #: A typed run's featurized entities (:class:`rows.Feat`), or ``None``.
    feat: Feat | None = None
    #: ``model = "pbg"``: its ``operator`` and ``comparator`` (``None`` for the named models).
    operator: str | None = None
    comparator: str | None = None
    #: ``pool = "all"`` with partitions on disk: their negative banks (:class:`rows.Bank`).
    bank: Bank | None = None

    @property
    def query(self) -> str:
        """The model whose query rows ``phi(s, r)`` the run computes (:func:`query_model`)."""
        return query_model(self.model, self.operator)

    @property
    def bilinear(self) -> bool:
        """Whether scores are products of query rows and targets (:data:`BILINEAR`)."""
        return self.query in BILINEAR and self.comparator in (None, "dot")

    @property
    def rel_dim(self) -> int:
        return rel_dim(self.query, self.dim)


@dataclass
class Stack:
    """Sides of a chunk trained as one batch over the same edges: ``sides`` their orientations
    (0: tail corruption, scoring ``(s, r, t')``, its sources the edges' source end; 1: head
    corruption, ``(t, r^-1, s')``, its sources the destination end) and ``streams`` (``S x 1``
    int64) each side's ``derive(key, k)``."""

    sides: list[int]
    streams: torch.Tensor
    edges: torch.Tensor
    weights: torch.Tensor | None


def piece_streams(key: int, chunks: int) -> np.ndarray:
    """The random streams of a piece's chunks, on the host (``chunks x (STREAMS + 1)`` int64
    bit patterns): row ``c`` holds chunk ``c``'s streams ``derive(derive(key, c), k)`` and, at
    :data:`SALT`, its key ``derive(key, c)``. Copied to the device once a piece, so that a
    chunk's replay copies its row in one launch (four fills a chunk took about 34 us of host
    time on an H200's host); derived over the whole piece at once (a loop over B1's 273 chunks
    took about 1 ms of the host's time a piece)."""
    chunk_keys = rng.derive_host(key, np.arange(chunks, dtype=np.uint64))
    rows = np.empty((chunks, STREAMS + 1), dtype=np.uint64)
    rows[:, :STREAMS] = rng.derive_host(chunk_keys[:, None], np.arange(STREAMS, dtype=np.uint64))
    rows[:, SALT] = chunk_keys
    return rows.view(np.int64)


def stacks_of(ctx: Ctx, edges: torch.Tensor, weights: torch.Tensor | None, streams: torch.Tensor) -> list[Stack]:
    """The sides of a chunk in training order (``Worker::train_chunk``'s, side ``k`` drawing
    from stream ``k``): one stack of them over the chunk's edges, or with ``corrupt =
    bernoulli`` one stack per side over the edges it drew."""
    column = streams[:, None]
    if ctx.corrupt == "both" and side_negatives(ctx, 0) != side_negatives(ctx, 1):
        # Sides of different negative counts cannot share one batch: a stack each.
        return [Stack([k], column[k : k + 1], edges, weights) for k in (0, 1)]
    if ctx.corrupt != "bernoulli":
        sides = {"both": [0, 1], "tail": [0], "head": [1]}[ctx.corrupt]
        return [Stack(sides, column[: len(sides)], edges, weights)]
    # Edge i's head is corrupted when draw i of stream 2 is below its relation's probability.
    u = rng.unit(rng.draw(streams[2], torch.arange(len(edges), device=edges.device)))
    head = u < ctx.head_prob[edges[:, 1]].to(torch.float64)
    out = []
    for side, mask in ((0, ~head), (1, head)):
        if bool(mask.any()):
            k = len(out)
            out.append(Stack([side], column[k : k + 1], edges[mask], None if weights is None else weights[mask]))
    return out


def side_negatives(ctx: Ctx, side: int) -> int:
    """Negatives per chunk (or per edge) of side ``side`` (0: tail corruption, 1: head)."""
    return ctx.negatives if side == 0 or ctx.negatives_head is None else ctx.negatives_head


def stack_negatives(ctx: Ctx, stack: Stack) -> int:
    """Negatives per chunk (or per edge) of each of a stack's sides, which :func:`stacks_of`
    gives one count."""
    return side_negatives(ctx, stack.sides[0])


def pick(x: torch.Tensor, sides: list[int]) -> torch.Tensor:
    """``x[sides]`` of a tensor over the two ends (first dimension): a view unless reversed."""
    if sides == [1, 0]:
        return x.flip(0)
    return x[sides[0] : sides[0] + len(sides)]


def other(sides: list[int]) -> list[int]:
    """The ends of the sides' targets."""
    return [1 - side for side in sides]


def keys_of(ctx: Ctx, stack: Stack) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stack's buffer rows of its sides' sources and targets (``S x b`` each: a tail side's
    sources are the edges' sources, a head side's their destinations), of its negatives (``S x
    n``) and of its relation rows (``S x b``)."""
    e = stack.edges
    local = e[:, ::2].T
    ends = local + ctx.layout[END_BASE][:, None]
    if ctx.feat is not None:
        ends = featurized_ends(ctx.feat, local, ends)
    targets = pick(ends, other(stack.sides))
    rels = [e[:, 1] + (ctx.inverse_offset if side else 0) for side in stack.sides]
    return pick(ends, stack.sides), targets, negatives(ctx, stack, targets), torch.stack(rels)


def chunk_keys(ctx: Ctx, stacks: list[Stack]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunk's node keys (each stack's :func:`keys_of` sources, targets and negatives,
    flattened, stack after stack) and relation keys (``None`` without relation rows): one
    Triton kernel on ``cuda`` (:mod:`chunk_keys`) for one stack drawing its negatives uniformly
    from the bucket's target partition or the resident partitions, the twin's ops otherwise
    (:func:`twin_keys`)."""
    stack = stacks[0] if len(stacks) == 1 else None
    shared = ctx.shared_negatives
    fused_pool = ctx.pool in ("partition", "resident")
    n = 0 if stack is None else stack_negatives(ctx, stack)
    if stack is None or not fused_pool or degree_negatives(ctx, n) or not len(stack.edges) or not shared:
        return twin_keys(ctx, stacks)

    def kernel():
        keys = fused_keys.kernel_keys(stack.edges, ctx.layout, stack.streams.reshape(-1), stack.sides[0],
                                      n, ctx.rels is not None, ctx.inverse_offset,
                                      resident=ctx.pool == "resident")  # fmt: skip
        split = len(stack.sides) * (2 * len(stack.edges) + n)
        return keys[:split], None if ctx.rels is None else keys[split:]

    return kernels.fused("chunk keys", stack.edges.device, kernel, lambda: twin_keys(ctx, stacks))


def twin_keys(ctx: Ctx, stacks: list[Stack]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`chunk_keys` as torch ops, for any stacks and negative pool."""
    keys = [keys_of(ctx, stack) for stack in stacks]
    node = cat([k.reshape(-1) for *ends_and_negs, _ in keys for k in ends_and_negs])
    return node, None if ctx.rels is None else cat([r.reshape(-1) for *_, r in keys])


def degree_negatives(ctx: Ctx, n: int) -> int:
    """How many of a side's ``n`` negatives are drawn among its edges' targets
    (``degree_fraction``: the f32 product, rounded half away from zero, as the Rust worker)."""
    return min(n, math.floor(float(np.float32(n) * np.float32(ctx.degree_fraction)) + 0.5))


def negative_draws(ctx: Ctx, b: int, n: int) -> int:
    """Random draws a side's ``n`` negatives take of its stream with ``b`` edges: ``n``, or
    ``b x n`` when each edge draws its own."""
    return n if ctx.shared_negatives else b * n


def negatives(ctx: Ctx, stack: Stack, targets: torch.Tensor) -> torch.Tensor:
    """The buffer rows of each side's negatives, drawn from its stream: a degree-weighted part
    (among ``targets``, ``S x b``: the side's edges' targets) then uniform from the pool; the
    chunk's shared ``n`` (``S x n``), or each edge's, one set after another (``S x b n``)."""
    if not ctx.shared_negatives:
        return edge_negatives(ctx, stack, targets)
    n = stack_negatives(ctx, stack)
    n_degree = degree_negatives(ctx, n)
    out = []
    if n_degree:
        out.append(targets.gather(1, rng.draw_below(stack.streams, 0, n_degree, targets.shape[1])))
    draws = rng.draw_below(stack.streams, n_degree, n - n_degree, pool_rows(ctx, stack))
    out.append(uniform_rows(ctx, stack, draws, n_degree))
    return torch.cat(out, 1) if len(out) > 1 else out[0]


def edge_negatives(ctx: Ctx, stack: Stack, targets: torch.Tensor) -> torch.Tensor:
    """:func:`negatives` per edge (``S x b n``): set ``i``'s draw ``j`` is the stream's draw
    ``i n + j``, degree-weighted for ``j`` below the degree count, so that the bounds of one
    kernel's draws differ by position."""
    n = stack_negatives(ctx, stack)
    n_degree = degree_negatives(ctx, n)
    b = targets.shape[1]
    if not n_degree:
        return uniform_rows(ctx, stack, rng.draw_below(stack.streams, 0, b * n, pool_rows(ctx, stack)), 0)
    degree = (torch.arange(b * n, device=targets.device) % n < n_degree)[None, :]
    bound = torch.where(degree, b, pool_rows(ctx, stack))
    r = rng.draw_below(stack.streams, 0, b * n, bound.expand(len(stack.sides), -1).contiguous())
    by_degree = targets.gather(1, torch.where(degree, r, 0))
    return torch.where(degree, by_degree, uniform_rows(ctx, stack, torch.where(degree, 0, r), 0))


def pool_rows(ctx: Ctx, stack: Stack) -> torch.Tensor | int:
    """How many rows a uniform negative is drawn among: the target partition's (``S x 1``),
    the resident rows (a 0-dim tensor), every node, or a typed run's side's entities (``S x
    1``)."""
    if ctx.pool == "partition":
        return pick(ctx.layout[END_ROWS], other(stack.sides))[:, None]
    if ctx.pool == "resident":
        return ctx.layout[RESIDENT_ROWS]
    if ctx.pool == "typed":
        return typed_sides(ctx, stack)[:, 0, -1:]
    return ctx.num_nodes


def uniform_rows(ctx: Ctx, stack: Stack, r: torch.Tensor, first: int) -> torch.Tensor:
    """The buffer rows (or bank keys) of uniform draws ``r`` (``S x count``, each below
    :func:`pool_rows`), draws ``first ..`` of the stack's streams."""
    if ctx.pool == "partition":
        return pick(ctx.layout[END_BASE], other(stack.sides))[:, None] + r
    if ctx.pool == "resident":
        table = ctx.layout[POOL:]
        ends, shift = table[: len(table) // 2], table[len(table) // 2 :]
        return r + shift[torch.searchsorted(ends, r, right=True)]
    if ctx.pool == "typed":
        return typed_rows(ctx, stack, r, first)
    if ctx.bank is None:
        return ctx.layout[POOL:][r // ctx.part_size] + r % ctx.part_size
    # A node of a partition on disk is the key of its bank's row the rest of its draw picks.
    table = ctx.layout[POOL:]
    bases, lens = table[: len(table) // 2], table[len(table) // 2 :]
    part = r // ctx.part_size
    row = rng.below(rests(stack, first, r, ctx.num_nodes), lens[part])
    bank_key = ctx.bank.first + part * ctx.bank.capacity + row
    return torch.where(bases[part] >= 0, bases[part] + r % ctx.part_size, bank_key)


def typed_rows(ctx: Ctx, stack: Stack, r: torch.Tensor, first: int) -> torch.Tensor:
    """:func:`uniform_rows` of a typed run, through its sides' spans (:func:`typed_table`)."""
    table = typed_sides(ctx, stack)
    span = torch.searchsorted(table[:, 0].contiguous(), r, right=True)
    shift = table[:, 1].gather(1, span)
    if ctx.bank is None:
        return r + shift
    rows = table[:, 2].gather(1, span)
    row = rng.below(rests(stack, first, r, table[:, 0, -1:]), rows)
    return torch.where(rows > 0, shift + row, r + shift)


def rests(stack: Stack, first: int, r: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """The rests of draws ``first ..`` of the stack's streams (``S x count`` like ``r``, the
    draws below ``n``): the low 64 bits of each draw times ``n`` (``Rng::below_and_rest``; int64
    products wrap), uniform bits for a second choice."""
    return rng.draw(stack.streams, torch.arange(first, first + r.shape[1], device=r.device)) * n


def typed_sides(ctx: Ctx, stack: Stack) -> torch.Tensor:
    """The stack's sides' rows of a typed run's :func:`typed_table` (``S x 3 x L``: ends,
    shifts, bank rows): a side draws among its own corrupted end's type."""
    return pick(ctx.layout[POOL:].view(2, 3, -1), stack.sides)


def reverse_relation(query: str, rows: torch.Tensor) -> torch.Tensor:
    """The rows that score ``(t, r', h)`` like a tail query (``ScoreModel::reverse_relation``) of
    query model ``query``: a linear map that is its own inverse and transpose."""
    if query in ("transe", "rotate"):
        return -rows
    if query == "complex":
        return complex_rows.conj(rows)
    if query == "linear":
        return pbg_rows.transpose(rows)
    return rows


def oriented(ctx: Ctx, rows: torch.Tensor, sides: list[int]) -> torch.Tensor:
    """Relation rows (``S x b x rel_dim``) as each side scores them: a head side's reversed when
    the relations have no inverse rows. Maps their gradients back too (the map is its own
    transpose)."""
    if ctx.inverse_offset != 0 or ctx.rel_dim == 0 or 1 not in sides:
        return rows
    if len(sides) == 1:
        return reverse_relation(ctx.query, rows)
    return torch.cat([rows[:1], reverse_relation(ctx.query, rows[1:])])


def combine(query: str, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The query rows ``a = phi(s, r)`` (``... x dim``) of query model ``query``."""
    if query in BILINEAR:
        return bilinear_rows.combine(query, s, r)
    if query == "transe":
        return s + r
    if query in ("linear", "affine"):
        return pbg_rows.combine(query, s, r)
    # RotatE: r holds phases.
    return complex_rows.twin(s, torch.cat([torch.cos(r), torch.sin(r)], -1))


def combine_grads(query: str, s: torch.Tensor, r: torch.Tensor, da: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``s`` and ``r`` of :func:`combine` given ``da``, for the query models
    that score by products (every one but RotatE's)."""
    if query in BILINEAR:
        return bilinear_rows.combine_grads(query, s, r, da)
    if query == "transe":
        return da, da
    return pbg_rows.combine_grads(query, s, r, da)


def per_edge(a: torch.Tensor, neg: torch.Tensor) -> bool:
    """Whether ``neg`` holds each query row's own negatives (``S x b x n x dim`` beside ``a``'s
    ``S x b x dim``) rather than the chunk's shared ones (``S x n x dim``)."""
    return neg.dim() == a.dim() + 1


def products(a: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``a . neg_j`` of each query row and its negatives: ``S x b x n``."""
    return (neg @ a[..., None]).squeeze(-1) if per_edge(a, neg) else a @ neg.mT


def products_back(dneg: torch.Tensor, a: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`products` from ``dneg`` (``S x b x n``): of ``a`` and of ``neg``."""
    if per_edge(a, neg):
        return (dneg[..., None, :] @ neg).squeeze(-2), dneg[..., None] * a[..., None, :]
    return dneg @ neg, dneg.mT @ a


def pair_scores(ctx: Ctx, a: torch.Tensor, t: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TransE's and RotatE's positive scores (``S x b``) and negative scores (``S x b x n``) of
    query rows ``a`` (``S x b x dim``), targets ``t`` and negatives ``neg`` (``S x n x dim``, or
    per edge ``S x b x n x dim``)."""
    if ctx.model == "transe" and ctx.transe_norm == 2:
        return pair_pos(ctx, a, t), -(squared_distances(a, neg) + EPS).sqrt()
    pairs = a[..., :, None, :] - (neg if per_edge(a, neg) else neg[..., None, :, :])
    return pair_pos(ctx, a, t), pair_distance(ctx, pairs)


def squared_distances(a: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``|a_i - neg_j|^2`` (``S x b x n``, or ``q x n`` of ``q`` query rows against ``n`` rows)
    from :func:`products` and the squared norms, clamped at 0 (as the Rust scorers)."""
    a_sq, n_sq = (a * a).sum(-1), (neg * neg).sum(-1)
    n_sq = n_sq if per_edge(a, neg) else n_sq[..., None, :]
    return (products(a, neg) * -2.0 + a_sq[..., :, None] + n_sq).clamp(min=0.0)


def pbg_scores(
    comparator: str, a: torch.Tensor, neg: torch.Tensor, t: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """A ``pbg`` model's scores of query rows ``a`` under ``comparator``: against their targets
    ``t`` (``S x b``; ``None`` without ``t``) and against ``neg`` (``S x b x n``: shared ``S x n x
    dim`` or per edge ``S x b x n x dim``; or ``q x n`` of ``q x dim`` rows against ``n x dim``).
    ``cos`` compares rows scaled to unit length; ``squared_l2`` and ``l2`` score minus the
    (squared) distance, the negatives' expanded into products (``Pbg::step``)."""
    if comparator == "cos":
        a, neg = pbg_rows.unit(a), pbg_rows.unit(neg)
        t = None if t is None else pbg_rows.unit(t)
    if comparator in ("dot", "cos"):
        return None if t is None else (a * t).sum(-1), products(a, neg)

    def score(sq: torch.Tensor) -> torch.Tensor:
        return -sq if comparator == "squared_l2" else -(sq + EPS).sqrt()

    return None if t is None else score(((a - t) ** 2).sum(-1)), score(squared_distances(a, neg))


def pair_pos(ctx: Ctx, a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """TransE's and RotatE's positive scores (``S x b``) of query rows ``a`` and targets ``t``."""
    if ctx.model == "transe" and ctx.transe_norm == 2:
        return -(((a - t) ** 2).sum(-1) + EPS).sqrt()
    return pair_distance(ctx, a - t)


def pair_distance(ctx: Ctx, diff: torch.Tensor) -> torch.Tensor:
    """Minus the distance of differences ``diff`` (``... x dim``): TransE-L1's, or RotatE's sum
    of complex moduli."""
    if ctx.model == "transe":
        return -diff.abs().sum(-1)
    h = diff.shape[-1] // 2
    return -((diff[..., :h] ** 2 + diff[..., h:] ** 2 + EPS).sqrt()).sum(-1)


def loss_grads(
    ctx: Ctx, pos: torch.Tensor, neg: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sides' loss (float64 scalar: each edge's term, times its weight, summed) of positive
    scores ``pos`` (``S x b``) and negative scores ``neg`` (``S x b x n``), and its gradients
    of them."""
    if ctx.loss == "softmax":
        terms, dpos, dneg = softmax_loss.loss_grads(pos, neg, weights)
        return terms.sum(), dpos, dneg
    if ctx.loss in ("logistic", "margin"):
        # n softmax(alpha scores), a constant in the gradient (RotatE's detach).
        adv = None if ctx.adversarial is None else torch.softmax(ctx.adversarial * neg, -1) * neg.shape[-1]
        if ctx.loss == "logistic":
            u = 1.0 / neg.shape[-1] if adv is None else adv / neg.shape[-1]
            x, y = -(pos + ctx.gamma), neg + ctx.gamma
            terms = F.softplus(x, threshold=20.0) + (F.softplus(y, threshold=20.0) * u).sum(-1)
            dpos, dneg = -softplus_grad(x), softplus_grad(y) * u
        else:
            h = F.relu(ctx.margin - pos[..., None] + neg)
            terms = (h if adv is None else h * adv).sum(-1)
            dneg = (h > 0).to(h.dtype) if adv is None else torch.where(h > 0, adv, 0.0)
            dpos = -dneg.sum(-1)
    else:
        raise ValueError(f"loss {ctx.loss} is not supported with a torch device")
    if weights is not None:
        terms, dpos, dneg = terms * weights, dpos * weights, dneg * weights[:, None]
    return terms.to(torch.float64).sum(), dpos, dneg


def softplus_grad(x: torch.Tensor) -> torch.Tensor:
    """``softplus(x)``'s derivative with torch's threshold 20 (linear above it)."""
    return torch.where(x > 20.0, 1.0, torch.sigmoid(x))


def score_grads(
    ctx: Ctx, s: torch.Tensor, t: torch.Tensor, neg: torch.Tensor, r: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """``(loss, ds, dt, dneg, dr)``: the sides' loss of their sources ``s`` and targets ``t``
    (``S x b x dim``), negatives ``neg`` (``S x n x dim``) and relation rows ``r`` (``S x b x
    rel_dim``) as scored, and its gradients of each."""
    if ctx.bilinear:
        a, pos = bilinear_rows.query_pos(ctx.query, s, r, t)
        loss, dpos, dneg = loss_grads(ctx, pos, products(a, neg), weights)
        da0, d_neg = products_back(dneg, a, neg)
        ds, dt, dr = bilinear_rows.row_grads(ctx.query, da0, dpos, s, r, t, a)
        return loss, ds, dt, d_neg, dr
    leaves = [x.detach().requires_grad_() for x in (s, t, neg, r)]
    with torch.enable_grad():
        a = combine(ctx.query, leaves[0], leaves[3])
        if ctx.model == "pbg":
            pos, neg_scores = pbg_scores(ctx.comparator, a, leaves[2], leaves[1])
        else:
            pos, neg_scores = pair_scores(ctx, a, leaves[1], leaves[2])
    loss, dpos, dneg = loss_grads(ctx, pos.detach(), neg_scores.detach(), weights)
    # Zeros for relation rows that do not score (pbg's operator none has none).
    grads = torch.autograd.grad((pos, neg_scores), leaves, (dpos, dneg), allow_unused=True, materialize_grads=True)
    return loss, *grads


def independent_grads(
    ctx: Ctx,
    s: torch.Tensor,
    t: torch.Tensor,
    neg: torch.Tensor,
    r: torch.Tensor,
    pos_query: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """:func:`score_grads` with the positives scored from their own source and relation rows
    ``pos_query`` (``dropout_masks = "independent"``: the Rust model's ``pos_query``) and the
    negatives from ``s`` and ``r``: ``(loss, ds, dt, dneg, dr, ds_pos, dr_pos)``."""
    s_p, r_p = pos_query
    if ctx.model in BILINEAR:
        a, a_p = bilinear_rows.combine(ctx.model, s, r), bilinear_rows.combine(ctx.model, s_p, r_p)
        loss, dpos, dneg = loss_grads(ctx, (a_p * t).sum(-1), products(a, neg), weights)
        da0, d_neg = products_back(dneg, a, neg)
        ds, dr = bilinear_rows.combine_grads(ctx.model, s, r, da0)
        ds_p, dr_p = bilinear_rows.combine_grads(ctx.model, s_p, r_p, dpos[..., None] * t)
        return loss, ds, dpos[..., None] * a_p, d_neg, dr, ds_p, dr_p
    leaves = [x.detach().requires_grad_() for x in (s, t, neg, r, s_p, r_p)]
    with torch.enable_grad():
        pos = pair_pos(ctx, combine(ctx.model, leaves[4], leaves[5]), leaves[1])
        neg_scores = pair_scores(ctx, combine(ctx.model, leaves[0], leaves[3]), leaves[1], leaves[2])[1]
    loss, dpos, dneg = loss_grads(ctx, pos.detach(), neg_scores.detach(), weights)
    return loss, *torch.autograd.grad((pos, neg_scores), leaves, (dpos, dneg))


def regularize(ctx: Ctx, rows: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...], which: list) -> tuple:
    """``(term, grads)``: the sides' regularization term (``model::regularize``, float64;
    ``None`` without one, sparing a kernel that adds zero) of their source, target and relation
    rows as stored (``rows``, ``S x b x .``), and ``grads`` (theirs) with its gradients added:
    side ``i``'s ``w / b`` times ``sum R`` of each (weighted: ``w / p``), relation rows with
    their own weight, of the rows ``which`` names (:func:`reg_rows` of each side: whether it
    penalises its entity rows and its relation rows)."""
    b = rows[0].shape[1]
    rel_weight = ctx.reg_weight if ctx.rel_reg_weight is None else ctx.rel_reg_weight
    if ctx.reg == "none" or (ctx.reg_weight == 0.0 and rel_weight == 0.0) or b == 0:
        return None, grads
    total = rows[0].new_zeros((), dtype=torch.float64)
    scale = 1.0 / POWER[ctx.reg] if ctx.reg_weighted else 1.0 / b
    node_layout, rel_layout = layouts(ctx.query)
    roles = [(node_layout, ctx.reg_weight)] * 2 + [(rel_layout, rel_weight if ctx.rel_dim else 0.0)]
    added: list[list] = [[None] * len(rows[0]) for _ in roles]
    for i in range(len(rows[0])):
        for role, (layout_of, weight) in enumerate(roles):
            if weight == 0.0 or layout_of == "skip" or not which[i][role == 2]:
                continue
            value, dx = norm(ctx, rows[role][i], layout_of)
            total = total + (value * (weight * scale)).to(torch.float64)
            added[role][i] = dx * (weight * scale)
    out = []
    for grad, x, adds in zip(grads, rows, added, strict=True):
        if any(a is not None for a in adds):
            # Added out of place: autograd may hand one tensor for two rows' gradients.
            grad = grad + torch.stack([torch.zeros_like(x[i]) if a is None else a for i, a in enumerate(adds)])
        out.append(grad)
    return total, tuple(out)


def reg_rows(ctx: Ctx, repeat: bool) -> tuple[bool, bool]:
    """Whether a side penalises its entity rows and its relation rows (``Regularizer::rows``):
    with ``reg_scope = "table"`` its relations only (every entity row is penalised once per
    chunk); in the weighted form a side whose edges another side of the chunk trained already
    (``repeat``) only its relation rows, and those only when they are its own (the inverses)."""
    if ctx.reg_table:
        return False, True
    if ctx.reg_weighted and repeat:
        return False, ctx.inverse_offset != 0
    return True, True


#: The ``p`` of each regularizer's norm (``R(x) = |x|^p``): the weighted form divides by it.
POWER = {"n3": 3.0, "l2": 2.0}


def norm(ctx: Ctx, rows: torch.Tensor, layout_of: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum R(x)`` over ``rows`` (N3: cubes of magnitudes, L2: squares; complex rows take the
    modulus of each coordinate) and its gradient (N3: ``3 |x| x``, L2: ``2 x``)."""
    if layout_of == "complex":
        h = rows.shape[-1] // 2
        sq = rows[..., :h] ** 2 + rows[..., h:] ** 2
        per_real = torch.cat([sq, sq], -1)
    else:
        sq = per_real = rows * rows
    if ctx.reg == "n3":
        # m^3 as (m^2)^1.5, its gradient 3 m x (finite at 0, where sqrt's is not).
        return (sq**1.5).sum(), 3.0 * per_real.sqrt() * rows
    return sq.sum(), 2.0 * rows


def dropout(ctx: Ctx, rows: tuple[torch.Tensor, ...], streams: torch.Tensor, first_draw: int) -> tuple[tuple, list]:
    """The sides' source, target, negative and relation rows (``S x ...``) with inverted dropout
    (``model::dropout``), and each one's mask (``None``: no dropout): each real kept with its
    factor ``1 / (1 - rate)`` unless its 32 random bits fall below ``rate * 2^32``, two reals a
    draw, the masks drawn in the Rust worker's order (source, target, negatives at the entity
    rate, then relations, then with independent masks the positives' own source and relation
    rows: ``rows`` holds four or six) from each side's stream from draw ``first_draw`` on (in
    negative sampling after its negatives' draws, :func:`negative_draws`): all of them one draw
    of every side's stream."""
    entity, relation = ctx.entity_dropout, ctx.relation_dropout
    # Source, target, negatives, relations; with independent masks the positives' source and
    # relation rows after them.
    rates = (entity, entity, entity, relation, entity, relation)[: len(rows)]
    blocks = [(i, x[0].numel()) for i, x in enumerate(rows) if rates[i] > 0.0 and x[0].numel()]
    masks: list = [None] * len(rows)
    if not blocks:
        return rows, masks
    draws = [(count + 1) // 2 for _, count in blocks]
    bits = rng.draw(streams, torch.arange(first_draw, first_draw + sum(draws), device=streams.device))
    halves = torch.stack([bits & 0xFFFF_FFFF, rng.shr(bits, 32)], -1).reshape(len(streams), -1)
    out, start = list(rows), 0
    for (i, count), n in zip(blocks, draws, strict=True):
        # The rate is an f32's value; its cut and factor as the Rust engine computes them (the
        # factor an f32, so a Python float holds it exactly: no host -> device copy per chunk).
        cut = int(rates[i] * 4294967296.0)
        keep = float(np.float32(1.0) / (np.float32(1.0) - np.float32(rates[i])))
        masks[i] = torch.where(halves[:, 2 * start : 2 * start + count] < cut, 0.0, keep).view(rows[i].shape)
        out[i] = rows[i] * masks[i]
        start += n
    return tuple(out), masks


def layouts(query: str) -> tuple[str, str]:
    """The coordinate layouts of node rows and relation rows of query model ``query`` (a
    ``pbg`` model's are its operator's: ComplEx's for ``complex_diagonal``, real otherwise)."""
    if query == "complex":
        return "complex", "complex"
    return ("complex", "skip") if query == "rotate" else ("real", "real")


def train_stack(
    ctx: Ctx, stack: Stack, s: torch.Tensor, t: torch.Tensor, neg: torch.Tensor, rels: torch.Tensor
) -> tuple:
    """``(loss, ds, dt, d neg, d rels)``: a stack's loss (float64 scalar) and its gradients of
    the rows of its sides' sources and targets (``S x b x dim``), its negatives (``S x n x
    dim``, or per edge ``S x b x n x dim``) and its relation rows (``S x b x rel_dim``, as
    stored)."""
    r = oriented(ctx, rels, stack.sides)
    first_draw = negative_draws(ctx, s.shape[1], stack_negatives(ctx, stack))
    # The scores see the dropped rows, the regularizer the rows as stored. Independent masks
    # drop the positives' source and relation rows again (after the others, as the Rust worker).
    if ctx.independent_masks:
        dropped, masks = dropout(ctx, (s, t, neg, r, s, r), stack.streams, first_draw)
        loss, *grads = independent_grads(ctx, *dropped[:4], dropped[4:], stack.weights)
    else:
        dropped, masks = dropout(ctx, (s, t, neg, r), stack.streams, first_draw)
        loss, *grads = score_grads(ctx, *dropped, stack.weights)
    grads = [g if m is None else g * m for g, m in zip(grads, masks, strict=True)]
    ds, dt, dneg, dr = grads[:4]
    if ctx.independent_masks:
        # A source or relation row's gradient sums its two paths, each through its own mask.
        ds, dr = ds + grads[4], dr + grads[5]
    # The head side of corrupt = both trains the tail side's edges again.
    which = [reg_rows(ctx, side == 1 and ctx.corrupt == "both") for side in stack.sides]
    reg, (ds, dt, dr) = regularize(ctx, (s, t, r), (ds, dt, dr), which)
    loss = loss if reg is None else loss + reg
    return loss, ds, dt, dneg, oriented(ctx, dr, stack.sides)


def cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` along the first dimension, with no copy of a lone tensor."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def train_chunk(
    ctx: Ctx, edges: torch.Tensor, weights: torch.Tensor | None, streams: torch.Tensor
) -> tuple[torch.Tensor, int, float]:
    """Trains one chunk in place (``Worker::train_chunk``) with the chunk's random streams
    (a row of :func:`piece_streams`): returns its loss (summed over its
    sides, weights and regularizer included: a float64 scalar on the device, which the caller
    adds up and reads once per piece), its positive edge-directions and its floating-point
    operations (``ScoreModel::flops`` per side).

    Except for ``corrupt = bernoulli`` (whose sides' sizes depend on the draws) nothing here
    reads a device value on the host."""
    stacks = stacks_of(ctx, edges, weights, streams)
    node_keys, rel_keys = chunk_keys(ctx, stacks)
    # A row used as a source and as a target is gathered twice; its gradients meet in the sum.
    nodes = node_rows(ctx, node_keys)
    rels = None if rel_keys is None else Gathered.of(ctx.rels, rel_keys)
    losses, node_grads, rel_grads = [], [], []
    at = rel_at = 0
    for stack in stacks:
        size, b, per_side = len(stack.sides), len(stack.edges), stack_negatives(ctx, stack)
        n = negative_draws(ctx, b, per_side)
        s, t = (nodes.take(at + i * size * b, size * b).view(size, b, -1) for i in (0, 1))
        neg = nodes.take(at + 2 * size * b, size * n)
        neg = neg.view(size, n, -1) if ctx.shared_negatives else neg.view(size, b, per_side, -1)
        at += size * (2 * b + n)
        if rels is not None:
            r = rels.take(rel_at, size * b).view(size, b, -1)
            rel_at += size * b
        else:
            r = s.new_zeros((size, b, 0))
        loss, ds, dt, d_neg, d_rels = train_stack(ctx, stack, s, t, neg, r)
        losses.append(loss)
        node_grads += [d.reshape(-1, ctx.dim) for d in (ds, dt, d_neg)]
        rel_grads.append(d_rels.reshape(size * b, ctx.rel_dim))
    salt = streams[SALT : SALT + 1]
    nodes.step(cat(node_grads), ctx.lr, salt)
    if rels is not None:
        rels.step(cat(rel_grads), ctx.lr, salt)
    total = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
    return (total, *chunk_counts(ctx, stacks))


def node_rows(ctx: Ctx, keys: torch.Tensor) -> Gathered | Featurized | Banked:
    """The node rows of a chunk's ``keys``: buffer rows, featurized entities' means, and bank
    rows past both."""

    def table_rows(keys: torch.Tensor) -> Gathered | Featurized:
        if ctx.feat is not None:
            return Featurized(ctx.feat, ctx.nodes, keys, alone=ctx.alone)
        return Gathered.of(ctx.nodes, keys, alone=ctx.alone)

    return table_rows(keys) if ctx.bank is None else Banked(ctx.bank, keys, table_rows)


def chunk_counts(ctx: Ctx, stacks: list[Stack]) -> tuple[int, float]:
    """``(directions, flops)`` of a chunk trained as ``stacks`` (:func:`stacks_of`): each side
    trains its stack's edges against its own count of negatives, ``ScoreModel::flops`` per
    side."""
    sides = [(len(stack.edges), stack_negatives(ctx, stack)) for stack in stacks for _ in stack.sides]
    return sum(b for b, _ in sides), sum(6.0 * b * n * ctx.dim for b, n in sides)
