"""Question: how many kernels and torch ops does one chunk of the embedding engine's device step
launch, and how long does it take on this machine's device?

    python benches/bench_embed_step.py [--device torch-cpu] [--case b1|ooc|all] [--chunks 5] [--profile]

A chunk at B1's settings (docs/benchmarks.md: ComplEx, 100 reals, 1,000 edges sharing 1,000
uniform negatives, both sides corrupted, softmax, Adagrad lr 0.1) on FB15k-237's shape (14,541
entities, 237 relations and their reciprocals, one partition), and the same chunk out of core
(`ooc`: three resident partitions of 5,000 rows, negatives from the resident pool, the chunk's
bucket between slots 0 and 1). The tables are synthetic: counts and step times do not depend on
their values. The step runs through the backend as the Rust epoch loop drives it (slots lent
through the hooks, one piece of chunks, CUDA graphs replaying on `cuda`); the counts are those of
a piece of `1 + chunks` chunks less those of a piece of one chunk, over `chunks`, after a warm-up
piece (so every chunk replays a captured step), from `strata.device.waits.HostWaits`. `seconds` is
a chunk's wall time with the piece's chunks replayed in runs of `graphs.RUN` a graph, as training
replays them, and `seconds_alone` with a graph a chunk. On the CPU
twin (`torch-cpu`) the kernels are the launches a GPU would make op by op (each op on a tensor
of one or more dimensions that is no view); a CUDA graph replays them as one launch but runs
them one after another all the same. `fused_kernels` counts each call of a Triton kernel (each
table's Adagrad step, each draw of negatives, each ComplEx product, each softmax loss) as the
one kernel it is on `cuda` (the twin runs them as torch ops).
On `cuda` only the seconds are measured: a replayed graph dispatches no torch op to count.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from common import profiled

#: B1's chunk on FB15k-237's shape (`bench_embed.py`'s B1) as the epoch loop describes it.
B1 = dict(
    model="complex", operator=None, comparator=None, dim=100, transe_norm=2, loss="softmax", margin=0.1, gamma=0.0,
    adversarial=None, lr=0.1, src_part=0, dst_part=0, inverse_offset=237, corrupt="both", head_prob=[],
    negatives=1000, negatives_head=1000, shared_negatives=True, degree_fraction=0.0, pool="partition", part_of=None,
    part_size=0, num_nodes=0, bank=None, typed_spans=None, feat=None, reg="none", reg_weight=0.0, reg_weighted=False,
    rel_reg_weight=None,
    entity_dropout=0.0, relation_dropout=0.0, independent_masks=False, training="negative_sampling",
    label_smoothing=0.0, reg_table=False, answers=None,
)  # fmt: skip

#: Each case: its settings over B1's, partition sizes, relations (reciprocals included), edges.
CASES = {
    "b1": (dict(), [14541], 474, 1000),
    "ooc": (dict(pool="resident", src_part=0, dst_part=1), [5000] * 3, 474, 1000),
}


def lent(rows: int, width: int, rng: np.random.Generator) -> tuple:
    """A float32 table as the epoch loop lends it: ``(params, state, rows, key, dtype)`` over
    host memory."""
    params = bytearray(rng.uniform(-0.1, 0.1, rows * width).astype(np.float32).tobytes())
    state = bytearray(rows * width * 4)
    return memoryview(params), memoryview(state), rows, id(params), "f32"


def setup(case: str, device: str, scale: float = 1.0):
    """A backend holding the case's slots, its context (``ctx`` dicts as the seam passes them) and
    a function that trains a piece of ``n`` chunks; ``scale`` shrinks the sizes (for tests)."""
    from strata.embed.device.backend import TorchCompute

    over, sizes, rels, b = CASES[case]
    c = {**B1, **over}
    shrink = lambda x: max(2, int(x * scale))  # noqa: E731
    sizes, b, rels = [shrink(s) for s in sizes], shrink(b), shrink(rels // 2) * 2
    negatives = shrink(c["negatives"])
    c.update(dim=shrink(c["dim"]) // 2 * 2, negatives=negatives, negatives_head=negatives, inverse_offset=rels // 2)
    rng = np.random.default_rng(0)
    dev = TorchCompute(device)
    c["parts"] = [lent(n, c["dim"], rng) for n in sizes]
    c["rels"] = lent(rels, c["dim"], rng)
    for p in c["parts"]:
        dev.slot_in("partition", p)
    dev.slot_in("relations", c["rels"])
    src, dst = sizes[c["src_part"]], sizes[c["dst_part"]]

    def piece(n: int, key: int = 1) -> None:
        ends = [rng.integers(0, src, n * b), rng.integers(0, rels // 2, n * b), rng.integers(0, dst, n * b)]
        edges = np.stack(ends, 1)
        bounds = [i * b for i in range(n + 1)]
        dev.train_piece([c], [0] * n, bounds, edges.astype(np.int32).tobytes(), b"", key)

    return dev, piece


def count(case: str, device: str = "torch-cpu", chunks: int = 5, scale: float = 1.0, profile: bool = False) -> dict:
    """``{kernels, ops, waits, fused_kernels, seconds}`` per chunk of ``case`` on ``device``
    (see the module's doc; the counts are None on ``cuda``): ``fused_kernels`` the kernels with
    each Adagrad step counted as the one fused kernel it is on ``cuda`` (the CPU twin runs its
    torch ops); seconds of the step's wall time on the host (the CPU twin's compute; on
    ``cuda`` after synchronising). With ``profile``, ``profile`` lists where a chunk's time
    goes (``common.profiled``), from a further piece run under torch's profiler."""
    import torch

    from strata.embed.device import graphs

    dev, piece = setup(case, device, scale)
    # Three runs of chunks and three lone chunks: each kind's eager first, its warm-up and its
    # capture.
    piece(3 * graphs.RUN + 3)
    counts = []
    for n in (1, 1 + chunks):
        counts.append(counted(piece, n, fused=False) + counted(piece, n, fused=True)[:1])
    sync = (lambda: torch.cuda.synchronize(dev.device)) if dev.cuda else (lambda: None)

    def seconds(run: int) -> float:
        """Seconds a chunk of a piece of ``1 + chunks``, the chunks in runs of ``run``."""
        longest, graphs.RUN = graphs.RUN, run
        try:
            sync()
            start = time.perf_counter()
            piece(1 + chunks)
            sync()
        finally:
            graphs.RUN = longest
        return (time.perf_counter() - start) / (1 + chunks)

    per = [(b - a) / chunks for a, b in zip(*counts, strict=True)]
    if dev.cuda:
        # A replayed CUDA graph dispatches no torch op: the counts are the CPU twin's to give.
        per = [None] * 4
    out = dict(
        kernels=per[0], ops=per[1], waits=per[2], fused_kernels=per[3], seconds=seconds(graphs.RUN),
        seconds_alone=seconds(1),
    )  # fmt: skip
    if profile:
        out["profile"] = profiled(lambda: (piece(1 + chunks), sync()), dev.cuda, 1 + chunks)
    return out


