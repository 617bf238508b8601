"""Data-parallel training of a stock PyG GraphSAGE over Strata's loaders, one process per rank.

    torchrun --nproc-per-node 2 examples/ddp_pyg.py STORE [--epochs 5] [--memory 1G]
        [--features replicated|split]

Each rank opens the store itself (its loader plans within its own ``--memory``) and gets its
share of every epoch's training nodes: ``NodeLoader`` reads the rank and world size from
torch.distributed once the process group is up, draws the same permutation on every rank and
pads the shares so that every rank runs the same number of batches. DistributedDataParallel
averages the gradients; validation accuracy is summed over the ranks' shares of the split.
Rank 0 prints one line per epoch and, with ``--out``, writes them as JSON. With ``--features
split`` each rank's loaders hold only the feature rows it owns and fetch the others from their
owners over torch RPC (every rank opens its loaders in the same order).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GraphSAGE

from strata.gnn import NodeLoader, features


def edge_index(batch):
    """The batch's sampled edges as one ``(2, E)`` edge_index over its nodes (seeds first), as
    PyG layers take it: the layers' blocks share local ids, so their edges are merged."""
    return torch.cat([torch.stack([blk.src, blk.dst]) for blk in batch.blocks], dim=1).unique(dim=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--memory", default="1G", help="each rank's loader budget")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", help="rank 0 writes the epochs' figures here as JSON")
    p.add_argument("--features", choices=["replicated", "split"], default="replicated", help="feature rows per rank")
    args = p.parse_args()

    # gloo on CPU; with one GPU per rank, "nccl" and device=f"cuda:{LOCAL_RANK}" instead.
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    opened = {"fanouts": [10, 5], "batch_size": args.batch_size, "memory": args.memory, "features": args.features}
    train = NodeLoader(args.store, **opened)
    # Evaluation: each rank scores its exact share of the split (no padding, no shuffling).
    valid = NodeLoader(args.store, **opened, nodes="valid", shuffle=False, pad=False)
    data = train.data
    model = GraphSAGE(data.dim, 64, num_layers=2, out_channels=data.num_classes)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    epochs = []
    for epoch in range(args.epochs):
        ddp.train()
        batches = 0
        for b in train:
            opt.zero_grad()
            loss = F.cross_entropy(ddp(b.x, edge_index(b))[: b.num_seeds], b.y)
            loss.backward()
            opt.step()
            batches += 1
        model.eval()
        counts = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for b in valid:
                pred = model(b.x, edge_index(b))[: b.num_seeds].argmax(1)
                counts += torch.tensor([(pred == b.y).sum().item(), b.num_seeds], dtype=torch.float64)
        dist.all_reduce(counts)
        everyone = [None] * world
        dist.all_gather_object(everyone, batches)
        epochs.append({"epoch": epoch + 1, "batches": everyone, "valid_accuracy": counts[0].item() / counts[1].item()})
        if rank == 0:
            print(f"epoch {epoch + 1}: batches per rank {everyone}, valid accuracy {epochs[-1]['valid_accuracy']:.4f}")
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": world, "features": args.features, "epochs": epochs}, f)
    # Every rank done before any tears down; then the RPC group of split features (waiting for
    # every rank) and the process group.
    dist.barrier()
    features.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
