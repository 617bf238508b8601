"""Floyd's sampling without replacement at every frontier node (``uniform.rs``), one kernel on
a GPU.

A node with ``d > k`` in-edges picks ``k`` of them: step ``s`` (``s < k``) draws ``t =
below(j + 1)`` with ``j = d - k + s`` from draw ``s`` of the node's stream, and picks ``t``
unless it was picked already, else ``j``. The picks, sorted, are the kept edges' offsets; a node
with ``k`` or fewer in-edges keeps them all.

The torch twin runs the ``k`` sequential steps at once over a ``(frontier, k)`` layout (about
65 kernels a hop, besides the draws), then sorts; on ``cuda`` one Triton kernel runs each node's
steps in order in registers, counting as it goes each pick's rank among the node's picks, and
stores each pick at its rank (sorted, with no sort). Both pick the same set, so the results are
equal bit for bit, which the tests check on the CPU under Triton's interpreter.

Shapes: ``start``, ``degree`` and ``keys`` (the nodes' stream keys, int64 bit patterns) ``m``
int64; the results ``(positions, counts, valid)``: positions ``m x k`` flattened (0 where not
valid), ``counts`` ``m``, ``valid`` ``m x k`` flattened, a node's first ``counts[i]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...device import kernels, rng

#: Nodes one kernel program samples (fewer for wide fanouts: about 4096 picks a program).
BLOCK = 4096


@dataclass
class FloydConstants:
    """A fanout ``k``'s constants on the device, made once: ``step`` (``arange(k)``) and the
    rounds of pointer doubling that follow a chain of ``k`` steps."""

    k: int
    step: torch.Tensor
    rounds: int

    @classmethod
    def on(cls, k: int, device: torch.device) -> FloydConstants:
        return cls(k, torch.arange(k, device=device), max(k - 1, 0).bit_length())


def choose(start, degree, keys, floyd: FloydConstants) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every node's picks (module doc): the fused kernel on ``cuda`` (``kernels.fused``), torch
    ops elsewhere."""
    return kernels.fused(
        "Floyd sample",
        keys.device,
        lambda: place(start, degree, kernel_picks(degree, keys, floyd.k), floyd),
        lambda: place(start, degree, twin_picks(degree, keys, floyd), floyd),
    )


def place(start, degree, picks, floyd: FloydConstants) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(positions, counts, valid)`` of the nodes' sorted ``picks`` (``m x k`` offsets among
    their in-edges, used where ``degree > k``)."""
    k, step = floyd.k, floyd.step
    counts = torch.clamp(degree, max=k)
    valid = step < counts[:, None]
    drawn = degree > k
    positions = torch.where(valid, start[:, None] + torch.where(drawn[:, None], picks, step), 0)
    return positions.reshape(-1), counts, valid.reshape(-1)


def twin_picks(degree, keys, floyd: FloydConstants) -> torch.Tensor:
    """The sorted picks (``m x k``) as torch ops, the ``k`` steps at once: ``t_s`` was picked
    before iff it equals an earlier ``t_r`` (drawn earlier, it was picked then or already held)
    or it is ``j_r`` (``r = t_s - d + k < s``) of a step ``r`` whose own draw had been picked
    before. That follows a chain of steps down to one with no such ``r``; pointer doubling ORs
    along it in ``log2 k`` rounds."""
    k, step = floyd.k, floyd.step
    base = degree[:, None] - k
    j = base + step
    t = rng.draw_below(keys[:, None], 0, k, j + 1)
    # A draw that repeats an earlier one: after a stable sort of each node's draws, one equal to
    # its left neighbour (O(m k) memory where comparing all pairs would take O(m k^2)).
    ordered, at = torch.sort(t, dim=1, stable=True)
    again = torch.zeros_like(t, dtype=torch.bool)
    again[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    picked = torch.empty_like(again).scatter_(1, at, again)
    r = t - base
    link = torch.where((r >= 0) & (r < step), r, step)
    for _ in range(floyd.rounds):
        picked = picked | picked.gather(1, link)
        link = link.gather(1, link)
    return torch.where(picked, j, t).sort(dim=1).values


def kernel_picks(degree, keys, k: int) -> torch.Tensor:
    """The sorted picks (``m x k``) by the Triton kernel (each node's steps in order, each
    pick stored at its rank): on ``cuda``, and under ``TRITON_INTERPRET=1`` on CPU tensors
    (tests). A node with ``k`` or fewer in-edges gets values it does not use."""
    m = keys.numel()
    picks = torch.empty((m, k), dtype=torch.int64, device=keys.device)
    if picks.numel() == 0:
        return picks
    block_k = 1 << max(0, k - 1).bit_length()
    block_m = max(1, BLOCK // block_k)
    with kernels.on_device(keys):
        _kernel()[(-(-m // block_m),)](keys.contiguous(), degree.contiguous(), picks, m, K=k, BLOCK_M=block_m,
                                       BLOCK_K=block_k, **kernels.OPTIONS)  # fmt: skip
    return picks


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # The functions the kernel calls are globals of this module, jitted with it (see
    # strata.embed.device.softmax_loss for why the reduction's is its own).
    global _below_draw, _either, _plus
    _below_draw = rng.jit_helpers().below_draw

    @triton.jit
    def _either(a, b):
        return a | b

    @triton.jit
    def _plus(a, b):
        return a + b

    # ``m`` follows the frontier; left unspecialised so that a size compiles one variant.
    @triton.jit(do_not_specialize=["m"])
    def floyd_rows(keys, degree, picks, m, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = rows < m
        key = tl.load(keys + rows, mask=live, other=0).to(tl.uint64, bitcast=True)
        d = tl.load(degree + rows, mask=live, other=K + 1)
        cols = tl.arange(0, BLOCK_K)
        held = tl.full([BLOCK_M, BLOCK_K], -1, tl.int64)
        # Each pick's rank among the node's picks so far: Floyd's picks are distinct, so the
        # final ranks place them in order (a node with k or fewer in-edges stores values it
        # does not use, at ranks below k).
        rank = tl.full([BLOCK_M, BLOCK_K], 0, tl.int32)
        for s in range(K):
            j = d - K + s
            t = _below_draw(key, j - j + s, (j + 1).to(tl.uint64, bitcast=True))
            before = (cols < s)[None, :]
            seen = tl.reduce(((held == t[:, None]) & before).to(tl.int32), 1, _either) != 0
            pick = tl.where(seen, j, t)
            # The new pick ranks above the smaller earlier ones; the larger ones move up one.
            under = tl.reduce(((held < pick[:, None]) & before).to(tl.int32), 1, _plus)
            rank += ((held > pick[:, None]) & before).to(tl.int32)
            here = (cols == s)[None, :]
            held = tl.where(here, pick[:, None], held)
            rank = tl.where(here, under[:, None], rank)
        tl.store(picks + rows[:, None] * K + rank, held, mask=live[:, None] & (cols < K)[None, :])

    return floyd_rows
