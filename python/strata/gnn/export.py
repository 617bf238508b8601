"""Exporting a trained :class:`strata.gnn.models.GNN` for the graph service, in the served-weights
file format of :mod:`strata.weights`."""

from __future__ import annotations

import os
from pathlib import Path

from .. import weights


def export_model(model, path: str | os.PathLike, *, fanouts: list[int], format: str | None = None) -> Path:
    """Writes ``model`` (a :class:`strata.gnn.models.GNN` of a served layer kind:
    :data:`strata.layer_kinds.LAYER_KINDS`' ``served``, the same name in the service) to
    ``path`` for serving: its ``state_dict()`` as float32 and its architecture with the
    sampling ``fanouts`` (one per layer, seeds outwards, each >= 1 or -1 for all neighbours).
    ``format`` is ``safetensors`` or ``npz``, or None to take it from the suffix. Returns the
    path written. GAT is refused (the service has no attention kernel)."""
    from .models import GNN, LAYERS  # imports torch, with a clear message when it is missing

    if not isinstance(model, GNN):
        raise TypeError(f"export_model: expected a strata.gnn.models.GNN, got {type(model).__name__}")
    served = [name for name, kind in LAYERS.items() if kind.served]
    if model.kind not in served:
        raise ValueError(
            f"export_model: a {model.kind!r} model cannot be served; the service runs "
            f"{', '.join(served)} (the others have no native kernel)"
        )
    layers = len(model.convs)
    fanouts = [int(f) for f in fanouts]
    if len(fanouts) != layers or any(f != -1 and f < 1 for f in fanouts):
        raise ValueError(f"fanouts: need {layers} values (one per layer), each >= 1 or -1; got {fanouts}")
    architecture = {
        "kind": model.kind,
        "in_dim": int(model.in_dim),
        "hidden_dim": int(model.hidden),
        "out_dim": int(model.out_dim),
        "layers": layers,
        "fanouts": fanouts,
    }
    tensors = {name: t.detach().to("cpu").float().contiguous().numpy() for name, t in model.state_dict().items()}
    return weights.write(Path(path), tensors, architecture, format)
