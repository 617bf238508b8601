"""``strata gnn train``."""

from __future__ import annotations

from .. import torchrun
from ..config import GnnTrainConfig, from_args
from .common import add_section_command, emit_summary, run_with_progress
from .parser import SectionParser


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Mini-batch GNN training whose node features stay on disk: a hot set and a window-pinned "
        "cache in RAM, merged direct reads, a pipelined loader.",
    )
    cmds = p.add_subparsers(parser_class=SectionParser, dest="gnn_command", metavar="COMMAND", required=True)
    add_section_command(
        cmds,
        "train",
        GnnTrainConfig,
        run_train,
        help="train a node classifier (sage, gcn, gat, gin; rgcn, sage_hetero on typed stores) within --memory",
        description="Trains a GNN on STORE's labelled nodes. Prints the budget plan, a progress bar per epoch "
        "(batches/s, sampled nodes/s, MB/s, hit rates), validation accuracy per epoch, and the test accuracy of the "
        "best epoch. Under torchrun it trains with DistributedDataParallel, each rank on its share of the seeds "
        "within its own --memory. Needs PyTorch (pip install torch).",
    )


def run_train(args) -> int:
    from ..gnn.train import format_summary, train

    cfg = from_args(GnnTrainConfig, args)
    record = run_with_progress(args, lambda bar: train(cfg, bar))
    if not torchrun.follower():
        emit_summary(args, record, format_summary(record))
    return 0
