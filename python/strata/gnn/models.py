"""Reference GNNs in plain PyTorch over message-flow blocks: GraphSAGE (mean and max-pool
aggregators), GCN, GIN and GAT, and for typed graphs R-GCN and a heterogeneous GraphSAGE.

No pyg-lib, torch-sparse or DGL: aggregation is ``index_add_`` over a block's edge list, so the
models run wherever torch does. Messages gather their source rows with ``index_select`` (as
PyG's message passing does), whose gradient is one ``index_add_``; an indexing gather's
gradient sorts the edges first (on an H200, 22 ms of G6's 85 ms of training kernels an
epoch). A block is the bipartite graph of one layer (see
``strata.gnn.Block``): its destinations are the first ``num_dst`` of its sources, so a layer's
output for the destinations is computed from rows ``[:num_src]`` of its input and the
destinations' own rows are ``x[:num_dst]``. A typed block also says each edge's type and each
source's node type; the typed layers read them, the others ignore them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..layer_kinds import LAYER_KINDS
from ._torch import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional


@dataclass(frozen=True)
class LayerKind:
    """A registered layer kind: its conv class and its declaration in
    :data:`strata.layer_kinds.LAYER_KINDS` (help, ``served``: the graph service runs it under
    the same name, ``typed``: built for typed graphs, its parameters per edge type)."""

    cls: type
    help: str
    served: bool
    typed: bool


#: The layer kinds a :class:`GNN` stacks, by name, in registration order (:func:`register_layer`).
LAYERS: dict[str, LayerKind] = {}


def register_layer(name: str) -> Callable[[type], type]:
    """Registers a conv class as layer kind ``name`` (``GNN(name, ...)``, ``strata gnn train
    --model name``), which :data:`strata.layer_kinds.LAYER_KINDS` declares (its help, whether it
    is served and whether it is typed). The class takes ``(in_dim, out_dim)`` and implements
    ``cost_widths`` and ``forward(block, x)``; a classmethod ``for_stack(dims, i, heads=,
    train_eps=)`` builds layer ``i`` of a stack of widths ``dims`` when it needs more than the
    two widths. A served kind's tensors are the class's state dict. Typed kinds take ``(in_dim,
    out_dim, edge_types)``."""

    def register(cls: type) -> type:
        if name not in LAYER_KINDS:
            raise ValueError(f"layer kind {name!r} is not declared: add it to strata.layer_kinds.LAYER_KINDS")
        if name in LAYERS:
            raise ValueError(f"layer kind {name!r} is registered twice ({LAYERS[name].cls.__name__}, {cls.__name__})")
        kind = LAYER_KINDS[name]
        LAYERS[name] = LayerKind(cls, kind.help, kind.served, kind.typed)
        return cls

    return register


def _build_layer(
    kind: str, dims: list[int], i: int, *, heads: int, train_eps: bool, edge_types: list[tuple[int, int]]
) -> nn.Module:
    """Layer ``i`` (widths ``dims[i] -> dims[i + 1]``) of a stack of layer kind ``kind``."""
    cls = LAYERS[kind].cls
    if LAYERS[kind].typed:
        return cls(dims[i], dims[i + 1], edge_types)
    if hasattr(cls, "for_stack"):
        return cls.for_stack(dims, i, heads=heads, train_eps=train_eps)
    return cls(dims[i], dims[i + 1])


@dataclass
class Block:
    """One layer's sampled edges in local ids: ``src[e] -> dst[e]``, ``src < num_src``,
    ``dst < num_dst``; both int64 tensors of shape ``(E,)``. A typed block adds ``etype``, the
    edge type of each edge (int64 ``(E,)``), and ``ntype``, the node type of each source
    (int64 ``(num_src,)``; the destinations' are its first ``num_dst``); an untyped block is
    read by the typed layers as one node type and one edge type, 0."""

    num_src: int
    num_dst: int
    src: torch.Tensor
    dst: torch.Tensor
    etype: torch.Tensor | None = None
    ntype: torch.Tensor | None = None

    @staticmethod
    def from_csc(num_src: int, num_dst: int, indptr, indices, etype=None, ntype=None) -> Block:
        """From a CSC over destinations (``indptr`` of ``num_dst + 1`` offsets, ``indices`` of
        local sources, ``etype`` parallel to ``indices``), as the sampler produces; NumPy
        arrays or tensors."""
        indptr = torch.as_tensor(indptr, dtype=torch.int64)
        src = torch.as_tensor(indices).to(torch.int64)
        dst = torch.repeat_interleave(torch.arange(num_dst, dtype=torch.int64), indptr[1:] - indptr[:-1])
        etype, ntype = (None if t is None else torch.as_tensor(t).to(torch.int64) for t in (etype, ntype))
        return Block(num_src, num_dst, src, dst, etype, ntype)

    def to(self, device) -> Block:
        etype, ntype = (None if t is None else t.to(device) for t in (self.etype, self.ntype))
        return Block(self.num_src, self.num_dst, self.src.to(device), self.dst.to(device), etype, ntype)

    def edge_types(self) -> torch.Tensor:
        """``etype``, or zeros (one edge type) for an untyped block."""
        return self.etype if self.etype is not None else torch.zeros_like(self.src)

    def dst_types(self) -> torch.Tensor:
        """Node type of each destination, int64 ``(num_dst,)`` (zeros for an untyped block)."""
        if self.ntype is not None:
            return self.ntype[: self.num_dst]
        return torch.zeros(self.num_dst, dtype=torch.int64, device=self.src.device)

    def in_degree(self) -> torch.Tensor:
        """Sampled in-degree of each destination, float ``(num_dst,)``."""
        return occurrences(self.dst, self.num_dst).to(torch.float32)


def occurrences(index: torch.Tensor, n: int) -> torch.Tensor:
    """How often each of ``0..n`` occurs in ``index`` (int64 ``(n,)``): ``bincount`` with
    ``minlength=n`` for ids below ``n``, without its host wait on CUDA (it reads the largest id
    back to size its output), once per layer and batch."""
    return torch.zeros(n, dtype=torch.int64, device=index.device).index_add_(0, index, torch.ones_like(index))


def _mean_neighbours(block: Block, x: torch.Tensor) -> torch.Tensor:
    """Mean of each destination's sampled sources' rows ``(num_dst, d)``; zeros without any."""
    out = x.new_zeros(block.num_dst, x.shape[1])
    out.index_add_(0, block.dst, x.index_select(0, block.src))
    return out / block.in_degree().clamp(min=1).unsqueeze(1).to(x.dtype)


@register_layer("sage")
class SAGEConv(nn.Module):
    """GraphSAGE with the mean aggregator: ``W_self x_v + W_neigh mean(x_u)`` (Hamilton et al.
    2017, as PyG's ``SAGEConv``)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.self_lin = nn.Linear(in_dim, out_dim)
        self.neigh_lin = nn.Linear(in_dim, out_dim, bias=False)

    def cost_widths(self) -> tuple[int, int, int, int]:
        """(input, output, message, transformed source row) widths, for ``GNN.training_costs``."""
        return self.self_lin.in_features, self.self_lin.out_features, self.self_lin.in_features, 0

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        return self.self_lin(x[: block.num_dst]) + self.neigh_lin(_mean_neighbours(block, x))


def _max_neighbours(block: Block, x: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of each destination's sampled sources' rows ``(num_dst, d)``; zeros
    for a destination without any."""
    out = x.new_zeros(block.num_dst, x.shape[1])
    index = block.dst.unsqueeze(1).expand(-1, x.shape[1])
    # include_self=False: a destination's row is the maximum of its sources only, and stays 0
    # when it has none.
    return out.scatter_reduce(0, index, x.index_select(0, block.src), reduce="amax", include_self=False)


@register_layer("sage_pool")
class SAGEPoolConv(nn.Module):
    """GraphSAGE with the max-pool aggregator (Hamilton et al. 2017, eq. 3): each sampled
    source is first passed through a one-layer perceptron, ``h_u = ReLU(W_pool x_u + b_pool)``
    (width ``in_dim``), then pooled by elementwise max over each destination's sources (zeros
    for a destination without sources):

        ``out_v = W_self x_v + b + W_neigh max_u h_u``

    This is PyG's ``SAGEConv(in_dim, out_dim, aggr="max", project=True)`` (project: the
    ``in_dim -> in_dim`` ReLU layer on the sources only, the root keeps its raw features),
    except that the bias sits on ``self_lin`` here (PyG puts it on the neighbour side; the sum
    is the same). Like the mean variant it adds the two terms instead of concatenating them
    (the paper's ``W [x_v || agg]`` with ``W = [W_self | W_neigh]``)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.pool_lin = nn.Linear(in_dim, in_dim)
        self.self_lin = nn.Linear(in_dim, out_dim)
        self.neigh_lin = nn.Linear(in_dim, out_dim, bias=False)

    def cost_widths(self) -> tuple[int, int, int, int]:
        d = self.pool_lin.in_features
        return d, self.self_lin.out_features, d, d

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        pooled = _max_neighbours(block, F.relu(self.pool_lin(x)))
        return self.self_lin(x[: block.num_dst]) + self.neigh_lin(pooled)


@register_layer("gcn")
class GCNConv(nn.Module):
    """Kipf and Welling's GCN on a sampled block, with a self loop per destination and the
    symmetric normalisation ``1 / sqrt((d_v + 1)(d_u + 1))`` over the block's degrees."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)

    def cost_widths(self) -> tuple[int, int, int, int]:
        out = self.lin.out_features
        return self.lin.in_features, out, out, out

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.lin.weight.T
        deg_dst = block.in_degree() + 1
        deg_src = occurrences(block.src, block.num_src).to(torch.float32)
        deg_src[: block.num_dst] += 1
        norm = (deg_src[block.src] * deg_dst[block.dst]).rsqrt().unsqueeze(1).to(h.dtype)
        self_norm = (deg_src[: block.num_dst] * deg_dst).rsqrt().unsqueeze(1).to(h.dtype)
        out = h[: block.num_dst] * self_norm
        out = out.index_add(0, block.dst, h.index_select(0, block.src) * norm)
        return out + self.lin.bias


@register_layer("gin")
class GINConv(nn.Module):
    """Graph isomorphism network layer (Xu et al. 2019, eq. 4.1):

        ``out_v = MLP((1 + eps) x_v + sum_u x_u)``

    summed over the destination's sampled sources, with ``MLP = Linear(in_dim, out_dim) ->
    ReLU -> Linear(out_dim, out_dim)`` (``lin1``, ``lin2``; no batch norm, so that the layer
    is the same in training and inference). ``eps`` is a learnable scalar initialised to 0
    (GIN-eps) when ``train_eps``, else fixed at 0 (GIN-0) as a buffer; it is in the state dict
    either way."""

    def __init__(self, in_dim: int, out_dim: int, train_eps: bool = True):
        super().__init__()
        self.lin1 = nn.Linear(in_dim, out_dim)
        self.lin2 = nn.Linear(out_dim, out_dim)
        if train_eps:
            self.eps = nn.Parameter(torch.zeros(()))
        else:
            self.register_buffer("eps", torch.zeros(()))

    @classmethod
    def for_stack(cls, dims: list[int], i: int, *, heads: int, train_eps: bool) -> GINConv:
        return cls(dims[i], dims[i + 1], train_eps=train_eps)

    def cost_widths(self) -> tuple[int, int, int, int]:
        return self.lin1.in_features, self.lin1.out_features, self.lin1.in_features, 0

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        out = x[: block.num_dst] * (1 + self.eps)
        out = out.index_add(0, block.dst, x.index_select(0, block.src))
        return self.lin2(F.relu(self.lin1(out)))


@register_layer("gat")
class GATConv(nn.Module):
    """Graph attention (Veličković et al. 2018): per head, ``e_uv = LeakyReLU(a_l W x_u + a_r
    W x_v)``, softmax over each destination's sources and itself; heads concatenated, or
    averaged when ``concat`` is False (the output layer)."""

    def __init__(self, in_dim: int, out_dim: int, heads: int = 4, concat: bool = True, slope: float = 0.2):
        super().__init__()
        self.heads, self.out_dim, self.concat, self.slope = heads, out_dim, concat, slope
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    @classmethod
    def for_stack(cls, dims: list[int], i: int, *, heads: int, train_eps: bool) -> GATConv:
        """Hidden layers concatenate their heads (the next one reads ``heads`` times the
        width); the output layer averages them."""
        last = i == len(dims) - 2
        return cls(dims[i] if i == 0 else dims[i] * heads, dims[i + 1], heads=heads, concat=not last)

    def cost_widths(self) -> tuple[int, int, int, int]:
        h = self.heads * self.out_dim
        return self.lin.in_features, h if self.concat else self.out_dim, h, h + self.heads

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        n_dst = block.num_dst
        h = self.lin(x).view(-1, self.heads, self.out_dim)
        a_src = (h * self.att_src).sum(-1)  # (num_src, heads)
        a_dst = (h[:n_dst] * self.att_dst).sum(-1)  # (num_dst, heads)
        # Every destination also attends to itself (its row is source row v too).
        loops = torch.arange(n_dst, device=x.device)
        src = torch.cat([block.src, loops])
        dst = torch.cat([block.dst, loops])
        e = F.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), self.slope)  # (E + n_dst, heads)
        # Softmax per destination, shifted by its maximum for stability.
        e_max = e.new_full((n_dst, self.heads), float("-inf")).scatter_reduce(
            0, dst.unsqueeze(1).expand_as(e), e, reduce="amax", include_self=True
        )
        w = (e - e_max.index_select(0, dst)).exp()
        denom = w.new_zeros(n_dst, self.heads).index_add_(0, dst, w)
        alpha = w / denom.index_select(0, dst)
        messages = h.index_select(0, src) * alpha.unsqueeze(-1)
        out = h.new_zeros(n_dst, self.heads, self.out_dim).index_add_(0, dst, messages)
        out = out.reshape(n_dst, -1) if self.concat else out.mean(1)
        return out + self.bias


def _check_edge_types(block: Block, num_types: int, layer: str) -> None:
    """Refuses a block with edge types the layer has no parameters for (they would be mixed
    into other types' aggregates or dropped without a word)."""
    if block.etype is not None and block.etype.numel() and int(block.etype.max()) >= num_types:
        raise ValueError(f"{layer}: the block has edge type {int(block.etype.max())}, the layer {num_types} edge types")


@register_layer("rgcn")
class RGCNConv(nn.Module):
    """Relational GCN (Schlichtkrull et al. 2018, eq. 2) with the per-relation mean
    (``c_vr = |N_r(v)|``), one weight matrix per edge type ``r`` (no basis decomposition):

        ``out_v = W_root x_v + b + sum_r mean_{u in N_r(v)} W_r x_u``

    This is PyG's ``RGCNConv(in_dim, out_dim, len(edge_types), aggr="mean")``: its ``weight``
    is ``weight`` here, its ``root`` ``root_lin.weight.T`` and its ``bias`` ``root_lin.bias``.
    Only the edge type selects a weight; ``edge_types`` are ``(source type, destination type)``
    pairs by edge-type id, of which R-GCN uses the count."""

    def __init__(self, in_dim: int, out_dim: int, edge_types: list[tuple[int, int]] = ((0, 0),)):
        super().__init__()
        bound = (6 / (in_dim + out_dim)) ** 0.5  # Glorot, as PyG initialises RGCNConv.weight
        self.weight = nn.Parameter(torch.empty(len(edge_types), in_dim, out_dim).uniform_(-bound, bound))
        self.root_lin = nn.Linear(in_dim, out_dim)

    def cost_widths(self) -> tuple[int, int, int, int]:
        """The aggregates are one mean per edge type: the input width times the types."""
        r, d, out = self.weight.shape
        return r * d, out, d, 0

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        r = self.weight.shape[0]
        _check_edge_types(block, r, "rgcn")
        n = block.num_dst
        key = block.dst * r + block.edge_types()  # one bucket per (destination, edge type)
        sums = x.new_zeros(n * r, x.shape[1]).index_add_(0, key, x.index_select(0, block.src))
        counts = occurrences(key, n * r).clamp(min=1).unsqueeze(1).to(x.dtype)
        mean = (sums / counts).view(n, r, -1)
        return self.root_lin(x[:n]) + torch.einsum("nri,rio->no", mean, self.weight)


@register_layer("sage_hetero")
class HeteroSAGEConv(nn.Module):
    """Heterogeneous GraphSAGE: a mean-aggregator :class:`SAGEConv` per edge type ``r = (s,
    t)``; a destination of node type ``t`` sums the layers of the edge types into ``t``:

        ``out_v = sum_{r into type(v)} (W_self^r x_v + b^r + W_neigh^r mean_{u in N_r(v)} x_u)``

    This is what PyG's ``to_hetero(GraphSAGE, metadata, aggr="sum")`` and ``HeteroConv({r:
    SAGEConv(in_dim, out_dim)}, aggr="sum")`` compute (PyG's ``lin_l`` is ``neigh_lin`` with
    ``self_lin``'s bias, its ``lin_r`` ``self_lin``). A destination of a node type no edge type
    points into gets zeros (PyG leaves such types out of its output)."""

    def __init__(self, in_dim: int, out_dim: int, edge_types: list[tuple[int, int]] = ((0, 0),)):
        super().__init__()
        self.edge_types = [tuple(int(t) for t in e) for e in edge_types]
        self.out_dim = out_dim
        self.convs = nn.ModuleList(SAGEConv(in_dim, out_dim) for _ in self.edge_types)

    def cost_widths(self) -> tuple[int, int, int, int]:
        """The aggregates are one mean per edge type: the input width times the types."""
        d = self.convs[0].self_lin.in_features
        return len(self.convs) * d, self.out_dim, d, 0

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        _check_edge_types(block, len(self.convs), "sage_hetero")
        etype, dst_type = block.edge_types(), block.dst_types()
        out = x.new_zeros(block.num_dst, self.out_dim)
        for r, ((_, t), conv) in enumerate(zip(self.edge_types, self.convs, strict=True)):
            keep = etype == r
            mean = _mean_neighbours(Block(block.num_src, block.num_dst, block.src[keep], block.dst[keep]), x)
            rows = (dst_type == t).nonzero().squeeze(1)
            out = out.index_add(0, rows, conv.self_lin(x[rows]) + conv.neigh_lin(mean[rows]))
        return out


#: The registered layer kinds' names, in registration order.
MODEL_KINDS: tuple[str, ...] = tuple(LAYERS)


class GNN(nn.Module):
    """A stack of ``len(blocks)`` layers of one registered kind (:data:`LAYERS`), ReLU and
    dropout between them: ``sage`` (GraphSAGE, mean), ``sage_pool`` (GraphSAGE, max-pool),
    ``gcn``, ``gin`` (GIN-eps, or GIN-0 without ``train_eps``), ``gat`` (``heads`` heads per
    hidden layer), and for typed graphs ``rgcn`` (R-GCN) and ``sage_hetero`` (GraphSAGE per edge
    type), whose parameters are per edge type of ``edge_types``: the ``(source node type,
    destination node type)`` of each edge-type id (default: one type, ``[(0, 0)]``). Every node
    type's rows have the same width ``in_dim``.

    ``forward(blocks, x)``: ``blocks`` in input-to-output order (``blocks[0]`` reads the input
    rows ``x``, ``(num_src of blocks[0], in_dim)``); returns ``(num_dst of blocks[-1], out_dim)``
    logits for the seeds.
    """

    def __init__(
        self,
        kind: str,
        in_dim: int,
        hidden: int,
        out_dim: int,
        layers: int = 2,
        dropout: float = 0.5,
        heads: int = 4,
        train_eps: bool = True,
        edge_types: list[tuple[int, int]] | None = None,
    ):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers: need at least 1, got {layers}")
        if kind not in MODEL_KINDS:
            raise ValueError(f"model: expected {', '.join(MODEL_KINDS[:-1])} or {MODEL_KINDS[-1]}, got {kind!r}")
        self.kind, self.dropout = kind, dropout
        # The widths, for exporting the architecture (strata.gnn.export).
        self.in_dim, self.hidden, self.out_dim = in_dim, hidden, out_dim
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        types = list(edge_types) if edge_types is not None else [(0, 0)]
        if not types:
            raise ValueError("edge_types: need at least one edge type")
        convs = [_build_layer(kind, dims, i, heads=heads, train_eps=train_eps, edge_types=types) for i in range(layers)]
        self.convs = nn.ModuleList(convs)

    def training_costs(self, optimizer_states: int) -> dict:
        """What training holds beside the batch's input rows, in bytes, for the memory plan
        (``strata_gnn::data::Consumer``): per layer (input layer first), per source row, per
        destination row and per edge of its block; and ``fixed_bytes``, the parameters'
        gradients and ``optimizer_states`` tensors of the parameters' size (2 for Adam). The
        code pages of the kernels training uses are planned with the runtime
        (``strata_gnn::budget::CODE_PAGES_BYTES``).

        An allowance, not an exact count, float32 throughout: a source row holds the rows a
        layer transforms before gathering (GCN, GAT, max-pool) and their gradient; a
        destination row its aggregates (3 x input width: the sum, the mean, a gradient) and its
        outputs (7 x output width: two products, their sum, ReLU, dropout and its mask, a
        gradient); an edge its gathered message and the message's gradient, plus the block's
        two int64 ids."""
        layers = []
        for conv in self.convs:
            a, b, message, transformed = conv.cost_widths()
            layers.append(
                {"src_row": 4 * 2 * transformed, "dst_row": 4 * (3 * a + 7 * b), "edge": 4 * 2 * message + 16}
            )
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        return {"layers": layers, "fixed_bytes": params * (1 + optimizer_states)}

    def forward(self, blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != len(self.convs):
            raise ValueError(f"the model has {len(self.convs)} layers but got {len(blocks)} blocks")
        h = x
        for i, (conv, block) in enumerate(zip(self.convs, blocks, strict=True)):
            h = conv(block, h)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), self.dropout, self.training)
        return h


@dataclass
class TypedRows:
    """The input rows of a typed batch, by node type: ``rows[t]`` the features of the batch's
    nodes of type ``t`` (``(n_t, dim_t)``; None for a featureless type) and ``index[t]`` their
    positions in the batch's node list (int64 ``(n_t,)``); ``count`` the batch's nodes."""

    count: int
    rows: list[torch.Tensor | None]
    index: list[torch.Tensor]

    def float(self) -> TypedRows:
        """The same rows as float32."""
        return TypedRows(self.count, [None if r is None else r.float() for r in self.rows], self.index)

    def to(self, device) -> TypedRows:
        rows = [None if r is None else r.to(device, non_blocking=True) for r in self.rows]
        return TypedRows(self.count, rows, [i.to(device) for i in self.index])


class TypedInput(nn.Module):
    """One input layer per node type, to a common ``width``: a linear projection of a type's
    features (node types may differ in width), or for a type without features one learned
    vector shared by all its nodes. A per-node embedding would be a parameter table growing
    with the graph (held in RAM with Adam's two states, outside the data path's budget); the
    shared vector is constant in size, and the layers above tell such nodes apart by their
    sampled neighbours. ``dims[t]``: the feature width of node type ``t``, None without."""

    def __init__(self, dims: list[int | None], width: int):
        super().__init__()
        self.dims, self.width = list(dims), width
        self.lins = nn.ModuleDict({str(t): nn.Linear(d, width) for t, d in enumerate(dims) if d is not None})
        self.vectors = nn.ParameterDict(
            {str(t): nn.Parameter(torch.empty(width).normal_()) for t, d in enumerate(dims) if d is None}
        )

    def forward(self, x: TypedRows) -> torch.Tensor:
        """``(x.count, width)`` rows in the batch's node order."""
        params = next(self.parameters())
        out = params.new_zeros(x.count, self.width)
        for t, (rows, index) in enumerate(zip(x.rows, x.index, strict=True)):
            if self.dims[t] is None:
                out[index] = self.vectors[str(t)].expand(len(index), -1)
            else:
                out[index] = self.lins[str(t)](rows)
        return out


class TypedGNN(nn.Module):
    """A :class:`GNN` of a typed layer kind (``rgcn``, ``sage_hetero``) over a typed store's
    nodes: :class:`TypedInput` maps each node type's rows to ``hidden`` columns, then the
    stack of ``layers`` layers (parameters per edge type of ``edge_types``, ``(source type,
    destination type)`` by edge-type id) gives ``out_dim`` logits per seed.

    ``forward(blocks, x)``: ``x`` the :class:`TypedRows` of ``blocks[0]``'s sources, whose
    blocks carry ``etype`` and ``ntype``."""

    def __init__(
        self,
        kind: str,
        dims: list[int | None],
        hidden: int,
        out_dim: int,
        layers: int,
        dropout: float,
        edge_types: list[tuple[int, int]],
    ):
        super().__init__()
        if kind not in LAYERS or not LAYERS[kind].typed:
            typed = [k for k, v in LAYERS.items() if v.typed]
            raise ValueError(f"model: a typed store trains {' or '.join(typed)}, got {kind!r}")
        self.kind = kind
        self.inputs = TypedInput(dims, hidden)
        self.gnn = GNN(kind, hidden, hidden, out_dim, layers, dropout, edge_types=edge_types)

    def training_costs(self, optimizer_states: int) -> dict:
        """:meth:`GNN.training_costs` of the stack, with the input projections: each source row
        of the input block also holds its projected row, that row's gradient and the masked
        copy the projection writes (3 x ``hidden`` float32), and the projections' parameters
        count with the stack's."""
        costs = self.gnn.training_costs(optimizer_states)
        costs["layers"][0]["src_row"] += 4 * 3 * self.inputs.width
        params = sum(p.numel() * p.element_size() for p in self.inputs.parameters())
        costs["fixed_bytes"] += params * (1 + optimizer_states)
        return costs

    def forward(self, blocks: list[Block], x: TypedRows) -> torch.Tensor:
        return self.gnn(blocks, self.inputs(x))
