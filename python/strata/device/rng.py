"""Strata's counter-based randomness on torch tensors, bit for bit the Rust engine's.

Every random value Strata draws is a pure function of ``(key, position)``: SplitMix64's output
function applied to ``key + (position + 1) * GOLDEN`` (``strata_store::rng``). A device kernel
that draws through this module therefore picks exactly what the Rust engine picks for the same
key: the same negatives, the same sampled neighbours, on a CPU or a GPU.

Torch has no unsigned 64-bit arithmetic on every device, so a ``u64`` lives in an ``int64``
tensor as its bit pattern. Addition and multiplication wrap identically in two's complement,
so they need nothing; right shifts are made logical by masking off the sign's copies, and no
comparison of two ``u64`` values is ever made. :func:`draw_below` (a chunk's negatives, a
hop's Floyd draws) and :func:`derive_each` (a hop's node keys) are one Triton kernel each on
``cuda``, their arithmetic the same in ``uint64`` registers.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from strata.device import kernels

#: 2^64 / golden ratio, SplitMix64's increment, as the int64 with its bit pattern.
GOLDEN = 0x9E37_79B9_7F4A_7C15 - (1 << 64)
_MIX1 = 0xBF58_476D_1CE4_E5B9 - (1 << 64)
_MIX2 = 0x94D0_49BB_1331_11EB - (1 << 64)
_LOW32 = 0xFFFF_FFFF
_U64 = (1 << 64) - 1


def as_i64(value: int) -> int:
    """The int64 with the bit pattern of the ``u64`` ``value`` (0 <= value < 2^64)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"{value} is not a 64-bit unsigned value")
    return value - (1 << 64) if value >= 1 << 63 else value


def as_u64(tensor: torch.Tensor) -> list[int]:
    """The ``u64`` values of an int64 tensor's bit patterns, as Python ints (for tests and logs)."""
    return [v & ((1 << 64) - 1) for v in tensor.reshape(-1).tolist()]


def shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of the ``u64`` bit patterns in ``x`` by ``bits`` (1..63)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function (Stafford's "mix 13"), elementwise on int64 ``z``."""
    z = (z ^ shr(z, 30)) * _MIX1
    z = (z ^ shr(z, 27)) * _MIX2
    return z ^ shr(z, 31)


def derive(key: torch.Tensor | int, index: torch.Tensor | int) -> torch.Tensor:
    """The child key of ``key`` for ``index`` (``strata_store::rng::derive``), broadcast.

    Python ints are ``u64`` values; tensors are int64 bit patterns.
    """
    key, index = _tensor(key), _tensor(index)
    return mix64(key ^ mix64(index + GOLDEN))


def derive_int(key: int, index: int) -> int:
    """:func:`derive` of a ``u64`` ``key`` and ``index`` on the host, as a Python int (a chunk's
    key, computed without a device round trip)."""
    return _mix64_int(key ^ _mix64_int((index + GOLDEN) & _U64))


def derive_host(key: np.ndarray | int, index: np.ndarray | int) -> np.ndarray:
    """:func:`derive` on the host over NumPy ``uint64`` arrays (broadcast; Python ints are
    ``u64`` values), for a piece's many chunk keys at once without a loop in Python."""
    key, index = np.asarray(key, dtype=np.uint64), np.asarray(index, dtype=np.uint64)
    return _mix64_host(key ^ _mix64_host(index + np.uint64(GOLDEN & _U64)))


def _mix64_host(z: np.ndarray) -> np.ndarray:
    # uint64 arithmetic wraps modulo 2^64, as the Rust engine's wrapping_mul does (NumPy warns
    # of the wrap on 0-d values only).
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1 & _U64)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2 & _U64)
    return z ^ (z >> np.uint64(31))


def _mix64_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * (_MIX1 & _U64)) & _U64
    z = ((z ^ (z >> 27)) * (_MIX2 & _U64)) & _U64
    return z ^ (z >> 31)


def draw(key: torch.Tensor | int, position: torch.Tensor | int) -> torch.Tensor:
    """Draw ``position`` (0-based) of the stream of ``key``: ``Rng::seek(key, position)``'s
    next ``u64``, as int64 bit patterns, broadcast over ``key`` and ``position``."""
    key, position = _tensor(key), _tensor(position)
    return mix64(key + (position + 1) * GOLDEN)


