"""The softmax loss of a chunk's scores and its gradients, one kernel on a GPU.

Each positive score competes with its edge's negatives: the term is ``logsumexp([pos, neg]) -
pos``, its gradients ``softmax - 1`` for the positive and ``softmax`` for each negative, all
times the edge's weight. As torch ops that is about seven kernels (the concatenation, the
log-sum-exp, the softmax and the slices' arithmetic), at B1's sizes a chunk's step is bound by
the count of its kernels (docs/benchmarks.md), so on ``cuda`` one Triton kernel does it, each
row in two passes over its negatives (an online maximum and sum, then the softmax). Elsewhere
the torch ops run (the CPU twin); under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors,
so the tests check that both agree.

Shapes: ``pos`` ``S x b``, ``neg`` ``S x b x n``, ``weights`` ``b`` or ``None``. Returns the
terms (``S x b`` float64, each the float32 value), ``dpos`` (``S x b``) and ``dneg`` (``S x b x
n``).
"""

from __future__ import annotations

import torch

from strata.device import kernels

#: Scores one kernel program holds at a time (rows x negatives).
BLOCK = 4096


def loss_grads(
    pos: torch.Tensor, neg: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The terms and gradients (module doc): the fused kernel on ``cuda`` (``kernels.fused``),
    torch ops elsewhere."""
    return kernels.fused(
        "softmax loss", pos.device, lambda: kernel_loss_grads(pos, neg, weights), lambda: twin(pos, neg, weights)
    )


def twin(
    pos: torch.Tensor, neg: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The terms and gradients as torch ops."""
    z = torch.cat([pos[..., None], neg], -1)
    terms = torch.logsumexp(z, -1) - pos
    p = torch.softmax(z, -1)
    dpos, dneg = p[..., 0] - 1.0, p[..., 1:]
    if weights is not None:
        terms, dpos, dneg = terms * weights, dpos * weights, dneg * weights[:, None]
    return terms.to(torch.float64), dpos, dneg


def kernel_loss_grads(
    pos: torch.Tensor, neg: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The terms and gradients by the Triton kernel: on ``cuda``, and under
    ``TRITON_INTERPRET=1`` on CPU tensors (tests)."""
    if neg.shape[:-1] != pos.shape or (weights is not None and weights.shape != pos.shape[-1:]):
        raise ValueError(f"softmax loss of scores {tuple(pos.shape)}, {tuple(neg.shape)} and weights "
                         f"{None if weights is None else tuple(weights.shape)}")  # fmt: skip
    pos, neg = pos.contiguous(), neg.contiguous()
    terms = torch.empty(pos.shape, dtype=torch.float64, device=pos.device)
    dpos, dneg = torch.empty_like(pos), torch.empty_like(neg)
    rows, n, b = pos.numel(), neg.shape[-1], pos.shape[-1]
    if rows == 0:
        return terms, dpos, dneg
    block_n = min(1 << max(0, n - 1).bit_length(), BLOCK)
    block_r = max(1, BLOCK // block_n)
    w = pos if weights is None else weights.contiguous()  # unread without weights
    with kernels.on_device(pos):
        _kernel()[(-(-rows // block_r),)](
            pos, neg, w, terms, dpos, dneg, rows, n, b,
            HAS_W=weights is not None, BLOCK_R=block_r, BLOCK_N=block_n, **kernels.OPTIONS,
        )  # fmt: skip
    return terms, dpos, dneg


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # The reductions combine with functions of this module's own, jitted here beside the
    # kernel: triton.language's ``max`` and ``sum`` are jitted when triton is imported, which
    # the interpreter cannot run if that was before it was asked for; and a kernel finds the
    # functions it calls among its module's globals.
    global _larger, _plus

    @triton.jit
    def _larger(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _plus(a, b):
        return a + b

    # ``rows`` follows the chunk; left unspecialised so that a size compiles one variant.
    @triton.jit(do_not_specialize=["rows"])
    def softmax_rows(pos, neg, w, terms, dpos, dneg, rows, n, b, HAS_W: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_N: tl.constexpr):  # fmt: skip
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        live = r < rows
        p = tl.load(pos + r, mask=live, other=0.0)
        # Online log-sum-exp over [pos, neg]: the running maximum m and sum of exp(z - m).
        m = p
        s = tl.full([BLOCK_R], 1.0, tl.float32)
        for k in range(0, n, BLOCK_N):
            cols = k + tl.arange(0, BLOCK_N)
            at = r[:, None] * n + cols[None, :]
            z = tl.load(neg + at, mask=live[:, None] & (cols < n)[None, :], other=float("-inf"))
            top = tl.maximum(m, tl.reduce(z, 1, _larger))
            s = s * tl.exp(m - top) + tl.reduce(tl.exp(z - top[:, None]), 1, _plus)
            m = top
        lse = m + tl.log(s)
        wt = tl.load(w + r % b, mask=live, other=0.0) if HAS_W else tl.full([BLOCK_R], 1.0, tl.float32)
        tl.store(terms + r, ((lse - p) * wt).to(tl.float64), mask=live)
        tl.store(dpos + r, (tl.exp(p - lse) - 1.0) * wt, mask=live)
        for k in range(0, n, BLOCK_N):
            cols = k + tl.arange(0, BLOCK_N)
            at = r[:, None] * n + cols[None, :]
            inside = live[:, None] & (cols < n)[None, :]
            z = tl.load(neg + at, mask=inside, other=0.0)
            tl.store(dneg + at, tl.exp(z - lse[:, None]) * wt[:, None], mask=inside)

    return softmax_rows
