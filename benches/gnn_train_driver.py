"""One G4 run (`bench_gnn.py --only g4`): GraphSAGE trained for one epoch on batches from Strata's
loader, in its own process so that a memlimit caps it alone (torch included); prints one JSON
object on stdout.

    python benches/gnn_train_driver.py STORE --memory 1200M [--seeds 102400] [--hidden 128]

The epoch is over the first ``--seeds`` of a permutation of the store's train split (drawn with
``--seed``), trained exactly as ``strata gnn train`` trains an epoch (`strata.gnn.train.train_epoch`):
GraphSAGE (mean), Adam, cross-entropy, on the CPU. Reported: the epoch's seconds, the seconds the
model waited for the next batch (and their share), the model's own seconds, the loader's
statistics and the budget plan.

Under torchrun (G5) every rank opens the store within its own ``--memory`` and trains the model
in DistributedDataParallel on its share of the same seeds (`strata.gnn.dist`); rank 0 prints
the group's record, with each rank's figures under ``ranks``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
import torch

from strata import torchrun
from strata.gnn import GnnData
from strata.gnn.dist import Ranks
from strata.gnn.models import GNN
from strata.gnn.step import TrainStep
from strata.gnn.train import train_epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--memory", required=True, help="the loader's memory budget")
    ap.add_argument("--seeds", type=int, default=102_400, help="train seeds in the epoch")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="15,10")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    ap.add_argument("--sampler-threads", type=int, default=0, help="0: the loader's default")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    env = torchrun.environment()
    ranks = None if env is None else Ranks(env, torch.device("cpu"), 600)
    threads = {"sampler_threads": args.sampler_threads} if args.sampler_threads else {}
    t0 = time.monotonic()
    data = GnnData(
        args.store,
        fanouts=[int(f) for f in args.fanouts.split(",")],
        batch_size=args.batch_size,
        memory=args.memory,
        window=args.window,
        seed=args.seed,
        **threads,
    )
    setup = time.monotonic() - t0
    train = np.asarray(data.nodes("train"), dtype=np.int64)
    seeds = np.random.default_rng(args.seed).permutation(train)[: args.seeds]
    model = GNN("sage", data.dim, args.hidden, data.num_classes, 2, 0.5, 1)
    net = model if ranks is None else ranks.wrap(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    rec = train_epoch(TrainStep(net, opt, "cpu", "eager"), data, seeds, 0, torch.device("cpu"), ranks=ranks)
    rec |= {
        "setup_seconds": setup,
        "model_seconds": rec["seconds"] - rec["data_wait_seconds"],
        "seeds": len(seeds),
        "plan": data.plan,
        "plan_lines": data.plan_lines(),
        "hidden": args.hidden,
        "torch_threads": torch.get_num_threads(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "world_size": 1 if ranks is None else ranks.world_size,
    }
    if ranks is not None:
        ranks.close()
        if ranks.rank != 0:
            return
    json.dump(rec, sys.stdout)


if __name__ == "__main__":
    main()
