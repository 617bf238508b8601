"""Running an exported GNN natively, without a server: the graph service's own Rust kernels
(fp32, or int8 weights and activations) on sampled blocks.

>>> model = NativeModel.load("model.safetensors", precision="int8")
>>> logits = model.forward(batch.blocks, batch.x)   # numpy (num_seeds, out_dim)

``blocks`` may be the :class:`strata.gnn.models.Block` objects the loaders yield, CSC tuples
``(num_src, num_dst, indptr, indices)`` as the native sampler produces (arrays, or the raw
uint64 / uint32 bytes), or objects with those four fields (the service client's blocks).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .. import _native


class NativeModel:
    """A model exported by :func:`strata.gnn.export_model`, loaded for native inference."""

    def __init__(self, native):
        """Wraps the native handle; use :meth:`load`."""
        self._native = native

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        precision: str = "fp32",
        *,
        format: str | None = None,
        architecture: dict | None = None,
    ) -> NativeModel:
        """Loads the weights file ``path`` (safetensors or npz: ``format``, else the suffix or
        the file's first bytes say which) in ``precision`` (``fp32`` or ``int8``).
        ``architecture`` (``kind``, ``in_dim``, ``hidden_dim``, ``out_dim``, ``layers``,
        ``fanouts``) overrides the one the file declares. A file whose tensors do not match the
        architecture raises ``strata.errors.InputError`` naming them."""
        return cls(_native.serve_model_load(os.fspath(path), precision, format, architecture))

    @property
    def architecture(self) -> dict:
        """``{"kind", "in_dim", "hidden_dim", "out_dim", "layers", "fanouts"}``."""
        return self._native.architecture

    @property
    def precision(self) -> str:
        """``fp32`` or ``int8``."""
        return self._native.precision

    @property
    def parameters(self) -> int:
        """Number of scalars in the weights."""
        return self._native.parameters

    @property
    def nbytes(self) -> int:
        """Bytes the weights occupy in memory as served."""
        return self._native.nbytes

    def forward(self, blocks: Sequence, x) -> np.ndarray:
        """The model's outputs for the seeds, float32 ``(blocks[-1].num_dst, out_dim)``.

        ``blocks``: one per layer in input-to-output order (``blocks[0]`` reads ``x``);
        ``x``: the input rows, ``(blocks[0].num_src, in_dim)`` (a NumPy array or a tensor; any
        float dtype, converted to float32)."""
        in_dim, out_dim = self.architecture["in_dim"], self.architecture["out_dim"]
        x = np.ascontiguousarray(_numpy(x), dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != in_dim:
            raise ValueError(f"x: expected a 2-D array of (rows, in_dim={in_dim}), got shape {x.shape}")
        csc = [_csc(i, b) for i, b in enumerate(blocks)]
        out = self._native.forward([(s, d, p.tobytes(), ix.tobytes()) for s, d, p, ix in csc], x.tobytes())
        return np.frombuffer(out, dtype=np.float32).reshape(csc[-1][1], out_dim)

    def __repr__(self) -> str:
        a = self.architecture
        return (
            f"NativeModel({a['kind']}, {a['layers']} layers {a['in_dim']} -> {a['hidden_dim']} -> {a['out_dim']}, "
            f"{self.precision}, {self.parameters} parameters)"
        )


def _numpy(a) -> np.ndarray:
    """A NumPy view of ``a`` (a torch tensor on any device, or anything ``np.asarray`` takes)."""
    if hasattr(a, "detach"):  # a torch tensor; torch itself is not needed here
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _ids(a, dtype: str, name: str) -> np.ndarray:
    """``a`` (an array, a tensor, or raw little-endian bytes of ``dtype``) as a 1-D ``dtype``
    array; negative values are refused rather than wrapped."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        return np.frombuffer(a, dtype=dtype)
    arr = _numpy(a).reshape(-1)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integers, got {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name}: negative value {arr.min()}")
    return arr.astype(dtype)


def _csc(i: int, block) -> tuple[int, int, np.ndarray, np.ndarray]:
    """``(num_src, num_dst, indptr <u8, indices <u4)`` of one block: a CSC tuple as the native
    sampler yields, an object with those four fields (``strata.serve.Block``, from the
    service's ``SampleNeighbors``), or an edge-list block (``src``, ``dst``) of
    :mod:`strata.gnn.models`."""
    if not isinstance(block, (tuple, list)) and all(
        hasattr(block, f) for f in ("num_src", "num_dst", "indptr", "indices")
    ):
        block = (block.num_src, block.num_dst, block.indptr, block.indices)
    if isinstance(block, (tuple, list)):
        if len(block) != 4:
            raise ValueError(f"blocks[{i}]: expected (num_src, num_dst, indptr, indices), got {len(block)} items")
        num_src, num_dst, indptr, indices = block
        return (
            int(num_src),
            int(num_dst),
            _ids(indptr, "<u8", f"blocks[{i}].indptr"),
            _ids(indices, "<u4", f"blocks[{i}].indices"),
        )
    if all(hasattr(block, f) for f in ("num_src", "num_dst", "src", "dst")):
        src = _ids(block.src, "<i8", f"blocks[{i}].src")
        dst = _ids(block.dst, "<i8", f"blocks[{i}].dst")
        num_dst = int(block.num_dst)
        if src.shape != dst.shape:
            raise ValueError(f"blocks[{i}]: src and dst differ in length ({src.size} vs {dst.size})")
        if dst.size and dst.max() >= num_dst:
            raise ValueError(f"blocks[{i}]: destination {dst.max()} is out of range (num_dst {num_dst})")
        # Group the edges by destination; a stable sort keeps each destination's sources in
        # the order given (the order the reference sums them in).
        order = np.argsort(dst, kind="stable")
        indptr = np.zeros(num_dst + 1, dtype="<u8")
        indptr[1:] = np.cumsum(np.bincount(dst, minlength=num_dst))
        return int(block.num_src), num_dst, indptr, src[order].astype("<u4")
    raise TypeError(
        f"blocks[{i}]: expected a strata.gnn.models.Block or (num_src, num_dst, indptr, indices), "
        f"got {type(block).__name__}"
    )
