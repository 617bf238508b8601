"""The Adagrad step of a chunk's unique rows, one kernel on a GPU.

``SharedRows::adagrad`` of the Rust engine: for each touched row with its summed gradient
``g``, ``state + g^2`` then ``params - lr g / (sqrt(state) + eps)`` (``adagrad_row``: one state
per row, the mean of ``g^2``). On ``cuda`` one Triton kernel does it all for every row (gathers
the state and the params, updates both, writes them back); elsewhere the same arithmetic runs
as torch ops (the CPU twin), and under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, so
the tests check that both agree (``tests/test_embed_device.py``).

A bf16 table (``table_dtype = "bf16"``) stores the new state and params rounded
stochastically (:mod:`strata.embed.device.bf16`), salted by the chunk's key and placed by each
row's position in its own table (``Table.places``), as the Rust engine rounds them.

Shapes: ``params`` ``rows x width``, ``state`` ``rows x width`` or ``rows x 1``; ``keys`` ``n``
int64 rows, unique where ``valid`` (``n`` bools) is set; ``grad`` ``n x width``, zero where
``valid`` is not (the unused slots of :func:`rows.unique_static`, and the untouched rows of a
step over every touched row, which all repeat a used row's key); ``salt`` a one-element int64
tensor (a bf16 table's only).
"""

from __future__ import annotations

import torch

from strata.device import kernels
from strata.embed.device import bf16

#: Added to Adagrad's denominator, as ``SharedRows::adagrad``.
EPS = 1e-9
#: Elements one kernel program updates at most (rows of the next power of two of the width):
#: small, so that a chunk's rows spread over every multiprocessor (:data:`bilinear_rows.BLOCK`).
BLOCK = 512


def step(
    table, keys: torch.Tensor, valid: torch.Tensor, grad: torch.Tensor, lr: float, salt: torch.Tensor | None = None
) -> None:
    """One Adagrad step of rows ``keys`` of ``table`` (a ``rows.Table``) with ``grad``, in
    place: the fused kernel on ``cuda`` (where Triton is installed, as with torch's CUDA
    wheels, unless it failed: ``kernels.fused``), torch ops elsewhere."""
    if table.params.dtype == torch.bfloat16 and salt is None:
        raise ValueError("a bf16 table's Adagrad step needs the chunk's salt")
    kernels.fused(
        "Adagrad",
        table.params.device,
        lambda: kernel_step(table, keys, valid, grad, lr, salt),
        lambda: torch_step(table, keys, grad, lr, salt),
    )


def torch_step(table, keys: torch.Tensor, grad: torch.Tensor, lr: float, salt: torch.Tensor | None = None) -> None:
    """The step as torch ops: the state gathered, the steps added back (``index_add_``). The
    unused slots' gradients are zero, so they add exact zeros to the used row whose key they
    repeat and need no mask; every used row gets one addend, so the sums are exactly the Rust
    engine's."""
    row_wise = table.state.shape[1] == 1
    sq = mean_squares(grad) if row_wise else grad * grad
    if table.params.dtype == torch.bfloat16:
        rounded_step(table, keys, grad, sq, lr, salt)
        return
    acc = table.state.index_select(0, keys) + sq
    table.state.index_add_(0, keys, sq)
    table.params.index_add_(0, keys, update(acc, grad, lr, row_wise), alpha=-1.0)


def update(acc: torch.Tensor, grad: torch.Tensor, lr: float, row_wise: bool) -> torch.Tensor:
    """What the step subtracts from the params, given the new state ``acc``."""
    return lr / (acc.sqrt() + EPS) * grad if row_wise else lr * grad / (acc.sqrt() + EPS)


def rounded_step(
    table, keys: torch.Tensor, grad: torch.Tensor, sq: torch.Tensor, lr: float, salt: torch.Tensor
) -> None:
    """The step of a bf16 table as torch ops: the new state and params computed in float32
    (the params' update from the unrounded state, as ``SharedRows::adagrad``), rounded
    stochastically, and written as the change of their bit patterns (an ``int16``
    ``index_add_``, exact modulo 2^16). An unused slot's row takes a zero gradient, so its
    values stay exact bf16 values that round to themselves: it adds a zero change to the row
    whose key it repeats."""
    old_state, old_params = table.state.index_select(0, keys), table.params.index_select(0, keys)
    acc = old_state.float() + sq
    new_params = old_params.float() - update(acc, grad, lr, table.state.shape[1] == 1)
    local = table.places.local(keys)[:, None]
    for tensor, old, new, s in (
        (table.state, old_state, acc, bf16.state_salt(salt)),
        (table.params, old_params, new_params, salt),
    ):
        width = tensor.shape[1]
        position = local * width + torch.arange(width, device=keys.device)
        bits = bf16.round_stochastic(new, bf16.noise(s, position)).to(torch.int64)
        change = bf16.as_int16((bits - old.view(torch.int16).to(torch.int64)) & 0xFFFF)
        tensor.view(torch.int16).index_add_(0, keys, change)


