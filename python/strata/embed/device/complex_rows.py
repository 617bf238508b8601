"""ComplEx's products of rows, one kernel on a GPU.

A ComplEx row of ``dim`` reals holds ``dim / 2`` complex numbers, real parts first, imaginary
parts second. The step multiplies such rows element by element: the query rows ``a = s r``
(``bilinear_rows.combine``), and in the backward pass ``ds = da conj(r)`` and ``dr = da
conj(s)`` (``bilinear_rows.combine_grads``; a chunk's step fuses both into
:mod:`.bilinear_rows`' kernels, these serve the rest). As torch ops each product is seven
kernels (four products, a sum, a difference and the concatenation of the halves); at B1's sizes
a chunk's step is bound by the count of its kernels, not by their work (docs/benchmarks.md), so
on ``cuda`` one Triton kernel does each. Elsewhere the same arithmetic runs as torch ops (the CPU twin), and under
``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, so the tests check that both agree.

Shapes: every operand ``... x dim`` (``dim`` even), all of one shape; the results have it too.
"""

from __future__ import annotations

import torch

from strata.device import kernels

#: Elements one kernel program computes at most (rows of the next power of two of ``dim / 2``):
#: small, so that a chunk's rows spread over every multiprocessor (:data:`bilinear_rows.BLOCK`).
BLOCK = 512


def product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x y`` in complex numbers, row by row (``step.combine`` of ComplEx): the fused kernel on
    ``cuda`` (``kernels.fused``), torch ops elsewhere, for operands that broadcast (the
    evaluator's), which the kernel does not take, and under autograd (``pbg``'s
    ``complex_diagonal`` with a comparator other than ``dot``), which the kernel has no
    backward for."""
    if x.shape != y.shape or (torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)):
        return twin(x, y)
    return kernels.fused("ComplEx product", x.device, lambda: kernel_products(x, [y], False)[0], lambda: twin(x, y))


def conj_products(x: torch.Tensor, ys: list[torch.Tensor]) -> list[torch.Tensor]:
    """``x conj(y)`` for each ``y`` of ``ys`` (``bilinear_rows.combine_grads`` of ComplEx: ``ys = [r,
    s]``), in one kernel on ``cuda`` (torch ops for operands that broadcast)."""

    def twin_both() -> list[torch.Tensor]:
        return list(twin(x[None], conj(torch.stack(ys))))  # both products in one batch

    if any(y.shape != x.shape for y in ys):
        return twin_both()
    return kernels.fused("ComplEx product", x.device, lambda: kernel_products(x, ys, True), twin_both)


def twin(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x y`` as torch ops."""
    h = x.shape[-1] // 2
    xr, xi, yr, yi = x[..., :h], x[..., h:], y[..., :h], y[..., h:]
    return torch.cat([xr * yr - xi * yi, xr * yi + xi * yr], -1)


def conj(y: torch.Tensor) -> torch.Tensor:
    """The conjugate rows of ``y`` (its imaginary half negated)."""
    h = y.shape[-1] // 2
    return torch.cat([y[..., :h], -y[..., h:]], -1)


def kernel_products(x: torch.Tensor, ys: list[torch.Tensor], conjugate: bool) -> list[torch.Tensor]:
    """``x y`` (or ``x conj(y)``) for each of one or two ``ys`` by the Triton kernel: on
    ``cuda``, and under ``TRITON_INTERPRET=1`` on CPU tensors (tests)."""
    if not 1 <= len(ys) <= 2 or any(y.shape != x.shape for y in ys):
        raise ValueError(f"complex products of rows: {x.shape} against {[tuple(y.shape) for y in ys]}")
    x = x.contiguous()
    ys = [y.contiguous() for y in ys]
    outs = [torch.empty_like(x) for _ in ys]
    h = x.shape[-1] // 2
    rows = x.numel() // max(1, x.shape[-1])
    if rows == 0 or h == 0:
        return outs
    block_h = 1 << max(0, h - 1).bit_length()
    block_r = max(1, BLOCK // block_h)
    # One operand: the second pair of pointers repeats the first and is not stored (TWO off).
    y2, out2 = (ys[1], outs[1]) if len(ys) == 2 else (ys[0], outs[0])
    with kernels.on_device(x):
        _kernel()[(-(-rows // block_r),)](
            x, ys[0], y2, outs[0], out2, rows, h,
            CONJ=conjugate, TWO=len(ys) == 2, BLOCK_R=block_r, BLOCK_H=block_h, **kernels.OPTIONS,
        )  # fmt: skip
    return outs


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # ``rows`` follows the chunk; left unspecialised so that a size compiles one variant.
    @triton.jit(do_not_specialize=["rows"])
    def complex_products(x, y1, y2, out1, out2, rows, h, CONJ: tl.constexpr, TWO: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.arange(0, BLOCK_H)
        mask = (r < rows)[:, None] & (c < h)[None, :]
        re = r[:, None] * (2 * h) + c[None, :]
        xr = tl.load(x + re, mask=mask, other=0.0)
        xi = tl.load(x + re + h, mask=mask, other=0.0)
        # The second operand's product, with TWO, reuses the loaded x.
        for k in tl.static_range(2 if TWO else 1):
            y = y1 if k == 0 else y2
            out = out1 if k == 0 else out2
            yr = tl.load(y + re, mask=mask, other=0.0)
            yi = tl.load(y + re + h, mask=mask, other=0.0)
            if CONJ:
                yi = -yi
            tl.store(out + re, xr * yr - xi * yi, mask=mask)
            tl.store(out + re + h, xr * yi + xi * yr, mask=mask)

    return complex_products
