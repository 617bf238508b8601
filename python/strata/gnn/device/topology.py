"""A store's in-neighbour CSC where device kernels read it: in device memory when the device
budget holds it, otherwise in page-locked host memory read over UVA (``uva``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...errors import StoreFormatError
from ...store import Store
from . import uva

#: Node ids are u32 in a store; a tensor keeps them in int32 bit patterns.
LOW32 = 0xFFFF_FFFF


@dataclass
class DeviceTopology:
    """``indptr`` (int64, ``num_nodes + 1``), ``indices`` (int32 bit patterns of u32 source
    ids) and ``weights`` (float32 parallel to ``indices``, or None) of the store's CSC (a node's
    in-edges, as the Rust sampler reads them); ``placement`` is ``"device"`` or ``"host"``
    (page-locked, read over UVA on CUDA)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    weights: torch.Tensor | None
    device: torch.device
    placement: str

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def nbytes(self) -> int:
        parts = [self.indptr, self.indices] + ([self.weights] if self.weights is not None else [])
        return sum(t.numel() * t.element_size() for t in parts)

    @classmethod
    def open(cls, store: Store, device, *, weighted: bool = False, budget: int | None = None) -> DeviceTopology:
        """The CSC of ``store`` for kernels on ``device``: copied once (never per batch) into
        device memory when it fits ``budget`` bytes (None: always), else into page-locked host
        memory. Checked as the Rust engine checks it: bad arrays raise StoreFormatError naming
        the store and what was expected."""
        device = torch.device(device)
        indptr, indices = store.csc()
        weights = None
        if weighted:
            weights = store.topology_columns("csc").get("weights")
            if weights is None:
                raise ValueError(f"weighted: {store.path} has no edge weights (convert with --columns src,dst,weight)")
        _check(store, indptr, indices, weights)
        arrays = [
            np.asarray(indptr).view(np.int64),
            np.asarray(indices).view(np.int32),
            None if weights is None else np.asarray(weights, dtype=np.float32),
        ]
        nbytes = sum(a.nbytes for a in arrays if a is not None)
        on_device = device.type == "cpu" or budget is None or nbytes <= budget
        place = (
            (lambda a: torch.from_numpy(a.copy()).to(device)) if on_device else (lambda a: uva.pinned(a.copy(), device))
        )
        ip, ix, w = (None if a is None else place(a) for a in arrays)
        return cls(ip, ix, w, device, "device" if on_device else "host")

    def starts_and_degrees(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """First CSC position and in-degree of each of ``nodes`` (int64 on the device)."""
        start = uva.gather(self.indptr, nodes)
        return start, uva.gather(self.indptr, nodes + 1) - start

    def sources(self, positions: torch.Tensor) -> torch.Tensor:
        """Source node (int64) of the CSC entries at ``positions``."""
        return uva.gather(self.indices, positions).to(torch.int64) & LOW32

    def edge_weights(self, positions: torch.Tensor) -> torch.Tensor:
        return uva.gather(self.weights, positions)


def _check(store: Store, indptr, indices, weights) -> None:
    n = store.num_nodes
    bad = lambda m: StoreFormatError(f"store {store.path}: csc: {m}")  # noqa: E731
    if indptr.shape != (n + 1,) or indptr[0] != 0:
        raise bad(f"indptr must hold {n + 1} offsets starting at 0, got shape {indptr.shape}")
    if int(indptr[-1]) != indices.shape[0]:
        raise bad(f"indptr ends at {int(indptr[-1])} but there are {indices.shape[0]} indices")
    if n and (np.diff(np.asarray(indptr, dtype=np.uint64).view(np.int64)) < 0).any():
        raise bad("indptr decreases")
    if indices.size and int(indices.max()) >= n:
        raise bad(f"neighbour {int(indices.max())} is out of range ({n} nodes)")
    if weights is not None and weights.shape != indices.shape:
        raise bad(f"{weights.shape[0]} weights for {indices.shape[0]} edges")
