"""Strata: graph embeddings, GNN training, analytics and a graph service on graphs larger than
memory, on one machine's storage hierarchy.

The Python package is the front door (CLI, configs, datasets, PyTorch integration); the work is
done by the Rust extension ``strata._native``.
"""

from .errors import (
    BudgetError,
    ConfigError,
    DiskFullError,
    InputError,
    StoreExistsError,
    StoreFormatError,
    StrataError,
)

#: The subpackages ``strata.NAME`` reaches without an import of its own (``strata.embed.train``,
#: as ``torch.nn``), each imported on first use.
_SUBPACKAGES = ("config", "datasets", "embed", "gnn", "grid", "io", "plot", "serve")


def __getattr__(name):
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    # Imported on first use, so that the command line can configure NumPy's threads first.
    if name in ("Store", "open_store"):
        from . import store

        return getattr(store, name)
    # Looked up on first use: importlib.metadata is 80 ms of every command's start.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("strata-gl")
        except PackageNotFoundError:  # running from a source tree without installation
            return "0.1.0"
    raise AttributeError(f"module 'strata' has no attribute {name!r}")


__all__ = [
    "BudgetError",
    "ConfigError",
    "DiskFullError",
    "InputError",
    "Store",
    "StoreExistsError",
    "StoreFormatError",
    "StrataError",
    "__version__",
    "open_store",
]
