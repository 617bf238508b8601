"""Strata's near-data graph learning service (GLIST): ``strata serve`` runs it next to the data,
:class:`Client` talks to it; it serves weights written by :func:`strata.gnn.export_model`."""

from ..weights import load_architecture
from .client import AnalysisResult, Block, Client, MutateResult, Mutations, Neighbourhood, ServiceError
from .native import NativeModel
from .server import serve

__all__ = [
    "AnalysisResult",
    "Block",
    "Client",
    "MutateResult",
    "Mutations",
    "NativeModel",
    "Neighbourhood",
    "ServiceError",
    "load_architecture",
    "serve",
]
