"""``strata gnn train`` under torchrun: data-parallel training (DistributedDataParallel) over
Strata's loaders, one loader per rank (docs/distributed.md, "GNN training").

Every rank holds the whole model and opens the store itself, planning within its own memory
budget; an epoch's seeds are split across the ranks by :func:`strata.gnn.loader.shard`, padded
so that every rank runs the same number of batches (DDP all-reduces the gradients of each batch,
and a rank with a batch fewer would leave the others waiting). Rank 0 keeps the run directory.
"""

from __future__ import annotations

import numpy as np

from .. import torchrun
from . import features
from .loader import shard


class Ranks:
    """This process's part in a distributed training run: the rank, the process group joined
    through torchrun's rendezvous (gloo, or NCCL when training on CUDA) and the collectives
    the trainer needs, each bounded by ``timeout`` seconds."""

    def __init__(self, env: torchrun.Environment, device, timeout: int):
        self.torch, self.td = torchrun.torch_distributed()
        self.rank, self.world_size = env.rank, env.world_size
        self.device = device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.address, self.timeout = env.address, timeout
        if device.type == "cuda":
            # NCCL's object collectives stage through the current device.
            self.torch.cuda.set_device(device)
        #: The rendezvous store (RPC for split features meets through it).
        self.store = torchrun.join(env, timeout, self.backend)

    def __repr__(self) -> str:
        return f"Ranks(rank {self.rank} of {self.world_size}, {self.backend}, store {self.address})"

    def wrap(self, model):
        """``model`` (already on the device) in DistributedDataParallel; its parameters are
        rank 0's from here on."""
        ddp = self.torch.nn.parallel.DistributedDataParallel
        if self.device.type == "cuda":
            return ddp(model, device_ids=[self.device.index])
        return ddp(model)

    def share(self, nodes, epoch: int, seed: int, *, shuffle: bool = True, pad: bool = True):
        """This rank's seeds of an epoch over ``nodes`` (see :func:`~strata.gnn.loader.shard`)."""
        return shard(nodes, self.rank, self.world_size, epoch=epoch, seed=seed, shuffle=shuffle, pad=pad)

    def _collective(self, what: str, call):
        return torchrun.collective(what, call, self.rank, self.timeout, self.address)

    def sum(self, values: list[float], what: str) -> list[float]:
        """``values`` summed over the ranks (float64), in order."""
        t = self.torch.tensor(np.asarray(values, dtype=np.float64), device=self.device)
        self._collective(f"summing {what}", lambda: self.td.all_reduce(t))
        return t.cpu().tolist()

    def gather(self, mine, what: str) -> list:
        """Every rank's ``mine`` (a picklable object), in rank order, on every rank."""
        out = [None] * self.world_size
        self._collective(f"gathering {what}", lambda: self.td.all_gather_object(out, mine))
        return out

    def from_rank0(self, value, what: str):
        """Rank 0's ``value`` (a picklable object) on every rank; the others pass None."""
        box = [value]
        self._collective(f"receiving {what} from rank 0", lambda: self.td.broadcast_object_list(box, src=0))
        return box[0]

    def start_rpc(self) -> None:
        """Joins the RPC group that split features fetch remote rows through."""
        features.start_rpc(self.rank, self.world_size, self.store, self.timeout)

    def close(self, completed: bool) -> None:
        """Leaves the RPC group, if joined, and the process group. After a ``completed`` run
        the ranks first meet at a barrier, so that none tears its group down while another
        still writes the run's files or finishes its last collective."""
        if completed:
            self._collective("the barrier at the end of the run", self.td.barrier)
        features.shutdown()
        torchrun.leave()
