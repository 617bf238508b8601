"""HDF5 files of PyTorch-BigGraph checkpoints, through h5py (the ``hdf5`` extra), for
``strata embed export --format pbg`` and ``strata embed import-pbg``.

The engine (strata-embed's ``run/pbg.rs``) decides what goes in which file; this module only moves
float32 datasets in and out, in PBG's conventions: a root attribute ``format_version`` (1), and
for model parameters a ``state_dict_key`` attribute with the PyTorch name of the tensor.
Reads are slices of a dataset (``rows``), so an entity partition is never read whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .. import _native
from ..errors import ConfigError, InputError

#: PBG's ``FORMAT_VERSION`` of its HDF5 files.
FORMAT_VERSION = 1


def _h5py():
    """Imports h5py lazily: only PyTorch-BigGraph checkpoints need it, and it is an optional extra."""
    try:
        import h5py
    except ImportError as e:
        raise ConfigError(
            "PyTorch-BigGraph checkpoints are HDF5 files read and written with h5py, which is not installed; "
            "pip install h5py"
        ) from e
    return h5py


class Hdf5:
    """The engine's HDF5 files: ``write``, ``info``, ``datasets`` and ``rows`` (see
    ``strata_embed::Hdf5``); datasets travel as ``(name, shape, float32 bytes, state_dict_key)``."""

    def __init__(self):
        self._h5py = _h5py()
        self._open: tuple[str, object] | None = None

    def _file(self, path):
        """``path`` opened for reading (the last one stays open: rows are read in many slices)."""
        path = str(path)
        if self._open is not None and self._open[0] == path:
            return self._open[1]
        self.close()
        if not os.path.exists(path):
            raise InputError(f"{path}: missing (a PyTorch-BigGraph checkpoint file)")
        try:
            f = self._h5py.File(path, "r")
        except OSError as e:
            raise InputError(f"{path}: not an HDF5 file ({e})") from None
        self._open = (path, f)
        return f

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def write(self, path, datasets) -> None:
        self.close()
        with self._h5py.File(str(path), "w", track_order=True) as f:
            f.attrs["format_version"] = FORMAT_VERSION
            for name, shape, data, key in datasets:
                values = np.frombuffer(data, dtype="<f4").reshape([int(s) for s in shape])
                ds = f.create_dataset(name, data=values)
                if key is not None:
                    ds.attrs["state_dict_key"] = key
            f.flush()
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())

    def info(self, path, dataset: str):
        f = self._file(path)
        version = f.attrs.get("format_version")
        node = f.get(dataset)
        shape = list(node.shape) if isinstance(node, self._h5py.Dataset) else None
        return (None if version is None else int(version)), shape

    def datasets(self, path, group: str) -> list:
        f = self._file(path)
        if group not in f:
            return []
        out = []

        def visit(name, node):
            if isinstance(node, self._h5py.Dataset):
                key = node.attrs.get("state_dict_key")
                values = np.ascontiguousarray(node[...], dtype="<f4")
                out.append((name, list(node.shape), values.tobytes(), None if key is None else str(key)))

        f[group].visititems(visit)
        return out

    def rows(self, path, dataset: str, lo: int, hi: int) -> bytes:
        ds = self._file(path)[dataset]
        return np.ascontiguousarray(ds[lo:hi], dtype="<f4").tobytes()


def import_pbg(options: dict, progress=None) -> dict:
    """Imports a PyTorch-BigGraph checkpoint as a run (``options``: the ``[embed.import_pbg]``
    section's values)."""
    h5 = Hdf5()
    try:
        return _native.embed_import_pbg(options, h5, progress)
    finally:
        h5.close()


def export_pbg(run: Path, options: dict, progress=None) -> dict:
    """Writes a run's checkpoint as a PyTorch-BigGraph checkpoint directory (``options``: the
    ``[embed.export]`` section's values)."""
    h5 = Hdf5()
    try:
        return _native.embed_export_pbg(str(run), options, h5, progress)
    finally:
        h5.close()
