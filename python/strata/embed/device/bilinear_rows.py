"""The row-wise work around a chunk's bilinear scores, one kernel each way on a GPU.

The bilinear models (``dot``, ``distmult``, ``complex``) score a query row ``a = phi(s, r)``
against its target ``t`` (``pos = a . t``) and against the chunk's negatives (a matrix
product, cuBLAS's). Around that product everything is row by row:

- forward, the query rows and the positive scores: ``a`` and ``pos`` (as torch ops a product
  kernel, a multiplication and a sum);
- backward, with ``dpos`` and ``dneg`` the loss's gradients of the scores and ``da0 = dneg N``
  the negatives' share (a matrix product): ``da = da0 + dpos t``, ``phi``'s gradients ``ds`` and
  ``dr`` of ``da`` (ComplEx: ``da conj(r)`` and ``da conj(s)``; DistMult: ``da r`` and ``da s``;
  Dot: ``da``) and ``dt = dpos a`` (as torch ops a multiplication, an addition, a product kernel
  and another multiplication).

At B1's sizes a chunk's step is bound by the count of its kernels (docs/benchmarks.md), so on
``cuda`` one Triton kernel does each side, reusing the rows it loads; elsewhere the torch ops
run (the CPU twin), and under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors, so the
tests check that both agree.

Shapes: ``s``, ``t``, ``a``, ``da0`` ``... x dim``; ``r`` ``... x rel_dim`` (``dim``, or 0 for
Dot); ``pos``, ``dpos`` ``...``. A ComplEx row holds its real parts, then its imaginary parts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from strata.device import kernels
from strata.embed.device import complex_rows

#: The models whose rows these kernels compute, by the kernel's ``MODEL`` constant.
MODELS = {"dot": 0, "distmult": 1, "complex": 2}
#: Elements one kernel program holds at most (rows of the next power of two of ``dim``). Small,
#: so that a chunk's rows spread over every multiprocessor: at 4,096 a B1 chunk's 2,000 rows
#: were 32 programs, each holding ten 64 x 64 tiles, and the gradients' kernel took 70 us on an
#: H200 for about 6 MB of traffic (docs/benchmarks.md); at 512 they are 250 programs.
BLOCK = 512


def query_pos(model: str, s: Tensor, r: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """``(a, pos)``: the query rows ``phi(s, r)`` and their scores against ``t``, by the fused
    kernel on ``cuda`` (``kernels.fused``), torch ops elsewhere."""
    return kernels.fused(
        "bilinear query", s.device, lambda: kernel_query_pos(model, s, r, t), lambda: twin_query_pos(model, s, r, t)
    )


def row_grads(
    model: str, da0: Tensor, dpos: Tensor, s: Tensor, r: Tensor, t: Tensor, a: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``(ds, dt, dr)`` (module doc), by the fused kernel on ``cuda``, torch ops elsewhere."""
    return kernels.fused(
        "bilinear grads",
        s.device,
        lambda: kernel_row_grads(model, da0, dpos, s, r, t, a),
        lambda: twin_row_grads(model, da0, dpos, s, r, t, a),
    )


def combine(model: str, s: Tensor, r: Tensor) -> Tensor:
    """The query rows ``a = phi(s, r)`` of a bilinear model as torch ops (ComplEx's product by
    its own kernel on ``cuda``)."""
    if model == "dot":
        return s
    if model == "distmult":
        return s * r
    return complex_rows.product(s, r)


