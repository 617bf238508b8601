"""Served GNN models: the reference sage_pool and GIN layers, export to safetensors and npz,
and the native Rust kernels (fp32 and int8) against the PyTorch forward, plus bad files and
inputs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import needs

torch = needs("torch")

from strata.errors import ConfigError, InputError  # noqa: E402
from strata.gnn import export_model  # noqa: E402
from strata.gnn.models import GNN, Block, GINConv, SAGEPoolConv  # noqa: E402
from strata.serve.native import NativeModel  # noqa: E402
from strata.weights import _write_safetensors, load_architecture  # noqa: E402

KINDS = ["sage", "sage_pool", "gcn", "gin"]
IN_DIM, HIDDEN, OUT_DIM = 7, 16, 5
FANOUTS = [4, 3]


def random_csc(rng: np.random.Generator, num_src: int, num_dst: int, max_degree: int = 5):
    """A CSC block: each destination gets 0..max_degree random sources (repeats allowed)."""
    degrees = rng.integers(0, max_degree + 1, size=num_dst)
    degrees[0] = 0  # always one destination without sources (mean/max fall back to zeros)
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.uint64)
    indices = rng.integers(0, num_src, size=int(indptr[-1])).astype(np.uint32)
    return num_src, num_dst, indptr, indices


def random_model(kind: str, seed: int = 0) -> GNN:
    torch.manual_seed(seed)
    model = GNN(kind, IN_DIM, HIDDEN, OUT_DIM, layers=2)
    if kind == "gin":
        with torch.no_grad():  # a non-zero eps, so that the file's value matters
            for conv in model.convs:
                conv.eps.fill_(0.3)
    return model.eval()


def problem(seed: int = 1):
    """Two chained CSC blocks (40 -> 12 -> 4 rows) and input rows."""
    rng = np.random.default_rng(seed)
    blocks = [random_csc(rng, 40, 12), random_csc(rng, 12, 4)]
    x = rng.standard_normal((40, IN_DIM)).astype(np.float32)
    return blocks, x


def torch_forward(model: GNN, blocks, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model([Block.from_csc(*b) for b in blocks], torch.from_numpy(x)).numpy()


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| relative to max |want| (norm-relative, robust to outputs near zero)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("kind", KINDS)
def test_native_forward_matches_torch(tmp_path, kind, fmt):
    model = random_model(kind)
    blocks, x = problem()
    want = torch_forward(model, blocks, x)
    path = export_model(model, tmp_path / f"m.{fmt}", fanouts=FANOUTS)
    arch = {"kind": kind, "in_dim": IN_DIM, "hidden_dim": HIDDEN, "out_dim": OUT_DIM, "layers": 2}
    assert load_architecture(path) == {**arch, "fanouts": FANOUTS}

    native = NativeModel.load(path)
    assert native.architecture == {**arch, "fanouts": FANOUTS}
    assert native.precision == "fp32"
    assert native.parameters == sum(t.numel() for t in model.state_dict().values())
    assert native.nbytes == 4 * native.parameters
    got = native.forward(blocks, x)
    assert got.dtype == np.float32 and got.shape == (4, OUT_DIM)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-6, max_rel_error(got, want)

    # The edge-list blocks the loaders yield, and a torch input, give the same result.
    torch_blocks = [Block.from_csc(*b) for b in blocks]
    np.testing.assert_array_equal(native.forward(torch_blocks, torch.from_numpy(x)), got)

    quant = NativeModel.load(path, precision="int8")
    assert quant.precision == "int8" and quant.nbytes < native.nbytes / 2
    assert max_rel_error(quant.forward(blocks, x), want) <= 0.05


def test_native_forward_takes_raw_sampler_bytes(tmp_path):
    """The native epoch yields blocks as (num_src, num_dst, uint64 bytes, uint32 bytes)."""
    model = random_model("sage")
    blocks, x = problem(seed=3)
    native = NativeModel.load(export_model(model, tmp_path / "m.safetensors", fanouts=FANOUTS))
    raw = [
        (s, d, bytearray(p.astype("<u8").tobytes()), bytearray(ix.astype("<u4").tobytes())) for s, d, p, ix in blocks
    ]
    np.testing.assert_array_equal(native.forward(raw, x), native.forward(blocks, x))
    # Objects with the four CSC fields (the service client's blocks) too.
    named = [SimpleNamespace(num_src=s, num_dst=d, indptr=p.astype(np.int64), indices=ix) for s, d, p, ix in blocks]
    np.testing.assert_array_equal(native.forward(named, x), native.forward(blocks, x))


def test_reference_sage_pool_and_gin_formulas():
    torch.manual_seed(0)
    # Destinations 0, 1, 2: 0 <- {1, 3}, 1 <- {} (no sources), 2 <- {0}.
    block = Block.from_csc(4, 3, np.array([0, 2, 2, 3]), np.array([1, 3, 0]))
    x = torch.randn(4, 5)

    pool = SAGEPoolConv(5, 3)
    h = torch.relu(pool.pool_lin(x))
    aggregated = torch.stack([torch.maximum(h[1], h[3]), torch.zeros(5), h[0]])
    want = pool.self_lin(x[:3]) + pool.neigh_lin(aggregated)
    assert torch.allclose(pool(block, x), want, atol=1e-6)

    gin = GINConv(5, 3)
    assert gin.eps.requires_grad and float(gin.eps.detach()) == 0.0
    with torch.no_grad():
        gin.eps.fill_(0.5)
    summed = 1.5 * x[:3] + torch.stack([x[1] + x[3], torch.zeros(5), x[0]])
    assert torch.allclose(gin(block, x), gin.lin2(torch.relu(gin.lin1(summed))), atol=1e-6)
    fixed = GINConv(5, 3, train_eps=False)
    assert "eps" in fixed.state_dict() and not any(n == "eps" for n, _ in fixed.named_parameters())


@pytest.mark.parametrize("kind", ["sage_pool", "gin"])
def test_new_kinds_train(kind):
    torch.manual_seed(0)
    outer = Block.from_csc(6, 4, np.array([0, 2, 3, 5, 6]), np.array([4, 5, 0, 1, 2, 3]))
    inner = Block.from_csc(4, 2, np.array([0, 3, 4]), np.array([1, 2, 3, 0]))
    model = GNN(kind, 5, 8, 3, layers=2)
    out = model([outer, inner], torch.randn(6, 5))
    assert out.shape == (2, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="expected sage, sage_pool, gcn, gin, gat, rgcn or sage_hetero, got 'gine'"):
        GNN("gine", 5, 8, 3)


def test_gnn_train_config_accepts_the_new_kinds(strata_cli):
    help_text = strata_cli("gnn", "train", "--help").stdout
    for kind in ("sage_pool", "gin"):
        assert kind in help_text


def test_export_refuses_gat_and_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="'gat' model cannot be served"):
        export_model(GNN("gat", IN_DIM, HIDDEN, OUT_DIM), tmp_path / "m.safetensors", fanouts=FANOUTS)
    model = random_model("gcn")
    with pytest.raises(ValueError, match=r"fanouts: need 2 values"):
        export_model(model, tmp_path / "m.safetensors", fanouts=[5])
    with pytest.raises(ValueError, match=r"each >= 1 or -1"):
        export_model(model, tmp_path / "m.safetensors", fanouts=[5, 0])
    with pytest.raises(ValueError, match="cannot tell the format"):
        export_model(model, tmp_path / "m.bin", fanouts=FANOUTS)
    with pytest.raises(ValueError, match="expected safetensors or npz, got 'onnx'"):
        export_model(model, tmp_path / "m.bin", fanouts=FANOUTS, format="onnx")
    with pytest.raises(TypeError, match=r"expected a strata\.gnn\.models\.GNN"):
        export_model(torch.nn.Linear(2, 2), tmp_path / "m.safetensors", fanouts=FANOUTS)
    # An explicit format wins over the suffix, and loading reads the magic bytes.
    path = export_model(model, tmp_path / "weights.bin", fanouts=FANOUTS, format="npz")
    assert NativeModel.load(path).architecture["kind"] == "gcn"
    assert load_architecture(path, format="npz")["layers"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]  # no temporary left


def write_safetensors(path, tensors: dict, architecture: dict | None) -> None:
    meta = {} if architecture is None else {"strata.architecture": json.dumps(architecture)}
    with open(path, "wb") as f:
        _write_safetensors(f, {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}, meta)


def exported(kind: str = "gcn"):
    model = random_model(kind)
    tensors = {k: v.numpy() for k, v in model.state_dict().items()}
    arch = {"kind": kind, "in_dim": IN_DIM, "hidden_dim": HIDDEN, "out_dim": OUT_DIM, "layers": 2}
    return tensors, {**arch, "fanouts": FANOUTS}


def test_a_model_exported_as_sage_mean_still_loads_as_sage(tmp_path, capfd):
    """GraphSAGE-mean was served as `sage_mean` before it had one name on both sides: such a
    file loads as `sage` (a deprecation warning in Python, a note from the native loader) and
    gives what the same file under the new name gives."""
    tensors, arch = exported("sage")
    old, new = tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    write_safetensors(old, tensors, {**arch, "kind": "sage_mean"})
    write_safetensors(new, tensors, arch)
    with pytest.warns(DeprecationWarning, match="'sage_mean' is deprecated and loads as 'sage'"):
        assert load_architecture(old) == arch
    native = NativeModel.load(old)
    assert native.architecture == arch
    assert "layer kind `sage_mean` is deprecated and loads as `sage`" in capfd.readouterr().err
    blocks, x = problem()
    np.testing.assert_array_equal(native.forward(blocks, x), NativeModel.load(new).forward(blocks, x))


def test_missing_extra_and_misshapen_tensors_are_named(tmp_path):
    tensors, arch = exported()
    path = tmp_path / "m.safetensors"

    write_safetensors(path, {k: v for k, v in tensors.items() if k != "convs.1.lin.bias"}, arch)
    with pytest.raises(
        InputError, match=r"missing tensors that a 2-layer gcn model \(7 -> 16 -> 5\) needs: convs.1.lin.bias"
    ):
        NativeModel.load(path)

    write_safetensors(path, {**tensors, "convs.2.lin.weight": np.zeros((5, 5))}, arch)
    with pytest.raises(InputError, match=r"does not have: convs\.2\.lin\.weight"):
        NativeModel.load(path)

    write_safetensors(path, {**tensors, "convs.0.lin.weight": np.zeros((16, 6))}, arch)
    with pytest.raises(InputError, match=r"tensor convs.0.lin.weight: expected shape \[16, 7\] .* found \[16, 6\]"):
        NativeModel.load(path)

    # npz with a tensor missing, and without an architecture.
    npz = tmp_path / "m.npz"
    np.savez(npz, **{k: v for k, v in tensors.items() if k != "convs.0.lin.weight"})
    with pytest.raises(InputError, match="declares no architecture"):
        NativeModel.load(npz)
    with pytest.raises(InputError, match=r"needs: convs\.0\.lin\.weight"):
        NativeModel.load(npz, architecture=arch)


def test_architecture_override_and_mismatch(tmp_path):
    tensors, arch = exported("sage")
    path = tmp_path / "m.npz"
    np.savez(path, **tensors)  # no declared architecture: the given one is used
    assert NativeModel.load(path, architecture=arch).architecture == arch

    with pytest.raises(InputError, match=r"missing tensors that a 3-layer sage model .* convs.2.self_lin.weight"):
        NativeModel.load(path, architecture={**arch, "layers": 3, "fanouts": [4, 3, 2]})
    with pytest.raises(InputError, match=r"architecture.fanouts: need one fanout per layer \(2\), got 1"):
        NativeModel.load(path, architecture={**arch, "fanouts": [4]})
    with pytest.raises(InputError, match=r"does not have: convs\.1\."):
        NativeModel.load(path, architecture={**arch, "layers": 1, "fanouts": [4], "out_dim": HIDDEN})
    with pytest.raises(
        InputError, match=r"tensor convs.0.self_lin.weight: expected shape \[16, 8\] .* found \[16, 7\]"
    ):
        NativeModel.load(path, architecture={**arch, "in_dim": IN_DIM + 1})
    with pytest.raises(ConfigError, match="unknown variant `gat`"):
        NativeModel.load(path, architecture={**arch, "kind": "gat"})
    with pytest.raises(ConfigError, match="expected fp32 or int8"):
        NativeModel.load(path, precision="fp16", architecture=arch)


def test_bad_files(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x00\x10\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(InputError, match=r"m\.safetensors: not a safetensors file, or truncated"):
        NativeModel.load(path)
    with pytest.raises(FileNotFoundError, match=r"nothing\.npz"):
        NativeModel.load(tmp_path / "nothing.npz")
    with pytest.raises(InputError, match=r"is not a regular file"):
        NativeModel.load(tmp_path)
    with pytest.raises(ValueError, match="truncated safetensors file"):
        load_architecture(path)


def test_bad_forward_inputs(tmp_path):
    model = random_model("gcn")
    native = NativeModel.load(export_model(model, tmp_path / "m.safetensors", fanouts=FANOUTS))
    blocks, x = problem()
    with pytest.raises(ValueError, match=r"x: expected a 2-D array of \(rows, in_dim=7\), got shape \(40, 6\)"):
        native.forward(blocks, x[:, :6])
    with pytest.raises(InputError, match=r"x: expected blocks\[0\].num_src x in_dim = 40 x 7 = 280 values, got 273"):
        native.forward(blocks, x[:39])
    with pytest.raises(InputError, match="needs 2 blocks, got 1"):
        native.forward(blocks[:1], x)
    with pytest.raises(InputError, match=r"blocks\[1\]: num_src 40 must equal blocks\[0\].num_dst 12"):
        native.forward([blocks[0], blocks[0]], x)
    s, d, indptr, indices = blocks[0]
    bad = indices.copy()
    bad[0] = 40
    with pytest.raises(InputError, match=r"blocks\[0\]: source index 40 is out of range \(num_src 40\)"):
        native.forward([(s, d, indptr, bad), blocks[1]], x)
    with pytest.raises(ValueError, match=r"blocks\[0\].indices: negative value -1"):
        native.forward([(s, d, indptr, indices.astype(np.int64) - 1), blocks[1]], x)
    with pytest.raises(TypeError, match=r"blocks\[0\]: expected a strata\.gnn\.models\.Block"):
        native.forward([object(), blocks[1]], x)