def counted(piece, n: int, fused: bool) -> tuple[int, int, int]:
    """``(kernels, ops, waits)`` of a piece of ``n`` chunks; with ``fused`` each call of a
    step's Triton kernels (``kernels.fused``: each table's Adagrad step, each draw of
    negatives, each bilinear model's rows and each ComplEx product, each softmax loss) counts as
    the one kernel it is on ``cuda``, where the CPU twin runs its torch ops."""
    from torch.utils._python_dispatch import _disable_current_modes

    from strata.device import kernels
    from strata.device.waits import HostWaits

    real = kernels.fused
    depth = [0]

    def one_kernel(name, device, kernel, twin):
        # A twin that calls another fused kernel's (bilinear rows call ComplEx's products) is
        # still the one kernel of the outer call on ``cuda``.
        depth[0] += 1
        try:
            with _disable_current_modes():
                out = real(name, device, kernel, twin)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            waits.kernels += 1
            waits.ops += 1
        return out

    with HostWaits() as waits:
        try:
            if fused:
                kernels.fused = one_kernel
            piece(n)
        finally:
            kernels.fused = real
    return waits.kernels, waits.ops, len(waits.waits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="torch-cpu")
    ap.add_argument("--case", choices=[*CASES, "all"], default="all")
    ap.add_argument("--chunks", type=int, default=32, help="chunks timed (twice the chunks of a graph's run)")
    ap.add_argument("--profile", action="store_true", help="list each case's ops and kernels by their time")
    args = ap.parse_args()
    cases = CASES if args.case == "all" else [args.case]
    out = {case: count(case, args.device, args.chunks, profile=args.profile) for case in cases}
    from strata.device import kernels

    # A kernel that failed was timed as its torch twin: the figures must say so.
    out["failed_kernels"] = kernels.failed()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
