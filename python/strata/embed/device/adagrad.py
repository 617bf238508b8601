"""The Adagrad step of a chunk's unique rows, one kernel on a GPU.

``SharedRows::adagrad`` of the Rust engine: for each touched row with its summed gradient
``g``, ``state + g^2`` then ``params - lr g / (sqrt(state) + eps)`` (``adagrad_row``: one state
per row, the mean of ``g^2``). On ``cuda`` one Triton kernel does it all for every row (gathers
the state and the params, updates both, writes them back); elsewhere the same arithmetic runs
as torch ops (the CPU twin), and under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, so
the tests check that both agree (``tests/test_embed_device.py``).

Shapes: ``params`` ``rows x width``, ``state`` ``rows x width`` or ``rows x 1``; ``keys`` ``n``
int64 rows, unique where ``valid`` (``n`` bools) is set; ``grad`` ``n x width``, zero where
``valid`` is not (the unused slots of :func:`rows.unique_static`, and the untouched rows of a
step over every touched row, which all repeat a used row's key).
"""

from __future__ import annotations

import torch

from strata.device import kernels

#: Added to Adagrad's denominator, as ``SharedRows::adagrad``.
EPS = 1e-9
#: Elements one kernel program updates at most (rows of the next power of two of the width).
BLOCK = 4096


def step(table, keys: torch.Tensor, valid: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """One Adagrad step of rows ``keys`` of ``table`` (a ``rows.Table``) with ``grad``, in
    place: the fused kernel on ``cuda`` (where Triton is installed, as with torch's CUDA
    wheels, unless it failed: ``kernels.fused``), torch ops elsewhere."""
    kernels.fused(
        "Adagrad",
        table.params.device,
        lambda: kernel_step(table, keys, valid, grad, lr),
        lambda: torch_step(table, keys, grad, lr),
    )


def torch_step(table, keys: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """The step as torch ops: the state gathered, the steps added back (``index_add_``). The
    unused slots' gradients are zero, so they add exact zeros to the used row whose key they
    repeat and need no mask; every used row gets one addend, so the sums are exactly the Rust
    engine's."""
    row_wise = table.state.shape[1] == 1
    sq = mean_squares(grad) if row_wise else grad * grad
    acc = table.state.index_select(0, keys) + sq
    update = lr / (acc.sqrt() + EPS) * grad if row_wise else lr * grad / (acc.sqrt() + EPS)
    table.state.index_add_(0, keys, sq)
    table.params.index_add_(0, keys, update, alpha=-1.0)


def mean_squares(grad: torch.Tensor) -> torch.Tensor:
    """``adagrad_row``'s addend to each row's state (``n x 1``): the mean of its ``g^2``."""
    return (grad * grad).sum(1, keepdim=True) / grad.shape[1]


def kernel_step(table, keys: torch.Tensor, valid: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """The step by the Triton kernel: on ``cuda``, and under ``TRITON_INTERPRET=1`` on CPU
    tensors (tests). Rows not ``valid`` are left alone (they alias row 0)."""
    n, width = grad.shape
    if n == 0:
        return
    block_w = 1 << max(0, width - 1).bit_length()
    block_r = max(1, BLOCK // block_w)
    grid = (-(-n // block_r),)
    row_wise = table.state.shape[1] == 1
    # adagrad_row's mean squares by torch, summed in its order (and a reduction inside the
    # kernel would call triton.language's jitted sum, which the interpreter cannot run once
    # triton was imported without it).
    sq = mean_squares(grad) if row_wise else grad
    with kernels.on_device(grad):
        _kernel()[grid](
            table.params, table.state, keys, valid.view(torch.uint8), grad.contiguous(), sq, n, width, lr, EPS,
            ROW_WISE=row_wise, BLOCK_R=block_r, BLOCK_W=block_w,
        )  # fmt: skip


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # ``n`` follows the chunk; left unspecialised so that a size compiles one variant. The table
    # is ``weights``, not ``params``: Triton 3.6's generated argument binder keeps its bound
    # arguments in a local named ``params``, and a parameter of that name reads that dict.
    @triton.jit(do_not_specialize=["n"])
    def adagrad_rows(weights, state, keys, valid, grad, sq, n, width, lr, eps, ROW_WISE: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_W)
        used = tl.load(valid + rows, mask=rows < n, other=0) != 0
        key = tl.load(keys + rows, mask=used, other=0)
        mask = used[:, None] & (cols[None, :] < width)
        g = tl.load(grad + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)
        at = key[:, None] * width + cols[None, :]
        p = tl.load(weights + at, mask=mask, other=0.0)
        # IEEE square roots and quotients, as torch's (Triton's ``sqrt`` and ``/`` approximate).
        if ROW_WISE:
            acc = tl.load(state + key, mask=used, other=0.0) + tl.load(sq + rows, mask=used, other=0.0)
            tl.store(state + key, acc, mask=used)
            p = p - tl.div_rn(lr, tl.sqrt_rn(acc) + eps)[:, None] * g
        else:
            acc = tl.load(state + at, mask=mask, other=0.0) + g * g
            tl.store(state + at, acc, mask=mask)
            p = p - tl.div_rn(lr * g, tl.sqrt_rn(acc) + eps)
        tl.store(weights + at, p, mask=mask)

    return adagrad_rows
