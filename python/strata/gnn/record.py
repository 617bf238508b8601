"""What marks a directory as a GNN run: the ``run.json`` that ``strata gnn train`` writes."""

from __future__ import annotations


def is_gnn_record(meta) -> bool:
    """Whether a parsed ``run.json`` is the record ``strata gnn train`` writes."""
    if not isinstance(meta, dict):
        return False
    config = meta.get("config")
    return isinstance(config, dict) and "fanouts" in config and isinstance(meta.get("history"), list)
