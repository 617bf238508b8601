"""bfloat16 tables on the device, bit for bit the Rust engine's (``compute::bf16``).

A ``table_dtype = "bf16"`` run stores its partitions' rows and Adagrad state as bf16: half the
device memory per slot, so twice the rows fit a device budget. Rows are widened to float32 for
every computation and rounded back only when an update stores them. An Adagrad step is mostly
far below half a bf16 step (1/512 of the value), so it is rounded *stochastically*: up or down
with the probabilities that make the rounding unbiased. The noise is a hash of the chunk's key
(the *salt*, ``!salt`` for the state) and of the value's position in its own table (the Rust
engine's ``SharedRows`` index: ``row * width + column``), never of the value, so the device
rounds every value exactly as the Rust engine does and a run crosses between engines.

Tables are ``torch.bfloat16`` tensors (widened by ``.float()``, exactly); a rounded value is
made as its ``int16`` bit pattern. The hash's 32-bit values live in ``int64`` tensors, whose
wrapping products give their exact low 32 bits.
"""

from __future__ import annotations

import torch

_LOW32 = 0xFFFF_FFFF


def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``bf16::mix``: a 32-bit hash of the 32-bit values ``a`` and ``b`` (int64 tensors holding
    values below 2^32), broadcast."""
    x = a ^ (((b << 16) | (b >> 16)) & _LOW32) ^ 0x9E37_79B9
    x = x ^ (x >> 16)
    x = (x * 0x7FEB_352D) & _LOW32
    x = x ^ (x >> 15)
    x = (x * 0x846C_A68B) & _LOW32
    return x ^ (x >> 16)


def noise(salt: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The rounding noise of the values at ``position`` (int64, their index in their own table)
    for an update salted ``salt`` (a one-element int64 tensor, a ``u64``'s bit pattern):
    ``mix(salt as u32, position as u32 ^ (salt >> 32) as u32)``."""
    low, high = salt & _LOW32, (salt >> 32) & _LOW32
    return mix(low, (position & _LOW32) ^ high)


#: ``bf16::state_salt``'s constant, as the int64 of its bit pattern.
_STATE_SALT = 0x5851_F42D_4C95_7F2D


def state_salt(salt: torch.Tensor) -> torch.Tensor:
    """``bf16::state_salt``: the salt of an Adagrad state's rounding, given its row's."""
    return salt ^ _STATE_SALT


def round_stochastic(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``bf16::round_stochastic``: float32 ``x`` rounded to a neighbouring bf16 by the low 16
    bits of ``noise`` (int64, broadcast), as ``int16`` bit patterns; a NaN stays a quiet NaN."""
    bits = x.view(torch.int32).to(torch.int64) & _LOW32
    rounded = ((bits + (noise & 0xFFFF)) >> 16) & 0xFFFF
    rounded = torch.where(torch.isnan(x), (bits >> 16) | 0x40, rounded)
    return as_int16(rounded)


def as_int16(values: torch.Tensor) -> torch.Tensor:
    """int64 ``values`` in ``[0, 2^16)`` as the ``int16`` tensor of the same 16 bits."""
    return (values - ((values >> 15) << 16)).to(torch.int16)


def jit_helpers() -> tuple:
    """Jitted ``round_noise(salt, position)`` (:func:`noise` on a ``uint64`` salt) and
    ``rounded(x, noise)`` (:func:`round_stochastic` of float32 ``x``, as ``bfloat16``), for the
    Adagrad kernel's bf16 stores: a kernel's builder assigns them to globals of its module (see
    ``rng.jit_helpers``), built with that kernel's interpreter setting."""
    import triton

    global tl
    import triton.language as tl

    @triton.jit
    def round_noise(salt, position):
        a = salt & 0xFFFFFFFF
        b = (position.to(tl.uint64, bitcast=True) & 0xFFFFFFFF) ^ (salt >> 32)
        x = a ^ (((b << 16) | (b >> 16)) & 0xFFFFFFFF) ^ 0x9E3779B9
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    @triton.jit
    def rounded(x, noise):
        bits = x.to(tl.uint32, bitcast=True).to(tl.uint64)
        kept = ((bits + (noise & 0xFFFF)) >> 16) & 0xFFFF
        kept = tl.where(x != x, (bits >> 16) | 0x40, kept)
        return kept.to(tl.uint16).to(tl.bfloat16, bitcast=True)

    return round_noise, rounded
