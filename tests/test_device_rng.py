"""The torch twin of Strata's counter-based randomness (strata.device.rng) draws bit for bit what
the Rust engine draws (strata._native.rng_*), on every key and position, including the values
whose top bit is set (negative as int64) and the edges of Lemire's multiply-shift. Where torch
sees a GPU the draws are made on ``cuda`` too (``gpu_devices``): its int64 arithmetic wraps as the
CPU's."""

import numpy as np
import pytest

from conftest import gpu_devices, needs, triton_kernels

torch = needs("torch")

from strata import _native  # noqa: E402
from strata.device import kernels, rng  # noqa: E402

#: The CPU, and the GPU where torch sees one.
DEVICES = gpu_devices("cpu")
MASK = (1 << 64) - 1
KEYS = [0, 1, 7, 1234567, (1 << 63) - 1, 1 << 63, MASK, 0x9E3779B97F4A7C15, 0xDEADBEEFCAFEF00D]


def rust_draws(key: int, position: int, count: int, below: int | None = None) -> list[int]:
    return np.frombuffer(bytes(_native.rng_draws(key, position, count, below)), dtype="<u8").tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_splitmix64_matches_its_published_reference_stream(device):
    # SplitMix64 seeded with 1234567 (Steele, Lea and Flood's generator; the sequence every
    # implementation checks against). Draw k of Strata's stream of key s is SplitMix64(s)'s k-th.
    published = [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert rng.as_u64(rng.draw(1234567, torch.arange(5, device=device))) == published
    assert rust_draws(1234567, 0, 5) == published


@pytest.mark.parametrize("device", DEVICES)
def test_draws_and_derivations_equal_the_rust_engine_s(device):
    positions = torch.tensor([0, 1, 2, 3, 1000, 123456789, (1 << 40) + 3])
    for key in KEYS:
        on_device = torch.tensor(rng.as_i64(key), device=device)
        for p in positions.tolist():
            assert rng.as_u64(rng.draw(key, torch.tensor([p], device=device))) == rust_draws(key, p, 1), (key, p)
        for index in [0, 1, 2, 99, 1 << 33, MASK]:
            assert rng.as_u64(rng.derive(on_device, index)) == [_native.rng_derive(key, index)], (key, index)
            assert rng.derive_int(key, index) == _native.rng_derive(key, index), (key, index)
    # Broadcast over a tensor of keys: each element its own stream.
    keys = rng.derive(5, torch.arange(64, device=device))
    got = rng.as_u64(rng.draw(keys, torch.tensor(3)))
    assert got == [rust_draws(_native.rng_derive(5, i), 3, 1)[0] for i in range(64)]


def test_host_derivations_over_arrays_equal_the_rust_engine_s():
    indices = np.array([0, 1, 2, 99, 1 << 33, MASK], dtype=np.uint64)
    for key in KEYS:
        got = rng.derive_host(key, indices).tolist()
        assert got == [_native.rng_derive(key, int(i)) for i in indices], key
        assert int(rng.derive_host(key, 7)) == _native.rng_derive(key, 7)
    # A piece's streams: chunk c's key derive(key, c), then its streams derive(chunk key, k).
    from strata.embed.device import step

    rows = step.piece_streams(KEYS[-1], 300).view(np.uint64)
    for c in (0, 1, 299):
        chunk = _native.rng_derive(KEYS[-1], c)
        assert int(rows[c, step.SALT]) == chunk
        assert rows[c, : step.STREAMS].tolist() == [_native.rng_derive(chunk, k) for k in range(step.STREAMS)]
    assert step.piece_streams(1, 0).shape == (0, step.STREAMS + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_below_equals_rust_s_multiply_shift_at_every_scale(device):
    for n in [1, 2, 3, 10, 2708, 14541, (1 << 31) - 1, 1 << 32, (1 << 32) + 1, 10**12 + 7, (1 << 62) + 12345]:
        for key in KEYS[:5]:
            bits = rng.draw(key, torch.arange(200, device=device))
            got = rng.below(bits, n)
            assert got.tolist() == rust_draws(key, 0, 200, below=n), (key, n)
            assert int(got.min()) >= 0 and int(got.max()) < n


@pytest.mark.parametrize("device", DEVICES)
def test_unit_is_uniform_from_53_bits(device):
    bits = rng.draw(11, torch.arange(100_000, device=device))
    u = rng.unit(bits)
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005
    # The same 53 bits as Rust's next_f64: exact, not approximately.
    reference = [(x >> 11) / (1 << 53) for x in rust_draws(11, 0, 100)]
    assert u[:100].tolist() == reference


def test_bad_inputs_name_what_was_expected():
    with pytest.raises(ValueError, match="not a 64-bit unsigned"):
        rng.as_i64(1 << 64)
    with pytest.raises(TypeError, match="int64"):
        rng.draw(torch.tensor([1], dtype=torch.int32), 0)


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_derivation_kernel_derives_what_the_rust_engine_derives(monkeypatch, device):
    """A hop's node keys as one Triton kernel (on the CPU in Triton's interpreter): each
    ``derive(key, index)`` the Rust engine's, for keys and indices across the u64 range."""
    with triton_kernels(monkeypatch, device):
        index = torch.tensor([[0, 1, 2, 99], [1 << 33, rng.as_i64(MASK), -5, 7]], device=device)
        for key in KEYS:
            got = rng.kernel_derive_each(key, index)
            assert got.shape == index.shape and torch.equal(got, rng.derive(key, index))
            want = [_native.rng_derive(key, i & MASK) for i in index.reshape(-1).tolist()]
            assert rng.as_u64(got) == want, key
            # The key as a device tensor (what a replayed CUDA graph reads) derives the same.
            held = torch.full((1,), rng.as_i64(key), dtype=torch.int64, device=device)
            assert torch.equal(rng.kernel_derive_each(held, index), got)
        assert rng.kernel_derive_each(3, index[:, :0]).shape == (2, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_draw_below_kernel_draws_what_the_rust_engine_draws(monkeypatch, device):
    """The negatives' draws of a chunk as one Triton kernel (on the CPU in Triton's
    interpreter): ``below(draw(key, first + j), n)`` of every stream, with ``n`` a host value, a
    device scalar or one per stream, equal to the Rust engine's and to the torch twin's."""
    with triton_kernels(monkeypatch, device):
        keys = [KEYS[2], KEYS[5], KEYS[8]]
        streams = torch.tensor([[rng.as_i64(k)] for k in keys], device=device)
        for n in [1, 7, (1 << 40) + 3, (1 << 63) - 1]:
            bounds = [n, torch.tensor(n, device=device), torch.tensor([[n], [5], [1 << 33]], device=device)]
            for bound in bounds:
                got = rng.kernel_draw_below(streams, 9, 1500, bound)
                assert torch.equal(got, rng.twin_draw_below(streams, 9, 1500, bound))
                per_stream = [n, 5, 1 << 33] if bound is bounds[2] else [n] * 3
                for row, (key, m) in zip(got.cpu().tolist(), zip(keys, per_stream, strict=True), strict=True):
                    assert row == rust_draws(key, 9, 1500, m)
        assert rng.kernel_draw_below(streams, 0, 0, 5).shape == (3, 0)
        # One bound a draw (Floyd's sampling: draw s of a node below j + 1): each draw as the
        # Rust engine's of its own bound.
        per_draw = torch.tensor([[3 + j + 40 * i for j in range(9)] for i in range(3)], device=device)
        got = rng.kernel_draw_below(streams, 2, 9, per_draw)
        assert torch.equal(got, rng.twin_draw_below(streams, 2, 9, per_draw))
        for row, key, bounds in zip(got.cpu().tolist(), keys, per_draw.cpu().tolist(), strict=True):
            assert row == [rust_draws(key, 2 + j, 1, m)[0] for j, m in enumerate(bounds)]


def test_a_failing_kernel_is_said_once_and_its_twin_serves_from_then_on(monkeypatch, capsys):
    """A Triton that cannot compile a kernel for the GPU at hand must not stop the run: the
    twin's values come back, the failure is said once, and the kernel is not tried again.
    ``torch.device("cuda")`` is only a name here: nothing runs on it."""
    monkeypatch.setattr(kernels, "has_triton", lambda: True)
    monkeypatch.setattr(kernels, "_FAILED", {})
    calls = []

    def kernel():
        calls.append(1)
        raise RuntimeError("PassManager::run failed\nmore lines")

    cuda = torch.device("cuda")
    assert kernels.fused("draw_below", cuda, kernel, lambda: 7) == 7
    assert kernels.fused("draw_below", cuda, kernel, lambda: 8) == 8
    assert len(calls) == 1
    err = capsys.readouterr().err
    assert err.count("the draw_below Triton kernel failed on cuda (RuntimeError: PassManager::run failed)") == 1
    assert "more lines" not in err
    # On the CPU the kernel is never tried.
    assert kernels.fused("other", torch.device("cpu"), kernel, lambda: 9) == 9
    assert len(calls) == 1
