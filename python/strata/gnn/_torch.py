"""PyTorch is an optional extra: the parts of ``strata.gnn`` that train import it through here."""

from __future__ import annotations

from ..errors import MissingDependencyError


def require_torch():
    """Returns the ``torch`` module, or raises a message that says how to install it."""
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError("strata.gnn needs PyTorch for training: pip install torch") from e
    return torch