def below(bits: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """``Rng::below(n)`` of a draw's ``bits``: the high 64 bits of ``bits * n`` (Lemire's
    multiply-shift), an int64 in ``[0, n)`` for ``0 < n < 2^63``.

    The 128-bit product is built from 32-bit halves (Hacker's Delight's ``mulhu``): every
    partial sum fits 64 unsigned bits, so the wrapping int64 arithmetic gives its exact bits.
    """
    u0, u1 = bits & _LOW32, shr(bits, 32)
    if isinstance(n, int):
        # A host value stays a kernel argument: a tensor made of it would be a host -> device
        # copy per call, which waits for the device (and which a CUDA graph cannot capture).
        v0, v1 = n & _LOW32, (n & _U64) >> 32
    else:
        n = _tensor(n)
        v0, v1 = n & _LOW32, shr(n, 32)
    t = u1 * v0 + shr(u0 * v0, 32)
    w1 = u0 * v1 + (t & _LOW32)
    return u1 * v1 + shr(t, 32) + shr(w1, 32)


def unit(bits: torch.Tensor) -> torch.Tensor:
    """``Rng::next_f64`` of a draw's ``bits``: float64 uniform in ``[0, 1)`` from 53 bits."""
    return shr(bits, 11).to(torch.float64) * (1.0 / (1 << 53))


def _tensor(value: torch.Tensor | int) -> torch.Tensor:
    """An int64 tensor of ``value``: a host scalar (a CPU tensor, which device kernels take as an
    argument, with no copy) for a Python int."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64:
            raise TypeError(f"expected an int64 tensor of u64 bit patterns, got {value.dtype}")
        return value
    return torch.tensor(as_i64(value), dtype=torch.int64)


def draw_below(streams: torch.Tensor, first: int, count: int, n: torch.Tensor | int) -> torch.Tensor:
    """``below(draw(stream, first + j), n)`` for ``j < count`` of each of ``streams`` (``S x
    1`` int64 keys; ``n`` an int, a 0-dim tensor, one per stream, ``S x 1``, or one per draw,
    ``S x count``): ``S x count``.
    On ``cuda`` one Triton kernel (each draw's 20 or so integer ops in registers), elsewhere
    :func:`twin_draw_below`."""
    return kernels.fused(
        "draw_below",
        streams.device,
        lambda: kernel_draw_below(streams, first, count, n),
        lambda: twin_draw_below(streams, first, count, n),
    )


def twin_draw_below(streams: torch.Tensor, first: int, count: int, n: torch.Tensor | int) -> torch.Tensor:
    """:func:`draw_below` as torch ops."""
    return below(draw(streams, torch.arange(first, first + count, device=streams.device)), n)


#: Draws one program of the kernel makes.
BLOCK = 1024


def kernel_draw_below(streams: torch.Tensor, first: int, count: int, n: torch.Tensor | int) -> torch.Tensor:
    """:func:`draw_below` by the Triton kernel: on ``cuda``, and under ``TRITON_INTERPRET=1`` on
    CPU tensors (tests)."""
    keys = streams.reshape(-1).contiguous()
    out = torch.empty((len(keys), count), dtype=torch.int64, device=streams.device)
    if out.numel() == 0:
        return out
    in_memory = isinstance(n, torch.Tensor)
    bounds = n.reshape(-1).contiguous() if in_memory else keys
    # Draw j of stream i reads bounds[i * stride + j * step]: one bound, one a stream or one a
    # draw.
    per_draw = in_memory and n.dim() == 2 and n.shape[1] == count and count > 1
    stride, step = (count, 1) if per_draw else (int(in_memory and bounds.numel() > 1), 0)
    with kernels.on_device(keys):
        grid = (-(-count // BLOCK), len(keys))
        _kernel()[grid](keys, bounds, stride, step, 0 if in_memory else as_i64(n), out, count, first,
                        IN_MEMORY=in_memory, BLOCK=BLOCK, **kernels.OPTIONS)  # fmt: skip
    return out


def jit_helpers() -> SimpleNamespace:
    """Jitted ``mix64(z)`` and ``below_draw(key, position, n)`` (u64 ``z``, ``key`` and ``n``,
    int64 ``position``; ``below_draw`` gives int64) for Triton kernels to call: a kernel's
    builder assigns them to globals of its module (a kernel calls the functions among its
    module's globals), built with the interpreter setting of the kernel's."""
    import triton

    # Called from a kernel of another module, Triton's interpreter looks for triton.language
    # among a function's module globals (a kernel's own closure does not count there); and
    # below_draw calls mix64 as a global of this module.
    global tl, _mix64
    import triton.language as tl

    @triton.jit
    def mix64(z):
        # SplitMix64's output function, in wrapping u64 arithmetic.
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)

    _mix64 = mix64

    @triton.jit
    def below_draw(key, position, n):
        z = _mix64(key + (position + 1).to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15)
        # The high 64 bits of z * n from 32-bit halves, as below().
        u0, u1 = z & 0xFFFFFFFF, z >> 32
        v0, v1 = n & 0xFFFFFFFF, n >> 32
        t = u1 * v0 + ((u0 * v0) >> 32)
        w1 = u0 * v1 + (t & 0xFFFFFFFF)
        return (u1 * v1 + (t >> 32) + (w1 >> 32)).to(tl.int64, bitcast=True)

    return SimpleNamespace(mix64=mix64, below_draw=below_draw)


def derive_each(key: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """:func:`derive` of one ``key`` for each of ``index`` (int64, any shape): a hop's node keys.
    ``key`` is a ``u64`` int, or a one-element int64 tensor on ``index``'s device (a key a CUDA
    graph reads when replayed, not one baked into it). On ``cuda`` one Triton kernel, elsewhere
    :func:`derive`."""
    return kernels.fused("derive", index.device, lambda: kernel_derive_each(key, index), lambda: derive(key, index))


def kernel_derive_each(key: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """:func:`derive_each` by the Triton kernel: on ``cuda``, and under ``TRITON_INTERPRET=1``
    on CPU tensors (tests)."""
    flat = index.reshape(-1).contiguous()
    out = torch.empty_like(flat)
    if isinstance(key, int):
        key = torch.full((1,), as_i64(key), dtype=torch.int64, device=index.device)
    if flat.numel():
        with kernels.on_device(flat):
            _derive_kernel()[(-(-flat.numel() // BLOCK),)](flat, out, key, flat.numel(), BLOCK=BLOCK, **kernels.OPTIONS)
    return out.view(index.shape)


@kernels.builder
def _derive_kernel():
    """The jitted derivation kernel, built on first use (``TRITON_INTERPRET`` as then)."""
    import triton
    import triton.language as tl

    jit_helpers()  # sets _mix64, which the kernel calls

    @triton.jit(do_not_specialize=["n"])
    def derive_rows(index, out, key, n, BLOCK: tl.constexpr):
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        i = tl.load(index + at, mask=at < n, other=0).to(tl.uint64, bitcast=True)
        k = tl.load(key).to(tl.uint64, bitcast=True)
        child = _mix64(k ^ _mix64(i + 0x9E3779B97F4A7C15))
        tl.store(out + at, child.to(tl.int64, bitcast=True), mask=at < n)

    return derive_rows


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    global _below_draw
    _below_draw = jit_helpers().below_draw

    # The counts and the scalar bound change from call to call: left unspecialised.
    @triton.jit(do_not_specialize=["stride", "step", "bound", "count", "first"])
    def draw_below(keys, bounds, stride, step, bound, out, count, first, IN_MEMORY: tl.constexpr,
                   BLOCK: tl.constexpr):  # fmt: skip
        row = tl.program_id(1)
        j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        key = tl.load(keys + row).to(tl.uint64, bitcast=True)
        if IN_MEMORY:
            n = tl.load(bounds + row * stride + j * step, mask=j < count, other=1).to(tl.uint64, bitcast=True)
        else:
            n = bound.to(tl.int64).to(tl.uint64, bitcast=True)
        tl.store(out + row * count + j, _below_draw(key, j + first, n), mask=j < count)

    return draw_below
