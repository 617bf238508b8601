"""A chunk's row keys as one Triton kernel: the buffer rows of each side's sources and targets,
of its shared negatives (uniform over the bucket's target partition, or over every resident
partition's rows, drawn from the side's stream) and of its relation rows, which the torch twin
(``step.twin_keys``) builds in about ten ops. On ``cuda``; under ``TRITON_INTERPRET=1`` the
kernel runs on CPU tensors, so the tests check that both give the same keys.

Layout of the keys (int64, one flat tensor): for sides ``k < S`` (their orientations
``first_side + k``: 0 corrupts tails, scoring ``(s, r, t')``; 1 heads), the sources ``S x b``,
the targets ``S x b``, the negatives ``S x n``, then with relation rows their keys ``S x b``
(a head side's the inverse relation, ``relation + offset``). ``edges`` is ``b x 3`` int64
``(source local row, relation, destination local row)``; ``layout`` int64 as ``step.Ctx``'s
(where the bucket's two partitions start, their rows, the resident rows, then for the resident
pool each of the ``P`` resident partitions' end in the resident rows and its buffer row less
its start there); ``streams`` ``S`` int64.
"""

from __future__ import annotations

import torch

from strata.device import kernels, rng

#: Keys a kernel program writes.
BLOCK = 1024
#: Where the resident pool's table starts in ``layout`` (``step.POOL``).
POOL = 5


def kernel_keys(
    edges: torch.Tensor,
    layout: torch.Tensor,
    streams: torch.Tensor,
    first_side: int,
    n: int,
    rels: bool,
    offset: int,
    resident: bool = False,
) -> torch.Tensor:
    """The keys (module doc) by the Triton kernel, the negatives from the bucket's target
    partition or, with ``resident``, from every resident partition: on ``cuda``, and under
    ``TRITON_INTERPRET=1`` on CPU tensors (tests)."""
    sides, b = streams.numel(), edges.shape[0]
    out = torch.empty(sides * (2 * b + n + (b if rels else 0)), dtype=torch.int64, device=edges.device)
    if out.numel():
        with kernels.on_device(edges):
            _kernel()[(-(-out.numel() // BLOCK),)](
                edges.contiguous(), layout, streams.contiguous(), out, b, n, offset, out.numel(),
                (layout.numel() - POOL) // 2 if resident else 0, S=sides, FIRST_SIDE=first_side, RESIDENT=resident,
                BLOCK=BLOCK,
                **kernels.OPTIONS,
            )  # fmt: skip
    return out


@kernels.builder
def _kernel():
    """The jitted kernel, built on first use so that ``TRITON_INTERPRET`` set by then counts."""
    import triton
    import triton.language as tl

    # The kernel calls the draw helper as a global of this module (see rng.jit_helpers).
    global _below_draw
    _below_draw = rng.jit_helpers().below_draw

    # Sizes follow the chunk; left unspecialised so that one variant serves them.
    @triton.jit(do_not_specialize=["b", "n", "offset", "total", "parts"])
    def chunk_keys(edges, layout, streams, out, b, n, offset, total, parts, S: tl.constexpr,
                   FIRST_SIDE: tl.constexpr, RESIDENT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = i < total
        ends = 2 * S * b
        # Sources and targets: side k's own end, then the other end, of edge e.
        is_end = live & (i < ends)
        role, within = i // (S * b), i % (S * b)
        k, e = within // b, within % b
        end = tl.where(role == 0, FIRST_SIDE + k, 1 - FIRST_SIDE - k)
        row = tl.load(edges + e * 3 + 2 * end, mask=is_end, other=0)
        end_key = row + tl.load(layout + end, mask=is_end, other=0)
        # Negatives: draw j of side k's stream below its target partition's rows, or below the
        # resident rows, then placed in the buffer by the partition it falls in.
        is_neg = live & (i >= ends) & (i < ends + S * n)
        q = tl.where(is_neg, i - ends, 0)
        kn, j = q // n, q % n
        stream = tl.load(streams + kn, mask=is_neg, other=0).to(tl.uint64, bitcast=True)
        if RESIDENT:
            bound = tl.load(layout + 4).to(tl.uint64, bitcast=True)
            drawn = _below_draw(stream, j, bound)
            part = tl.full([BLOCK], 0, tl.int64)
            for p in range(0, parts):
                part += (drawn >= tl.load(layout + 5 + p)).to(tl.int64)
            neg_key = drawn + tl.load(layout + 5 + parts + part, mask=is_neg, other=0)
        else:
            target = 1 - FIRST_SIDE - kn
            bound = tl.load(layout + 2 + target, mask=is_neg, other=1).to(tl.uint64, bitcast=True)
            neg_key = tl.load(layout + target, mask=is_neg, other=0) + _below_draw(stream, j, bound)
        # Relations: a head side scores the inverse relation.
        is_rel = live & (i >= ends + S * n)
        r = tl.where(is_rel, i - ends - S * n, 0)
        kr, er = r // b, r % b
        rel = tl.load(edges + er * 3 + 1, mask=is_rel, other=0)
        rel_key = rel + tl.where(FIRST_SIDE + kr == 1, offset, 0)
        key = tl.where(i < ends, end_key, tl.where(i < ends + S * n, neg_key, rel_key))
        tl.store(out + i, key, mask=live)

    return chunk_keys
