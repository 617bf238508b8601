"""Reference GNNs in plain PyTorch over message-flow blocks: GraphSAGE (mean and max-pool
aggregators), GCN, GIN and GAT.

No pyg-lib, torch-sparse or DGL: aggregation is ``index_add_`` over a block's edge list, so the
models run wherever torch does. A block is the bipartite graph of one layer (see
``strata.gnn.Block``): its destinations are the first ``num_dst`` of its sources, so a layer's
output for the destinations is computed from rows ``[:num_src]`` of its input and the
destinations' own rows are ``x[:num_dst]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._torch import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional


@dataclass(frozen=True)
class LayerKind:
    """A registered layer kind: its conv class, one line of help, and the layer kind of the
    graph service it is exported as (``strata_serve::model::ModelKind``; None: not servable)."""

    cls: type
    help: str
    served_as: str | None


#: The layer kinds a :class:`GNN` stacks, by name, in registration order (:func:`register_layer`).
LAYERS: dict[str, LayerKind] = {}


def register_layer(name: str, *, help: str, served_as: str | None = None) -> Callable[[type], type]:
    """Registers a conv class as layer kind ``name`` (``GNN(name, ...)``, ``strata gnn train
    --model name``). The class takes ``(in_dim, out_dim)`` and implements ``cost_widths`` and
    ``forward(block, x)``; a classmethod ``for_stack(dims, i, heads=, train_eps=)`` builds layer
    ``i`` of a stack of widths ``dims`` when it needs more than the two widths. ``served_as``
    names the service's kernel of the same layer, whose tensors are the class's state dict."""

    def register(cls: type) -> type:
        if name in LAYERS:
            raise ValueError(f"layer kind {name!r} is registered twice ({LAYERS[name].cls.__name__}, {cls.__name__})")
        LAYERS[name] = LayerKind(cls, help, served_as)
        return cls

    return register


def _build_layer(kind: str, dims: list[int], i: int, *, heads: int, train_eps: bool) -> nn.Module:
    """Layer ``i`` (widths ``dims[i] -> dims[i + 1]``) of a stack of layer kind ``kind``."""
    cls = LAYERS[kind].cls
    if hasattr(cls, "for_stack"):
        return cls.for_stack(dims, i, heads=heads, train_eps=train_eps)
    return cls(dims[i], dims[i + 1])


@dataclass
class Block:
    """One layer's sampled edges in local ids: ``src[e] -> dst[e]``, ``src < num_src``,
    ``dst < num_dst``; both int64 tensors of shape ``(E,)``."""

    num_src: int
    num_dst: int
    src: torch.Tensor
    dst: torch.Tensor

    @staticmethod
    def from_csc(num_src: int, num_dst: int, indptr, indices) -> Block:
        """From a CSC over destinations (``indptr`` of ``num_dst + 1`` offsets, ``indices`` of
        local sources), as the sampler produces; NumPy arrays or tensors."""
        indptr = torch.as_tensor(indptr, dtype=torch.int64)
        src = torch.as_tensor(indices).to(torch.int64)
        dst = torch.repeat_interleave(torch.arange(num_dst, dtype=torch.int64), indptr[1:] - indptr[:-1])
        return Block(num_src, num_dst, src, dst)

    def to(self, device) -> Block:
        return Block(self.num_src, self.num_dst, self.src.to(device), self.dst.to(device))

    def in_degree(self) -> torch.Tensor:
        """Sampled in-degree of each destination, float ``(num_dst,)``."""
        return torch.bincount(self.dst, minlength=self.num_dst).to(torch.float32)


def _mean_neighbours(block: Block, x: torch.Tensor) -> torch.Tensor:
    """Mean of each destination's sampled sources' rows ``(num_dst, d)``; zeros without any."""
    out = x.new_zeros(block.num_dst, x.shape[1])
    out.index_add_(0, block.dst, x[block.src])
    return out / block.in_degree().clamp(min=1).unsqueeze(1).to(x.dtype)


@register_layer("sage", help="GraphSAGE (mean aggregator)", served_as="sage_mean")
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
    return out.scatter_reduce(0, index, x[block.src], reduce="amax", include_self=False)


@register_layer("sage_pool", help="GraphSAGE (max-pool)", served_as="sage_pool")
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


@register_layer("gcn", help="GCN", served_as="gcn")
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
        deg_src = torch.bincount(block.src, minlength=block.num_src).to(torch.float32)
        deg_src[: block.num_dst] += 1
        norm = (deg_src[block.src] * deg_dst[block.dst]).rsqrt().unsqueeze(1).to(h.dtype)
        self_norm = (deg_src[: block.num_dst] * deg_dst).rsqrt().unsqueeze(1).to(h.dtype)
        out = h[: block.num_dst] * self_norm
        out = out.index_add(0, block.dst, h[block.src] * norm)
        return out + self.lin.bias


@register_layer("gin", help="GIN", served_as="gin")
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
        out = out.index_add(0, block.dst, x[block.src])
        return self.lin2(F.relu(self.lin1(out)))


@register_layer("gat", help="GAT (heads heads per hidden layer)")
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
        e = F.leaky_relu(a_src[src] + a_dst[dst], self.slope)  # (E + n_dst, heads)
        # Softmax per destination, shifted by its maximum for stability.
        e_max = e.new_full((n_dst, self.heads), float("-inf")).scatter_reduce(
            0, dst.unsqueeze(1).expand_as(e), e, reduce="amax", include_self=True
        )
        w = (e - e_max[dst]).exp()
        denom = w.new_zeros(n_dst, self.heads).index_add_(0, dst, w)
        alpha = w / denom[dst]
        out = h.new_zeros(n_dst, self.heads, self.out_dim).index_add_(0, dst, h[src] * alpha.unsqueeze(-1))
        out = out.reshape(n_dst, -1) if self.concat else out.mean(1)
        return out + self.bias


#: The registered layer kinds' names, in registration order.
MODEL_KINDS: tuple[str, ...] = tuple(LAYERS)


class GNN(nn.Module):
    """A stack of ``len(blocks)`` layers of one registered kind (:data:`LAYERS`), ReLU and
    dropout between them: ``sage`` (GraphSAGE, mean), ``sage_pool`` (GraphSAGE, max-pool),
    ``gcn``, ``gin`` (GIN-eps, or GIN-0 without ``train_eps``) or ``gat`` (``heads`` heads per
    hidden layer).

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
        convs = [_build_layer(kind, dims, i, heads=heads, train_eps=train_eps) for i in range(layers)]
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
