"""The [embed.*] sections."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from .. import _native
from ..errors import ConfigError
from .schema import Size, native_section, option, section

#: The registered orderings (``strata_embed::ordering::OrderingKind``), as the trainer's
#: schema lists them, with the help text naming each one's buffer.
_ORDERING = _native.config_schema()["embed.train"]["properties"]["ordering"]
ORDERINGS = tuple(choice["const"] for choice in _ORDERING["oneOf"])


@section("embed.plan")
class EmbedPlanConfig:
    partitions: int = option(help="number of node partitions n", max=(1 << 32) - 1)
    buffer: int = option(3, help="partitions resident at once (see --ordering for what each ordering needs)")
    ordering: Literal[ORDERINGS] = option("legend", help=_ORDERING["description"])
    show_buckets: bool = option(False, help="list the buckets trained in each state")
    json: bool = option(False, help="print the whole schedule as JSON")

    def check(self) -> None:
        if self.partitions < 1:
            raise ConfigError(f"embed.plan.partitions: need at least 1, got {self.partitions}")


class _TrainFrontEnd:
    """The [embed.train] options Python handles; the rest are the trainer's
    (``strata_embed::config::TrainConfig``)."""

    store: Path = option(positional=True, help="store to train on (from strata convert or generate)")
    run_dir: Path | None = option(None, help="run directory (default: STORE/runs/embed); an existing run resumes")
    fresh: bool = option(False, help="start over even if the run directory holds a run")
    tensorboard: bool = option(
        True, help="also write TensorBoard event files into the run when tensorboard is installed"
    )


EmbedTrainConfig = native_section("embed.train", "EmbedTrainConfig", front=_TrainFrontEnd)


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
