"""The pieces of the embedding engine's device step on their own: the bilinear models' written-out
gradients against autograd's, the fused Adagrad kernel against its torch twin (Triton's
interpreter on the CPU), KvsAll's answer index, the partition slots as one buffer, and what a
chunk costs in kernels
(the CPU twin's count of the launches a GPU makes op by op). The whole step against the Rust
engine is tests/test_embed_device.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import gpu_devices, triton_kernels

torch = pytest.importorskip("torch")

from strata.device import kernels  # noqa: E402
from strata.embed.device import adagrad, bilinear_rows, complex_rows, softmax_loss, step, vs_all  # noqa: E402
from strata.embed.device.backend import SlotBuffer  # noqa: E402
from strata.embed.device.rows import Gathered, Places, Table, unique_static  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))


def ctx_of(model: str, loss: str, adversarial: float | None = None) -> step.Ctx:
    """A context with the settings the scores and losses read (no tables)."""
    none = torch.zeros(0)
    return step.Ctx(
        model=model, dim=6, transe_norm=2, loss=loss, margin=0.5, gamma=1.5, adversarial=adversarial, lr=0.1,
        nodes=Table(none, none), rels=None, inverse_offset=0, corrupt="both", head_prob=None, negatives=5,
        degree_fraction=0.0, pool="partition", layout=none, part_size=0, num_nodes=0, reg="none", reg_weight=0.0,
    )  # fmt: skip


@pytest.mark.parametrize("model", step.BILINEAR)
@pytest.mark.parametrize(
    "loss, adversarial", [("softmax", None), ("logistic", None), ("logistic", 0.7), ("margin", None), ("margin", 1.3)]
)
def test_written_out_gradients_equal_autograd_s(model, loss, adversarial):
    """The bilinear models' hand-written backward (forward results reused) gives autograd's
    gradients of the same loss, weighted edges included; TransE and RotatE take autograd's."""
    gen = torch.Generator().manual_seed(1)
    sides, b, n, dim = 2, 4, 5, 6
    rows = [torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in
            [(sides, b, dim), (sides, b, dim), (sides, n, dim), (sides, b, step.rel_dim(model, dim))]]  # fmt: skip
    weights = torch.rand(b, generator=gen, dtype=torch.float64)
    ctx = ctx_of(model, loss, adversarial)
    loss_value, *grads = step.score_grads(ctx, *rows, weights)
    leaves = [x.clone().requires_grad_() for x in rows]
    a = step.combine(model, leaves[0], leaves[3])
    terms = autograd_terms(ctx, (a * leaves[1]).sum(-1), a @ leaves[2].mT) * weights
    want = torch.autograd.grad(terms.sum(), leaves, allow_unused=True)
    assert float(loss_value) == pytest.approx(float(terms.sum().detach()), rel=1e-12)
    for got, expected in zip(grads, want, strict=True):
        if expected is None:  # dot has no relation rows
            assert got.numel() == 0
        else:
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def autograd_terms(ctx: step.Ctx, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Each edge's loss term as the step computed it before its gradients were written out."""
    adv = None
    if ctx.adversarial is not None and ctx.loss != "softmax":
        # A constant of the gradient: computed from detached scores.
        adv = torch.softmax(ctx.adversarial * neg.detach(), -1) * neg.shape[-1]
    if ctx.loss == "softmax":
        return torch.logsumexp(torch.cat([pos[..., None], neg], -1), -1) - pos
    if ctx.loss == "logistic":
        u = 1.0 / neg.shape[-1] if adv is None else adv / neg.shape[-1]
        softplus = torch.nn.functional.softplus
        return softplus(-(pos + ctx.gamma), threshold=20.0) + (softplus(neg + ctx.gamma, threshold=20.0) * u).sum(-1)
    h = torch.relu(ctx.margin - pos[..., None] + neg)
    return (h if adv is None else h * adv).sum(-1)


@pytest.mark.parametrize("row_wise", [False, True], ids=["adagrad", "adagrad_row"])
@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_the_fused_adagrad_kernel_equals_its_torch_twin(monkeypatch, device, row_wise):
    """On the CPU the kernel runs in Triton's interpreter over CPU tensors; on CUDA it is the
    compiled kernel. The unused slots of the unique rows (the smallest key again, zero
    gradient) leave that row as its used slot left it."""
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(2)
        rows, width = 40, 7
        params = torch.randn(rows, width, generator=gen)
        state = torch.rand(rows, 1 if row_wise else width, generator=gen)
        keys, _, valid = unique_static(torch.randint(0, 12, (30,), generator=gen))
        assert keys[0] == 0 and not bool(valid.all())  # key 0 used, and unused slots
        grad = torch.randn(len(keys), width, generator=gen) * valid[:, None]
        want = Table(params.clone(), state.clone())
        adagrad.torch_step(want, keys, grad, lr=0.1)
        # Copies: on the CPU ``.to(device)`` would alias ``params``, which the kernel updates.
        got = Table(params.clone().to(device), state.clone().to(device))
        adagrad.kernel_step(got, keys.to(device), valid.to(device), grad.to(device), lr=0.1)
        torch.testing.assert_close(got.state.cpu(), want.state, rtol=1e-6, atol=0)
        torch.testing.assert_close(got.params.cpu(), want.params, rtol=1e-6, atol=1e-7)
        assert not torch.equal(want.params, params)


@pytest.mark.parametrize("row_wise", [False, True], ids=["adagrad", "adagrad_row"])
@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_the_bf16_adagrad_kernel_rounds_as_its_torch_twin(monkeypatch, device, row_wise):
    """A bf16 table's step: the kernel and the twin compute the same float32 values and round
    them with the same noise (the salt, and each value's place in its own table: rows 0..15 and
    16..31 are two slots of 16 rows, 32.. the tail), so their bits agree; on CUDA a value whose
    float32 result differs in its last bit may round the other way (a tenth at most)."""
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(3)
        rows, width = 40, 7
        params = torch.randn(rows, width, generator=gen).bfloat16()
        state = torch.rand(rows, 1 if row_wise else width, generator=gen).bfloat16()
        keys, _, valid = unique_static(torch.tensor([3, 3, 17, 20, 31, 32, 39, 5, 17, 0]))
        grad = torch.randn(len(keys), width, generator=gen) * valid[:, None]
        salt = torch.tensor([-(1 << 62) + 12345])
        places = Places(slot_rows=16, tail_row=32)
        want = Table(params.clone(), state.clone(), places)
        adagrad.torch_step(want, keys, grad, lr=0.1, salt=salt)
        got = Table(params.clone().to(device), state.clone().to(device), places)
        adagrad.kernel_step(got, keys.to(device), valid.to(device), grad.to(device), lr=0.1, salt=salt.to(device))
        for g, w, before in ((got.params, want.params, params), (got.state, want.state, state)):
            same = (g.cpu().view(torch.int16) == w.view(torch.int16)).float().mean()
            assert same == 1.0 if device == "cpu" else same > 0.9, same
            moved = (w.view(torch.int16) != before.view(torch.int16)).any(1)
            assert moved.tolist() == [r in {0, 3, 5, 17, 20, 31, 32, 39} for r in range(rows)]


def test_bf16_rounding_is_unbiased_and_its_noise_the_rust_engine_s():
    """``bf16::mix`` and ``noise`` against their definition in Python integers, and the
    rounding: a value a quarter of the way to the next bf16 rounds up a quarter of the time, an
    exact one never moves, a NaN stays one."""
    from strata.embed.device import bf16

    def mix(a: int, b: int) -> int:
        x = a ^ (((b << 16) | (b >> 16)) & 0xFFFF_FFFF) ^ 0x9E37_79B9
        x ^= x >> 16
        x = (x * 0x7FEB_352D) & 0xFFFF_FFFF
        x ^= x >> 15
        x = (x * 0x846C_A68B) & 0xFFFF_FFFF
        return x ^ (x >> 16)

    salt = 0xDEAD_BEEF_0123_4567
    positions = torch.arange(0, 5000, 7)
    got = bf16.noise(torch.tensor([salt - (1 << 64)]), positions)
    assert got.tolist() == [mix(salt & 0xFFFF_FFFF, (p ^ (salt >> 32)) & 0xFFFF_FFFF) for p in positions.tolist()]
    x = torch.full((100_000,), 1.0 + 0.25 / 128)
    rounded = bf16.round_stochastic(x, bf16.noise(torch.tensor([7]), torch.arange(100_000))).view(torch.bfloat16)
    assert set(rounded.float().unique().tolist()) == {1.0, 1.0 + 1 / 128}
    assert abs(float(rounded.float().mean()) - float(x[0])) < 2e-5
    exact = torch.tensor([0.75, -2.0, float("inf")])
    assert torch.equal(bf16.round_stochastic(exact, torch.full((3,), 0xFFFF)).view(torch.bfloat16).float(), exact)
    assert (
        bf16.round_stochastic(torch.tensor([float("nan")]), torch.tensor([0xFFFF])).view(torch.bfloat16).isnan().all()
    )


@pytest.mark.parametrize("kernel", [False, True], ids=["twin", "kernel"])
@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_a_step_over_the_touched_rows_equals_the_sorted_one_and_writes_no_other_row(monkeypatch, device, kernel):
    """Out of core a small buffer steps every row the chunk touched (a copy may be filling an
    untouched slot meanwhile): the same rows and values as the sorted unique rows' step, and no
    slot, valid or not, names an untouched row, so neither the kernel nor its twin writes one."""
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(5)
        rows, width = 48, 6
        params, state = torch.randn(rows, width, generator=gen), torch.rand(rows, width, generator=gen)
        keys = torch.randint(10, 30, (20,), generator=gen)
        grads = torch.randn(20, width, generator=gen)
        used = set(keys.tolist())
        results = {}
        for mode in ("touched", "unique"):
            table = Table(params.clone().to(device), state.clone().to(device))
            gathered = Gathered(table, keys.to(device), mode)
            assert set(gathered.keys.cpu().tolist()) == used, mode
            if kernel:
                grad = torch.zeros(len(gathered.keys), width, device=device)
                grad.index_add_(0, gathered.inverse, grads.to(device))
                adagrad.kernel_step(table, gathered.keys, gathered.valid, grad, lr=0.1)
            else:
                gathered.step(grads.to(device), lr=0.1)
            results[mode] = table
        touched = Gathered(Table(params, state), keys, "touched")
        assert touched.valid.tolist() == [r in used for r in range(rows)]
        got, want = results["touched"], results["unique"]
        # On cuda a row's gradients are summed in the order of atomic adds, which differs
        # between the two layouts: equal to float rounding there, bit for bit on the CPU.
        exact = dict(rtol=1e-6, atol=1e-7) if device == "cuda" else dict(rtol=0, atol=0)
        torch.testing.assert_close(got.params.cpu(), want.params.cpu(), **exact)
        torch.testing.assert_close(got.state.cpu(), want.state.cpu(), **exact)
        assert torch.equal(got.params.cpu()[~touched.valid], params[~touched.valid])
        assert torch.equal(got.state.cpu()[~touched.valid], state[~touched.valid])


@pytest.mark.parametrize(
    ("model", "dim"), [("dot", 8), ("distmult", 100), ("complex", 2), ("complex", 100), ("complex", 600)]
)
@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_the_bilinear_row_kernels_equal_their_torch_twins(monkeypatch, device, model, dim):
    """The query rows with their positive scores, and the rows' gradients (``ds``, ``dt``,
    ``dr`` from ``da0 + dpos t``), one launch each, for every bilinear model, rows of one
    complex number to wider than a block's, over a count of rows no block divides."""
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(dim)
        s, t, da0 = (torch.randn(2, 37, dim, generator=gen) for _ in range(3))
        r = torch.randn(2, 37, 0 if model == "dot" else dim, generator=gen)
        dpos = torch.randn(2, 37, generator=gen)
        on = [x.to(device) for x in (s, r, t)]
        a, pos = bilinear_rows.kernel_query_pos(model, *on)
        want_a, want_pos = bilinear_rows.twin_query_pos(model, s, r, t)
        torch.testing.assert_close(a.cpu(), want_a, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(pos.cpu(), want_pos, rtol=1e-5, atol=1e-5)
        got = bilinear_rows.kernel_row_grads(model, da0.to(device), dpos.to(device), *on[:2], on[2], a)
        want = bilinear_rows.twin_row_grads(model, da0, dpos, s, r, t, want_a)
        for name, g, w in zip(("ds", "dt", "dr"), got, want, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{model} {n}: {m}")
        with pytest.raises(ValueError, match="bilinear rows of complex: shapes"):
            bilinear_rows.kernel_query_pos("complex", on[0][..., :1], on[0][..., :1], on[0][..., :1])


@pytest.mark.parametrize("dim", [2, 100, 600])
@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_the_complex_product_kernel_equals_its_torch_twin(monkeypatch, device, dim):
    """``a = s r`` and the backward's ``da conj(r)``, ``da conj(s)`` in one launch each, rows of
    one complex number to wider than a block's (600 reals: 300 complex numbers, 13 rows a
    program), over a count of rows no block divides."""
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(dim)
        s, r, da = (torch.randn(2, 37, dim, generator=gen) for _ in range(3))
        (a,) = complex_rows.kernel_products(s.to(device), [r.to(device)], False)
        torch.testing.assert_close(a.cpu(), complex_rows.twin(s, r), rtol=1e-6, atol=1e-6)
        ds, dr = complex_rows.kernel_products(da.to(device), [r.to(device), s.to(device)], True)
        for got, y in ((ds, r), (dr, s)):
            torch.testing.assert_close(got.cpu(), complex_rows.twin(da, complex_rows.conj(y)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="complex products of rows"):
        complex_rows.kernel_products(s, [r[:, :3]], False)


def test_a_complex_product_under_autograd_is_the_twins_where_kernels_run(monkeypatch):
    """``pbg``'s ``complex_diagonal`` with a comparator other than ``dot`` (``cos``, ``l2``)
    takes its gradients by autograd through the query rows' product, for which the kernel has
    no backward: there the product is the twin's even where kernels run (forced here, as on
    ``cuda``, run by Triton's interpreter), and the kernel's elsewhere."""
    with triton_kernels(monkeypatch, "cpu"):
        launched = []

        def as_on_cuda(name, device, kernel, twin):
            launched.append(name)
            return kernel()

        monkeypatch.setattr(kernels, "fused", as_on_cuda)
        gen = torch.Generator().manual_seed(3)
        s, r, da = (torch.randn(3, 5, 8, generator=gen) for _ in range(3))
        leaves = [x.clone().requires_grad_() for x in (s, r)]
        got = torch.autograd.grad(complex_rows.product(*leaves), leaves, da)
        twin_leaves = [x.clone().requires_grad_() for x in (s, r)]
        want = torch.autograd.grad(complex_rows.twin(*twin_leaves), twin_leaves, da)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        assert launched == []
        with torch.no_grad():
            torch.testing.assert_close(complex_rows.product(*leaves), complex_rows.twin(s, r), rtol=1e-6, atol=1e-6)
        assert launched == ["ComplEx product"]


@pytest.mark.parametrize("negatives", [1, 600])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("device", gpu_devices("cpu"))
def test_the_softmax_loss_kernel_equals_its_torch_twin(monkeypatch, device, weighted, negatives):
    """Terms, ``dpos`` and ``dneg`` of both sides' rows, with negatives in one block and in
    several (blocks of 256 scores here: the online maximum and sum across blocks), and with
    scores far apart (a row whose positive dwarfs its negatives, one whose negatives dwarf it)."""
    monkeypatch.setattr(softmax_loss, "BLOCK", 256)
    with triton_kernels(monkeypatch, device):
        gen = torch.Generator().manual_seed(negatives)
        pos = torch.randn(2, 7, generator=gen) * 4
        neg = torch.randn(2, 7, negatives, generator=gen) * 4
        pos[0, 0], neg[1, 1] = 80.0, neg[1, 1] + 80.0
        weights = torch.rand(7, generator=gen) + 0.5 if weighted else None
        got = softmax_loss.kernel_loss_grads(
            pos.to(device), neg.to(device), None if weights is None else weights.to(device)
        )
        want = softmax_loss.twin(pos, neg, weights)
        assert got[0].dtype == torch.float64
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", gpu_devices("cpu"))
@pytest.mark.parametrize("corrupt", ["both", "tail", "head"])
@pytest.mark.parametrize("rels, pool", [(True, "partition"), (False, "partition"), (True, "resident")])
def test_the_chunk_keys_kernel_equals_its_torch_twin(monkeypatch, device, corrupt, rels, pool):
    """A chunk's sources, targets, uniform negatives and relation rows as buffer rows: one Triton
    kernel (Triton's interpreter on the CPU) against the twin's ops, for each corruption, with
    and without relation rows, the negatives from the bucket's target partition or from the
    three resident partitions, which sit at buffer rows out of their order."""
    from strata.embed.device import chunk_keys

    ctx = ctx_of("complex", "softmax")
    ctx.corrupt, ctx.negatives, ctx.inverse_offset, ctx.pool = corrupt, 37, 11, pool
    # Partitions of 700, 400 and 300 rows at buffer rows 1000, 9000 and 5000; the bucket's
    # source and destination are the first and the third.
    ctx.layout = torch.tensor(step.layout(pool, [1000, 9000, 5000], [700, 400, 300], (0, 2), None), device=device)
    ctx.rels = Table(torch.zeros(22, 6, device=device), torch.zeros(22, 6, device=device)) if rels else None
    gen = torch.Generator().manual_seed(3)
    edges = torch.stack(
        [torch.randint(0, 700, (50,), generator=gen), torch.randint(0, 11, (50,), generator=gen),
         torch.randint(0, 300, (50,), generator=gen)], 1,
    ).to(device)  # fmt: skip
    streams = torch.from_numpy(step.piece_streams(12345, 1)[0]).to(device)
    (stack,) = step.stacks_of(ctx, edges, None, streams)
    want_nodes, want_rels = step.twin_keys(ctx, [stack])
    with triton_kernels(monkeypatch, device):
        got = chunk_keys.kernel_keys(edges, ctx.layout, stack.streams.reshape(-1), stack.sides[0], 37, rels, 11,
                                     resident=pool == "resident")  # fmt: skip
    split = len(stack.sides) * (2 * 50 + 37)
    assert torch.equal(got[:split], want_nodes)
    assert (want_rels is None and got.numel() == split) or torch.equal(got[split:], want_rels)
    # Negatives fall in the target partition (destinations' rows for a tail side, sources' for a
    # head side), or in any resident partition's.
    negs = got[2 * 50 * len(stack.sides) : split].view(len(stack.sides), 37)
    for k, side in enumerate(stack.sides):
        spans = (
            [(5000, 300) if side == 0 else (1000, 700)]
            if pool == "partition"
            else [(1000, 700), (9000, 400), (5000, 300)]
        )
        assert bool(sum((negs[k] >= low) & (negs[k] < low + rows) for low, rows in spans).all())


def test_the_slot_buffer_grows_keeping_what_its_slots_hold():
    buf = SlotBuffer(torch.device("cpu"))
    first = buf.place(12, 4)  # 4 rows of 3 reals, one state a row
    buf.region(first, 12, 4).params.copy_(torch.arange(12.0))
    second = buf.place(18, 6)  # larger: every slot grows to 6 rows, the first kept
    assert (first, second) == (0, 1) and buf.size == (18, 6)
    table, slot_rows = buf.rows(3)
    assert slot_rows == 6 and table.params.shape == (12, 3) and table.state.shape == (12, 1)
    # Row r of the partition in slot i is buffer row i * slot_rows + r.
    assert table.params[0 * slot_rows + 2].tolist() == [6.0, 7.0, 8.0]
    buf.release(first)
    assert buf.place(6, 2) == first and buf.size == (18, 6)
    with pytest.raises(ValueError, match="do not hold whole rows of 4 reals"):
        buf.rows(4)


def test_the_pinned_region_is_the_buffers_tail_and_sizes_no_slot():
    """A typed run's pinned region (resident all epoch, of its own size) lies after the slots:
    a large one does not grow the partition slots, and the slots growing keep its rows."""
    buf = SlotBuffer(torch.device("cpu"))
    first = buf.place(12, 4)  # a partition of 4 rows of 3 reals
    tail = buf.place_tail(30, 10)  # the pinned region: 10 rows
    buf.region(tail, 30, 10).params.copy_(torch.arange(30.0))
    assert buf.size == (12, 4) and buf.params.numel() == 12 + 30
    table, slot_rows = buf.rows(3)
    assert table.params.shape == (14, 3) and buf.base(tail, slot_rows) == 4
    buf.place(12, 4)  # a second partition: the tail moves after it, its rows kept
    table, slot_rows = buf.rows(3)
    assert buf.base(tail, slot_rows) == 8 and table.params[8 + 2].tolist() == [6.0, 7.0, 8.0]
    buf.release(tail)  # released with the partitions at an epoch's end; placed again next
    assert buf.place_tail(30, 10) == tail and buf.region(first, 12, 4).params.numel() == 12


def test_a_chunk_launches_one_pass_over_the_slots_however_many_are_resident():
    """Per chunk at B1's settings (shrunk: the count depends on the settings, not the sizes),
    the kernels a GPU would launch op by op, and out of core with three resident partitions:
    the same count but for the resident pool's few (no pass per partition)."""
    from bench_embed_step import count

    b1 = count("b1", chunks=2, scale=0.02, profile=True)
    ooc = count("ooc", chunks=2, scale=0.02)
    assert b1["waits"] == ooc["waits"] == 0
    # 281 kernels before the step was batched and the slots made one buffer (319 out of core).
    assert b1["kernels"] <= 125, b1
    # Out of core: the resident pool's few, and the touched-row mask where one partition's
    # table steps every row.
    assert ooc["kernels"] <= b1["kernels"] + 6 + 2, (b1, ooc)
    # Each table's Adagrad step, the chunk's keys (its sources, targets, negatives and relation
    # rows), the bilinear rows each way (the query rows with their scores; the rows'
    # gradients) and the softmax loss is one kernel on cuda instead of the twin's torch ops (70
    # before the last three, 36 before the keys, 23 before the bilinear rows); one partition's
    # node table steps every row, without the sort, and out of core every row the chunk
    # touched (a copy may be filling a free slot of the buffer, 10 more kernels with the sort).
    assert b1["fused_kernels"] <= 19 and ooc["fused_kernels"] <= 21, (b1, ooc)
    # Where a chunk's time goes, by torch's profiler (on the host here): its score products first.
    names = [row["name"] for row in b1["profile"]]
    assert "aten::bmm" in names and all(row["calls"] > 0 and row["host_us"] >= 0 for row in b1["profile"]), names


def test_kvsall_asks_each_query_once_with_every_answer():
    """``vs_all.Answers``: of a chunk's edges, exactly those whose target is their query's
    smallest known answer ask it, labelled with all its answers (a brute force over the rows)."""
    gen = torch.Generator().manual_seed(3)
    raw = torch.stack([torch.randint(0, n, (400,), generator=gen) for n in (30, 5, 30)], 1)
    rows = torch.unique(raw, dim=0)  # sorted by (s, r, answer), duplicates kept once
    index = vs_all.Answers.index(rows)
    known: dict[tuple[int, int], list[int]] = {}
    for s, r, t in rows.tolist():
        known.setdefault((s, r), []).append(t)
    edges = raw[torch.randperm(len(raw), generator=gen)[:150]]
    asked, (query, answer) = index.asked(edges[:, 0], edges[:, 1], edges[:, 2])
    expect = [i for i, (s, r, t) in enumerate(edges.tolist()) if min(known[(s, r)]) == t]
    assert asked.tolist() == expect and expect
    for q, i in enumerate(asked.tolist()):
        s, r, _ = edges[i].tolist()
        assert answer[query == q].tolist() == sorted(known[(s, r)])
