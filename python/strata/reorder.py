"""Locality-aware node orders (``strata reorder``): renumbers the nodes of a finished store so that
nodes sampled together get nearby ids, and therefore share feature pages, and writes the
renumbered store with every node-indexed array permuted consistently.

The orders and the writer are Rust's (``strata_graph::order``, ``strata_graph::reorder``; see
docs/convert.md): the store is written through the store builder, within the ``[reorder]``
section's memory budget, and appears only when complete. The new store keeps the input's ids
visible: ``original_id`` (int, ``(N,)``) is the input id of each new node, and
``Store.node_name`` reports it."""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import _native
from .config import ReorderConfig, as_dict
from .errors import StoreExistsError

#: The orders, as the ``[reorder]`` section declares them.
ORDERS: tuple[str, ...] = typing.get_args(typing.get_args(typing.get_type_hints(ReorderConfig)["order"])[0])


def reorder(cfg: ReorderConfig, progress: Callable[..., bool] | None = None) -> dict:
    """Writes ``cfg.store`` renumbered by ``cfg.order`` to ``cfg.out``; returns the summary
    (order, nodes, seconds, the memory plan, and the order's mean edge span before and after: the
    mean ``|id(u) - id(v)|`` over the undirected adjacency's entries). ``progress`` gets the memory
    plan as messages, then the stages (the callback of :class:`strata.progress.ProgressBar`)."""
    if cfg.out.exists() and not cfg.overwrite and cfg.out.resolve() != cfg.store.resolve():
        raise StoreExistsError(f"{cfg.out} exists (pass --overwrite to replace it)")
    return _native.reorder_store(as_dict(cfg), progress)


def reorder_store(
    src: str | Path, out: str | Path, order: str, overwrite: bool = False, memory: int | str | None = None
) -> dict:
    """:func:`reorder` of the store at ``src`` into ``out`` by ``order`` (one of :data:`ORDERS`),
    within ``memory`` bytes (default: the section's)."""
    budget = {} if memory is None else {"memory": memory}
    return reorder(ReorderConfig(store=src, out=out, order=order, overwrite=overwrite, **budget))


def compute_order(indptr: np.ndarray, indices: np.ndarray, order: str) -> np.ndarray:
    """The new order of the nodes of the adjacency ``(indptr (N+1,), indices (T,))`` (undirected
    for every order but ``glist``, which reads in-neighbour lists): ``result[new] = old`` (int64,
    ``(N,)``, a permutation of ``0..N-1``)."""
    raw = _native.node_order(
        np.ascontiguousarray(indptr, dtype="<u8").tobytes(), np.ascontiguousarray(indices, dtype="<u4").tobytes(), order
    )
    return np.frombuffer(raw, dtype="<u4").astype(np.int64)
