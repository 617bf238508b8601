"""GNN training on graphs whose features do not fit in memory (GIDS + Helios).

``NodeLoader`` yields mini-batches (message-flow blocks and feature tensors) from a store whose
features stay on disk (``LinkLoader`` the same for link prediction, with positive and negative
edges to score), served through a hot set, a window-pinned cache and merged direct reads;
``strata.gnn.models`` has reference GraphSAGE, GCN and GAT in plain PyTorch; ``train`` runs
``strata gnn train``; ``strata.gnn.sampling`` is the sampler on its own, with weighted, temporal
and per-edge-type sampling of typed stores. PyTorch is needed for the tensors (``pip install torch``).
"""

from .export import export_model
from .loader import Batch, EpochLoader, GnnData, LinkLoader, NodeLoader

__all__ = ["Batch", "EpochLoader", "GnnData", "LinkLoader", "NodeLoader", "export_model"]
