"""The served-weights file: what :func:`strata.gnn.export_model` writes and the graph service
(``strata serve``, :class:`strata.serve.native.NativeModel`) reads. It sits beside the engines
because it is the contract between two of them.

The file holds the model's ``state_dict()`` in float32 plus its declared architecture, so that
the server (or :class:`strata.serve.native.NativeModel`) can rebuild and check the model without
Python code:

- **safetensors**: an 8-byte little-endian header length, a JSON header
  ``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
  {"strata.architecture": "<architecture JSON>"}}`` (offsets into the data after the header),
  then the tensors' raw little-endian bytes. Written here, so the ``safetensors`` package is
  not needed; files it writes load too.
- **npz**: ``numpy.savez`` of the tensors, plus the architecture JSON as a uint8 array under
  ``__strata_architecture__``.

The architecture is ``{"kind", "in_dim", "hidden_dim", "out_dim", "layers", "fanouts"}``: ``kind``
a served layer kind of :data:`strata.layer_kinds.LAYER_KINDS` (``sage``, ``sage_pool``, ``gcn``,
``gin``; files written before name ``sage`` by its old name ``sage_mean``, which still loads, with
a deprecation warning), ``fanouts`` from the seeds outwards as in ``strata gnn train --fanouts``.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from .layer_kinds import served_kind

#: Metadata key (safetensors) and array name (npz) of the architecture JSON.
SAFETENSORS_ARCHITECTURE_KEY = "strata.architecture"
NPZ_ARCHITECTURE_KEY = "__strata_architecture__"

FORMATS = ("safetensors", "npz")


def write(path: Path, tensors: dict[str, np.ndarray], architecture: dict, format: str | None = None) -> Path:
    """Writes float32 ``tensors`` (name -> array) and the ``architecture`` dict to ``path`` as
    safetensors or npz (``format``, or from the suffix), atomically and durably: a reader never
    sees a half-written file, a crash leaves the old file or the new one, and a failed write
    leaves the old file and no temporary one. Returns ``path``."""
    path = Path(path)
    fmt = _format(path, format)
    # Named for this process, so that two writers of one path do not share a temporary file.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if fmt == "safetensors":
                _write_safetensors(f, tensors, {SAFETENSORS_ARCHITECTURE_KEY: json.dumps(architecture)})
            else:
                arch_bytes = np.frombuffer(json.dumps(architecture).encode(), dtype=np.uint8)
                np.savez(f, **tensors, **{NPZ_ARCHITECTURE_KEY: arch_bytes})
            f.flush()
            # Durable before it is renamed into place: a crash leaves the old file or the new one.
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_architecture(path: str | os.PathLike, format: str | None = None) -> dict:
    """The architecture a weights file declares (the dict :func:`write` was given, a renamed
    ``kind`` under its name now), read without loading the tensors. Raises ``ValueError`` when
    the file declares none."""
    path = Path(path)
    fmt = _format(path, format)
    if fmt == "safetensors":
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", _read_exactly(f, 8, path))
            header = json.loads(_read_exactly(f, header_len, path))
        text = header.get("__metadata__", {}).get(SAFETENSORS_ARCHITECTURE_KEY)
    else:
        with np.load(path, allow_pickle=False) as npz:
            text = bytes(npz[NPZ_ARCHITECTURE_KEY]).decode() if NPZ_ARCHITECTURE_KEY in npz.files else None
    if text is None:
        raise ValueError(f"{path}: the file declares no architecture (was it written by export_model?)")
    architecture = json.loads(text)
    if isinstance(architecture, dict) and "kind" in architecture:
        architecture["kind"] = served_kind(str(architecture["kind"]))
    return architecture


def _format(path: Path, format: str | None) -> str:
    """The file format: ``format`` when given, else from ``path``'s suffix."""
    if format is not None:
        if format.lower() not in FORMATS:
            raise ValueError(f"format: expected safetensors or npz, got {format!r}")
        return format.lower()
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"{path}: cannot tell the format from the suffix; name it *.safetensors or *.npz")
    return suffix


def _write_safetensors(f, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Writes float32 ``tensors`` and string ``metadata`` to the binary file ``f`` as
    safetensors."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    # Pad with spaces (valid JSON whitespace) so the data starts 8-byte aligned, as the
    # reference implementation does: readers may then map the tensors in place.
    text += b" " * (-len(text) % 8)
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for a in tensors.values():
        f.write(a.astype("<f4", copy=False).tobytes())


def _read_exactly(f, n: int, path: Path) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError(f"{path}: truncated safetensors file (wanted {n} bytes, got {len(data)})")
    return data
