"""The [embed.*] sections."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from .schema import Size, option, section

ORDERING_HELP = (
    "partition order: legend (Legend's Alg. 1+2, built for prefetching; buffer 3), beta (Marius's BETA; any "
    "buffer >= 2), sequential (one pair at a time; buffer 2)"
)


@section("embed.plan")
class EmbedPlanConfig:
    partitions: int = option(help="number of node partitions n", max=(1 << 32) - 1)
    buffer: int = option(3, help="partitions resident at once (legend needs 3; sequential needs 2)")
    ordering: Literal["legend", "beta", "sequential"] = option("legend", help=ORDERING_HELP)
    show_buckets: bool = option(False, help="list the buckets trained in each state")
    json: bool = option(False, help="print the whole schedule as JSON")

    def check(self) -> None:
        if self.partitions < 1:
            raise ConfigError(f"embed.plan.partitions: need at least 1, got {self.partitions}")


@section("embed.train")
class EmbedTrainConfig:
    store: Path = option(positional=True, help="store to train on (from strata convert or generate)")
    run_dir: Path | None = option(None, help="run directory (default: STORE/runs/embed); an existing run resumes")
    fresh: bool = option(False, help="start over even if the run directory holds a run")
    model: Literal["dot", "transe", "distmult", "complex", "rotate"] = option(
        "complex", help="score function: dot (graphs without relation types), transe, distmult, complex, rotate"
    )
    dim: int = option(100, help="reals per node embedding (complex and rotate use half as complex coordinates)")
    transe_norm: int = option(2, help="norm of transe: 1 or 2")
    loss: Literal["softmax", "logistic", "margin"] = option(
        "softmax", help="softmax: cross-entropy of the true edge among its negatives; logistic; margin ranking"
    )
    margin: float = option(0.1, help="margin of the margin-ranking loss")
    lr: float = option(0.1, help="learning rate")
    optimizer: Literal["adagrad", "adagrad_row"] = option(
        "adagrad", help="Adagrad with one accumulator per element, or per row (half the optimizer state)"
    )
    init_scale: float = option(1e-3, help="standard deviation of the initial node embeddings")
    epochs: int = option(10, help="epochs to train (a resumed run trains up to this many in total)")
    chunk_size: int = option(1000, help="positive edges per chunk; a chunk shares one set of negatives")
    negatives: int = option(1000, help="negatives per chunk and corrupted side")
    degree_fraction: float = option(
        0.0, help="fraction of negatives drawn in proportion to degree; the rest are uniform (see negative_pool)"
    )
    negative_pool: Literal["all", "resident", "partition"] = option(
        "all",
        help="uniform negatives over all nodes (partitions on disk through in-memory banks of bank_rows rows), over "
        "the resident partitions (Marius, Legend), or over the corrupted side's partition (PyTorch-BigGraph)",
    )
    bank_rows: int = option(4096, help="rows of each partition kept in memory as negatives while it is on disk")
    corrupt: Literal["both", "tail", "head"] = option("both", help="which side of each edge is corrupted")
    reciprocal: bool = option(
        True, help="relations get inverse rows used when heads are corrupted (reciprocal relations)"
    )
    partitions: int = option(0, help="node partitions; 0 plans the fewest that fit --memory", max=(1 << 32) - 1)
    buffer: int = option(3, help="partitions resident at once when the table is partitioned")
    ordering: Literal["legend", "beta", "sequential"] = option("legend", help=ORDERING_HELP)
    threads: int = option(0, help="worker threads over a bucket's chunks; 0 means one per core")
    seed: int = option(0, help="seed of initialisation, partitioning, shuffling and negatives")
    memory: Size = option(1 << 30, help="memory budget (buffer, edges, workers, evaluation, relations, runtime)")
    eval_every: int = option(1, help="validate every this many epochs (0: no evaluation at all)")
    eval_protocol: Literal["filtered", "sampled"] = option(
        "filtered",
        help="filtered: rank against every node (FB15k-237, WN18RR); sampled: against N uniform + N "
        "degree-weighted candidates (large graphs)",
    )
    eval_negatives: int = option(1000, help="N of the sampled protocol")
    eval_max_queries: int = option(0, help="evaluate at most this many queries per split (0: all)")
    tensorboard: bool = option(
        True, help="also write TensorBoard event files into the run when tensorboard is installed"
    )

    def check(self) -> None:
        for name in ("dim", "epochs", "chunk_size", "negatives", "buffer", "eval_negatives"):
            if getattr(self, name) < 1:
                raise ConfigError(f"embed.train.{name}: need at least 1, got {getattr(self, name)}")
        if self.model in ("complex", "rotate") and self.dim % 2:
            raise ConfigError(
                f"embed.train.dim: {self.model} needs an even dim (real and imaginary halves), got {self.dim}"
            )
        if self.transe_norm not in (1, 2):
            raise ConfigError(f"embed.train.transe_norm: must be 1 or 2, got {self.transe_norm}")
        if not 0.0 <= self.degree_fraction <= 1.0:
            raise ConfigError(f"embed.train.degree_fraction: must be between 0 and 1, got {self.degree_fraction}")
        for name in ("lr", "init_scale"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"embed.train.{name}: must be positive, got {getattr(self, name)}")
        if self.ordering == "legend" and self.buffer != 3 and self.partitions > self.buffer:
            raise ConfigError(f"embed.train.buffer: ordering legend needs a buffer of 3, got {self.buffer}")
        if self.ordering == "sequential" and self.buffer != 2:
            raise ConfigError(f"embed.train.buffer: ordering sequential needs a buffer of 2, got {self.buffer}")


CHECKPOINT_HELP = "checkpoint to use: best (by validation MRR) or last"
TARGET_HELP = "a run directory, or a store (its default run STORE/runs/embed)"


@section("embed.eval")
class EmbedEvalConfig:
    target: Path = option(positional=True, help=TARGET_HELP)
    split: Literal["valid", "test", "train"] = option("test", help="edges to rank")
    checkpoint: Literal["best", "last"] = option("best", help=CHECKPOINT_HELP)
    protocol: Literal["run", "filtered", "sampled"] = option("run", help="evaluation protocol (run: the run's own)")
    max_queries: int = option(0, help="at most this many queries (0: the run's setting)")
    memory: Size | None = option(None, help="memory budget (default: the run's)")
    threads: int = option(0, help="threads (0: the run's setting)")
    json: bool = option(False, help="print the metrics as JSON")


@section("embed.predict")
class EmbedPredictConfig:
    target: Path = option(positional=True, help=TARGET_HELP)
    head: str | None = option(None, help="predict tails of (HEAD, RELATION, ?): a node name, or id without names")
    tail: str | None = option(None, help="predict heads of (?, RELATION, TAIL)")
    relation: str | None = option(None, help="relation name (or id); may be left out when the graph has one type")
    top: int = option(10, help="answers to print")
    exclude_known: bool = option(False, help="leave out answers already in the graph (any split)")
    checkpoint: Literal["best", "last"] = option("best", help=CHECKPOINT_HELP)
    memory: Size | None = option(None, help="memory budget (default: the run's)")
    json: bool = option(False, help="print the answers as JSON")

    def check(self) -> None:
        if (self.head is None) == (self.tail is None):
            raise ConfigError("embed.predict: give exactly one of --head and --tail")
        if self.top < 1:
            raise ConfigError(f"embed.predict.top: need at least 1, got {self.top}")


@section("embed.export")
class EmbedExportConfig:
    target: Path = option(positional=True, help=TARGET_HELP)
    out: Path = option(help="directory to write (embeddings, relations, id maps, export.json)", short="o")
    format: Literal["npy", "tsv"] = option(
        "npy", help="npy: float32 arrays in id order plus name files; tsv: name<TAB>values"
    )
    checkpoint: Literal["best", "last"] = option("best", help=CHECKPOINT_HELP)
    overwrite: bool = option(False, help="replace OUT if it exists")
    memory: Size | None = option(None, help="memory budget (default: the run's)")


@section("plot")
class PlotConfig:
    target: Path = option(
        positional=True, help="run directory (or a store: its default embedding run, else its only GNN run)"
    )
    out: Path | None = option(None, help="directory for the PNGs (default: RUN/plots)")
    epoch: int = option(0, help="epoch whose timeline to draw (0: the last; embedding runs)")
