"""Strata's near-data graph learning service (GLIST): ``strata serve`` runs it next to the data,
:class:`Client` talks to it, :func:`export_model` writes the weights it serves."""

from .client import AnalysisResult, Block, Client, MutateResult, Mutations, Neighbourhood, ServiceError
from .export import export_model, load_architecture
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
    "export_model",
    "load_architecture",
    "serve",
]
