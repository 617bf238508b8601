"""The GNN layer kinds, by name: the one list that ``strata gnn train --model``'s choices, the
torch modules that train them (:func:`strata.gnn.models.register_layer`) and the served-weights
file (:mod:`strata.weights`) share. A served kind has the same name in the graph service's
registry (``strata_serve::model::ModelKind``). Declared without torch, so that the config and
the command line read it at start."""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerKind:
    """A layer kind: one line of help, whether the graph service runs it (a native kernel of
    the same name reads the torch module's state dict), and whether it is built for typed
    graphs (its parameters are per edge type)."""

    help: str
    served: bool = False
    typed: bool = False


#: The layer kinds, by name, in the order ``--help`` lists them.
LAYER_KINDS: dict[str, LayerKind] = {
    "sage": LayerKind("GraphSAGE (mean aggregator)", served=True),
    "sage_pool": LayerKind("GraphSAGE (max-pool)", served=True),
    "gcn": LayerKind("GCN", served=True),
    "gin": LayerKind("GIN", served=True),
    "gat": LayerKind("GAT (heads heads per hidden layer)"),
    "rgcn": LayerKind("R-GCN (a weight per edge type; typed stores)", typed=True),
    "sage_hetero": LayerKind("GraphSAGE per edge type, summed per node type (typed stores)", typed=True),
}

#: Names a served kind had in weights files written before: old name -> its name now (the
#: service's ``RENAMED_KINDS`` holds the same).
RENAMED_KINDS: dict[str, str] = {"sage_mean": "sage"}


def served_kind(name: str) -> str:
    """The served kind ``name`` names: itself, or the name now of a renamed kind (with a
    ``DeprecationWarning`` naming it)."""
    if name in RENAMED_KINDS:
        new = RENAMED_KINDS[name]
        warnings.warn(
            f"layer kind {name!r} is deprecated and loads as {new!r}, its name now; export the model again "
            f"to write {new!r}",
            DeprecationWarning,
            stacklevel=2,
        )
        return new
    return name
