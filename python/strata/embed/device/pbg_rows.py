"""PyTorch-BigGraph's score functions on a torch device (``model = "pbg"``, the Rust
``model::pbg``): a relation operator applied to the source row, ``a = op(s, r)``, then a
comparator between ``a`` and each target.

An operator that is a named model's query rows computes as that model (its *query model*:
``none`` is Dot's, ``translation`` TransE's ``s + r``, ``diagonal`` DistMult's,
``complex_diagonal`` ComplEx's); ``linear`` (``a = M s``, ``M`` a relation row of ``dim x dim``
reals, row-major) and ``affine`` (``a = M s + v``, ``v`` the row's last ``dim`` reals) are here,
with their gradients and ``linear``'s reversed row ``M^T`` (PBG's head corruption without
reciprocal relations). The comparators are :func:`step.pbg_scores`'; ``cos`` scales rows to
unit length here (:func:`unit`).

Shapes: ``s``, ``a``, ``da`` ``... x dim``; ``r`` ``... x rel_dim``.
"""

from __future__ import annotations

import math

import torch

#: The query model of each operator: the named model whose query rows it computes, or its own.
QUERY = {
    "none": "dot",
    "translation": "transe",
    "diagonal": "distmult",
    "complex_diagonal": "complex",
    "linear": "linear",
    "affine": "affine",
}
#: Below this length a row is not scaled up to unit length by ``cos`` (as the Rust model).
MIN_NORM = 1e-12


def rel_dim(query: str, dim: int) -> int:
    """Reals per relation row of ``linear`` (``M``) and ``affine`` (``M``, then ``v``)."""
    return dim * dim + (dim if query == "affine" else 0)


def _matrices(r: torch.Tensor, dim: int) -> torch.Tensor:
    """The ``dim x dim`` matrices ``M`` of relation rows ``r`` (``... x dim x dim``, a view)."""
    return r[..., : dim * dim].unflatten(-1, (dim, dim))


def combine(query: str, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``a = M s`` (``linear``) or ``M s + v`` (``affine``)."""
    d = s.shape[-1]
    a = (_matrices(r, d) @ s[..., None]).squeeze(-1)
    return a + r[..., d * d :] if query == "affine" else a


def combine_grads(query: str, s: torch.Tensor, r: torch.Tensor, da: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``s`` and ``r`` of :func:`combine` given ``da``: ``M^T da``, and ``da
    s^T`` (``affine``: then ``da`` for ``v``)."""
    d = s.shape[-1]
    ds = (_matrices(r, d).mT @ da[..., None]).squeeze(-1)
    dm = (da[..., :, None] * s[..., None, :]).flatten(-2)
    return ds, torch.cat([dm, da], -1) if query == "affine" else dm


def transpose(r: torch.Tensor) -> torch.Tensor:
    """``linear``'s reversed rows ``M^T``, which score ``(t, r', h)`` as ``M`` scores tails with
    comparator ``dot`` (``Pbg::reverse_relation``); their own inverse and transpose."""
    d = math.isqrt(r.shape[-1])
    return _matrices(r, d).mT.flatten(-2)


def unit(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` scaled to unit length (``cos``'s), a length below :data:`MIN_NORM` taken as
    it."""
    return x / (x * x).sum(-1, keepdim=True).sqrt().clamp(min=MIN_NORM)