def mean_squares(grad: torch.Tensor) -> torch.Tensor:
    """``adagrad_row``'s addend to each row's state (``n x 1``): the mean of its ``g^2``."""
    return (grad * grad).sum(1, keepdim=True) / grad.shape[1]


def kernel_step(
    table, keys: torch.Tensor, valid: torch.Tensor, grad: torch.Tensor, lr: float, salt: torch.Tensor | None = None
) -> None:
    """The step by the Triton kernel: on ``cuda``, and under ``TRITON_INTERPRET=1`` on CPU
    tensors (tests). Rows not ``valid`` are left alone (they alias row 0)."""
    n, width = grad.shape
    if n == 0:
        return
    block_w = 1 << max(0, width - 1).bit_length()
    block_r = max(1, BLOCK // block_w)
    grid = (-(-n // block_r),)
    row_wise = table.state.shape[1] == 1
    rounded = table.params.dtype == torch.bfloat16
    places = table.places if rounded else None
    # adagrad_row's mean squares by torch, summed in its order (and a reduction inside the
    # kernel would call triton.language's jitted sum, which the interpreter cannot run once
    # triton was imported without it).
    sq = mean_squares(grad) if row_wise else grad
    with kernels.on_device(grad):
        _kernel()[grid](
            table.params, table.state, keys, valid.view(torch.uint8), grad.contiguous(), sq, n, width, lr, EPS,
            salt if rounded else keys, bf16.state_salt(salt) if rounded else keys, places.slot_rows if rounded else 1,
            places.tail_row if rounded else 0,
            ROW_WISE=row_wise, BF16=rounded, BLOCK_R=block_r, BLOCK_W=block_w, **kernels.OPTIONS,
        )  # fmt: skip


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # The bf16 helpers are called as globals of this module (see rng.jit_helpers).
    global _round_noise, _rounded
    _round_noise, _rounded = bf16.jit_helpers()

    # ``n`` follows the chunk; left unspecialised so that a size compiles one variant. The table
    # is ``weights``, not ``params``: Triton 3.6's generated argument binder keeps its bound
    # arguments in a local named ``params``, and a parameter of that name reads that dict.
    # A bf16 table (BF16) is loaded widened and stored rounded stochastically: the noise of
    # a value hashes the salt (``state_salt`` for the state) and its position in its own table,
    # the row's offset from the start of its slot (``slot_rows`` rows each) or of the tail.
    @triton.jit(do_not_specialize=["n"])
    def adagrad_rows(weights, state, keys, valid, grad, sq, n, width, lr, eps, salt, state_salt, slot_rows,
                     tail_row, ROW_WISE: tl.constexpr, BF16: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_W: tl.constexpr):  # fmt: skip
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_W)
        used = tl.load(valid + rows, mask=rows < n, other=0) != 0
        key = tl.load(keys + rows, mask=used, other=0)
        mask = used[:, None] & (cols[None, :] < width)
        g = tl.load(grad + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)
        at = key[:, None] * width + cols[None, :]
        p = tl.load(weights + at, mask=mask, other=0.0).to(tl.float32)
        # IEEE square roots and quotients, as torch's (Triton's ``sqrt`` and ``/`` approximate).
        if ROW_WISE:
            acc = tl.load(state + key, mask=used, other=0.0).to(tl.float32) + tl.load(sq + rows, mask=used, other=0.0)
            p = p - tl.div_rn(lr, tl.sqrt_rn(acc) + eps)[:, None] * g
        else:
            acc = tl.load(state + at, mask=mask, other=0.0).to(tl.float32) + g * g
            p = p - tl.div_rn(lr * g, tl.sqrt_rn(acc) + eps)
        if BF16:
            s, s_state = tl.load(salt).to(tl.uint64, bitcast=True), tl.load(state_salt).to(tl.uint64, bitcast=True)
            local = tl.where(key >= tail_row, key - tail_row, key % slot_rows)
            if ROW_WISE:
                acc = _rounded(acc, _round_noise(s_state, local))
            else:
                acc = _rounded(acc, _round_noise(s_state, local[:, None] * width + cols[None, :]))
            p = _rounded(p, _round_noise(s, local[:, None] * width + cols[None, :]))
        if ROW_WISE:
            tl.store(state + key, acc, mask=used)
        else:
            tl.store(state + at, acc, mask=mask)
        tl.store(weights + at, p, mask=mask)

    return adagrad_rows