def combine_grads(model: str, s: Tensor, r: Tensor, da: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of ``s`` and ``r`` of ``a = phi(s, r)`` given ``da``, as torch ops (ComplEx's
    products by its own kernel on ``cuda``): ``phi`` is linear in each (ComplEx: ``a = s r`` in
    complex numbers, so ``ds = da conj(r)`` and ``dr = da conj(s)``)."""
    if model == "dot":
        return da, r
    if model == "distmult":
        return da * r, da * s
    ds, dr = complex_rows.conj_products(da, [r, s])
    return ds, dr


def twin_query_pos(model: str, s: Tensor, r: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    a = combine(model, s, r)
    return a, (a * t).sum(-1)


def twin_row_grads(
    model: str, da0: Tensor, dpos: Tensor, s: Tensor, r: Tensor, t: Tensor, a: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    ds, dr = combine_grads(model, s, r, da0 + dpos[..., None] * t)
    return ds, dpos[..., None] * a, dr


def _launch_shape(rows: int, dim: int) -> tuple[int, int, tuple[int]]:
    """``(BLOCK_R, BLOCK_D, grid)`` of a launch over ``rows`` rows of ``dim`` columns (a
    ComplEx row's halves: ``dim / 2``)."""
    block_d = 1 << max(0, dim - 1).bit_length()
    block_r = max(1, BLOCK // block_d)
    return block_r, block_d, (-(-rows // block_r),)


def _check(model: str, rows: list[Tensor], rel: Tensor, rowwise: list[Tensor]) -> None:
    dim = rows[0].shape[-1]
    want_rel = 0 if model == "dot" else dim
    if (
        model not in MODELS
        or any(x.shape != rows[0].shape for x in rows)
        or rel.shape[:-1] != rows[0].shape[:-1]
        or rel.shape[-1] != want_rel
        or any(x.shape != rows[0].shape[:-1] for x in rowwise)
        or (model == "complex" and dim % 2)
    ):
        shapes = [tuple(x.shape) for x in (*rows, rel, *rowwise)]
        raise ValueError(f"bilinear rows of {model}: shapes {shapes} do not agree")


def kernel_query_pos(model: str, s: Tensor, r: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`query_pos` by the Triton kernel: on ``cuda``, and under ``TRITON_INTERPRET=1`` on
    CPU tensors (tests). Dot's query rows are ``s`` itself."""
    _check(model, [s, t], r, [])
    s, r, t = s.contiguous(), r.contiguous(), t.contiguous()
    a = s if model == "dot" else torch.empty_like(s)
    pos = torch.empty(s.shape[:-1], dtype=s.dtype, device=s.device)
    dim = s.shape[-1]
    rows = pos.numel()
    if rows == 0 or dim == 0:
        return a, pos.zero_()
    half = dim // 2 if model == "complex" else dim
    block_r, block_d, grid = _launch_shape(rows, half)
    with kernels.on_device(s):
        _query_kernel()[grid](
            s, r, t, a, pos, rows, half, MODEL=MODELS[model], BLOCK_R=block_r, BLOCK_D=block_d, **kernels.OPTIONS
        )
    return a, pos


def kernel_row_grads(
    model: str, da0: Tensor, dpos: Tensor, s: Tensor, r: Tensor, t: Tensor, a: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`row_grads` by the Triton kernel: on ``cuda``, and under ``TRITON_INTERPRET=1`` on
    CPU tensors (tests). Dot's ``dr`` is ``r`` itself (no columns)."""
    _check(model, [da0, s, t, a], r, [dpos])
    da0, dpos, s, r, t, a = (x.contiguous() for x in (da0, dpos, s, r, t, a))
    ds, dt = torch.empty_like(s), torch.empty_like(t)
    dr = r if model == "dot" else torch.empty_like(r)
    dim = s.shape[-1]
    rows = dpos.numel()
    if rows == 0 or dim == 0:
        return ds, dt, dr
    half = dim // 2 if model == "complex" else dim
    block_r, block_d, grid = _launch_shape(rows, half)
    with kernels.on_device(s):
        _grads_kernel()[grid](
            da0, dpos, s, r, t, a, ds, dt, dr, rows, half,
            MODEL=MODELS[model], BLOCK_R=block_r, BLOCK_D=block_d, **kernels.OPTIONS,
        )  # fmt: skip
    return ds, dt, dr


@kernels.builder
def _query_kernel():
    """The jitted kernel of the query rows and positive scores, built on first use so that
    ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # The row sums reduce with a function of this module's own, jitted here beside the kernel
    # (as softmax_loss's): triton.language's ``sum`` is jitted when triton is imported, which
    # the interpreter cannot run if that was before it was asked for.
    global _plus

    @triton.jit
    def _plus(x, y):
        return x + y

    # A row of ``cols`` reals (Dot, DistMult) or of ``cols`` complex numbers (ComplEx: real
    # parts at columns ``0..cols``, imaginary parts at ``cols..2 cols``); ``rows`` follows the
    # chunk, left unspecialised so that a size compiles one variant.
    @triton.jit(do_not_specialize=["rows"])
    def query_pos(s, r, t, a, pos, rows, cols, MODEL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.arange(0, BLOCK_D)
        mask = (row < rows)[:, None] & (c < cols)[None, :]
        if MODEL == 2:
            re = row[:, None] * (2 * cols) + c[None, :]
            im = re + cols
            sr, si = tl.load(s + re, mask=mask, other=0.0), tl.load(s + im, mask=mask, other=0.0)
            rr, ri = tl.load(r + re, mask=mask, other=0.0), tl.load(r + im, mask=mask, other=0.0)
            ar, ai = sr * rr - si * ri, sr * ri + si * rr
            tl.store(a + re, ar, mask=mask)
            tl.store(a + im, ai, mask=mask)
            tr, ti = tl.load(t + re, mask=mask, other=0.0), tl.load(t + im, mask=mask, other=0.0)
            score = tl.reduce(ar * tr + ai * ti, 1, _plus)
        else:
            at = row[:, None] * cols + c[None, :]
            q = tl.load(s + at, mask=mask, other=0.0)
            if MODEL == 1:
                q = q * tl.load(r + at, mask=mask, other=0.0)
                tl.store(a + at, q, mask=mask)
            score = tl.reduce(q * tl.load(t + at, mask=mask, other=0.0), 1, _plus)
        tl.store(pos + row, score, mask=row < rows)

    return query_pos


@kernels.builder
def _grads_kernel():
    """The jitted kernel of the rows' gradients, built on first use so that
    ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # ``rows`` follows the chunk, left unspecialised so that a size compiles one variant.
    @triton.jit(do_not_specialize=["rows"])
    def row_grads(da0, dpos, s, r, t, a, ds, dt, dr, rows, cols, MODEL: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr):  # fmt: skip
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.arange(0, BLOCK_D)
        mask = (row < rows)[:, None] & (c < cols)[None, :]
        g = tl.load(dpos + row, mask=row < rows, other=0.0)[:, None]
        if MODEL == 2:
            re = row[:, None] * (2 * cols) + c[None, :]
            im = re + cols
            # da = da0 + dpos t and dt = dpos a, each half; then ds = da conj(r), dr = da conj(s).
            dar = tl.load(da0 + re, mask=mask, other=0.0) + g * tl.load(t + re, mask=mask, other=0.0)
            dai = tl.load(da0 + im, mask=mask, other=0.0) + g * tl.load(t + im, mask=mask, other=0.0)
            tl.store(dt + re, g * tl.load(a + re, mask=mask, other=0.0), mask=mask)
            tl.store(dt + im, g * tl.load(a + im, mask=mask, other=0.0), mask=mask)
            rr, ri = tl.load(r + re, mask=mask, other=0.0), tl.load(r + im, mask=mask, other=0.0)
            sr, si = tl.load(s + re, mask=mask, other=0.0), tl.load(s + im, mask=mask, other=0.0)
            tl.store(ds + re, dar * rr + dai * ri, mask=mask)
            tl.store(ds + im, dai * rr - dar * ri, mask=mask)
            tl.store(dr + re, dar * sr + dai * si, mask=mask)
            tl.store(dr + im, dai * sr - dar * si, mask=mask)
        else:
            at = row[:, None] * cols + c[None, :]
            da = tl.load(da0 + at, mask=mask, other=0.0) + g * tl.load(t + at, mask=mask, other=0.0)
            tl.store(dt + at, g * tl.load(a + at, mask=mask, other=0.0), mask=mask)
            if MODEL == 0:
                tl.store(ds + at, da, mask=mask)
            else:
                tl.store(ds + at, da * tl.load(r + at, mask=mask, other=0.0), mask=mask)
                tl.store(dr + at, da * tl.load(s + at, mask=mask, other=0.0), mask=mask)

    return row_grads
