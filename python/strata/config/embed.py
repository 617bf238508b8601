"""The [embed.*] sections: the engine declares their options (strata-embed's ``config.rs``); Python
adds the ones it handles in front (the store or run, how to print). [plot] is Python's."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from .schema import Size, native_section, option, section


class _PlanFrontEnd:
    """The [embed.plan] options of the printout; the schedule's are the engine's
    (``strata_embed::PlanOptions``)."""

    show_buckets: bool = option(False, help="list the buckets trained in each state")
    json: bool = option(False, help="print the whole schedule as JSON")


EmbedPlanConfig = native_section("embed.plan", "EmbedPlanConfig", front=_PlanFrontEnd)


class _TrainFrontEnd:
    """The [embed.train] options Python handles; the rest are the trainer's
    (``strata_embed::TrainConfig``)."""

    store: Path = option(positional=True, help="store to train on (from strata convert or generate)")
    run_dir: Path | None = option(None, help="run directory (default: STORE/runs/embed); an existing run resumes")
    fresh: bool = option(False, help="start over even if the run directory holds a run")
    tensorboard: bool = option(
        True, help="also write TensorBoard event files into the run when tensorboard is installed"
    )
    dist_policy: Literal["affinity", "lock_server"] = option(
        "affinity",
        help="distributed runs: how rank 0 hands out buckets: affinity (fewest partition loads into each "
        "rank's buffer) or lock_server (PyTorch-BigGraph's lock server: the buffer is the current bucket, "
        "lexicographic order preferring the last bucket's partitions), to compare the two on one graph",
    )


EmbedTrainConfig = native_section("embed.train", "EmbedTrainConfig", front=_TrainFrontEnd)


TARGET_HELP = "a run directory, or a store (its default run STORE/runs/embed)"


class _EvalFrontEnd:
    """The [embed.eval] options Python handles (which run, how to print); the rest are the
    engine's (``strata_embed::EvalOptions``), as for predict and export."""

    target: Path = option(positional=True, help=TARGET_HELP)
    json: bool = option(False, help="print the metrics as JSON")


class _PredictFrontEnd:
    target: Path = option(positional=True, help=TARGET_HELP)
    json: bool = option(False, help="print the answers as JSON")


class _ExportFrontEnd:
    target: Path = option(positional=True, help=TARGET_HELP)


class _NeighborsFrontEnd:
    target: Path = option(positional=True, help=TARGET_HELP)
    json: bool = option(False, help="print the neighbours as JSON")
    index: Path | None = option(
        None, help="answer from this approximate index (strata embed index; the ann extra) instead of a scan"
    )


class _ScoreFrontEnd:
    target: Path = option(positional=True, help=TARGET_HELP)


EmbedEvalConfig = native_section("embed.eval", "EmbedEvalConfig", front=_EvalFrontEnd)
EmbedPredictConfig = native_section("embed.predict", "EmbedPredictConfig", front=_PredictFrontEnd)
EmbedExportConfig = native_section("embed.export", "EmbedExportConfig", front=_ExportFrontEnd)
EmbedNeighborsConfig = native_section("embed.neighbors", "EmbedNeighborsConfig", front=_NeighborsFrontEnd)
EmbedScoreConfig = native_section("embed.score", "EmbedScoreConfig", front=_ScoreFrontEnd)


@section("embed.index")
class EmbedIndexConfig:
    """An approximate neighbour index (usearch HNSW, the ann extra) of a run's checkpoint, for
    many repeated neighbour queries; see docs/embed.md."""

    target: Path = option(positional=True, help=TARGET_HELP)
    out: Path = option(short="o", help="directory to write (index.usearch, index.json, node_names.txt)")
    metric: Literal["model", "cos", "dot", "l2"] = option(
        "model", help="cos, dot or l2 (model: the run's model's own, as strata embed neighbors)"
    )
    connectivity: int = option(16, min=2, max=256, help="links per node of the HNSW graph")
    expansion: int = option(
        128, min=1, max=65536, help="candidates kept while adding and searching (higher: better recall, slower)"
    )
    checkpoint: Literal["best", "last"] = option("best", help="checkpoint to use: best (by validation MRR) or last")
    overwrite: bool = option(False, help="replace OUT if it exists")
    memory: Size | None = option(None, help="memory budget of the export the index is built from (default: the run's)")


@section("embed.search")
class EmbedSearchConfig:
    """The [embed.search] options: the store, the space file, the trials and their budget."""

    store: Path = option(positional=True, help="store to train on (with a validation split)")
    space: Path = option(
        positional=True,
        help="search space file (TOML): [embed.train] options every trial shares, and [space] with one "
        "entry per option: {choices = [...]} or {low = ..., high = ..., log = true, step = ...}",
    )
    out: Path | None = option(
        None, help="directory of the trials' runs, search.json and best.toml (default: STORE/runs/search)"
    )
    trials: int = option(20, min=1, help="trials to run, one after another")
    timeout: float | None = option(
        None, help="seconds after which no new trial starts (Optuna's timeout; a running trial finishes)"
    )
    memory: Size = option(Size(1 << 30), help="memory budget of every trial (the run's --memory)")
    seed: int = option(0, min=0, help="seed of Optuna's sampler (TPE)")
    pruner: Literal["median", "none"] = option(
        "median",
        help="median: stop a trial whose validation MRR is below the median of earlier trials' at the same "
        "epoch (Optuna's MedianPruner); none: every trial runs all its epochs",
    )
    startup_trials: int = option(2, min=0, help="median pruner: trials that run whole before any is pruned")
    overwrite: bool = option(False, help="replace OUT if it holds an earlier search")


class _GatherFrontEnd:
    """The [embed.gather] arguments (where to, from which directories); the options are the
    engine's (``strata_embed::GatherOptions``)."""

    out: Path = option(positional=True, help="directory for the gathered run (new, or a run with --overwrite)")
    ranks: list[Path] = option(
        [], positional=True, help="every rank's directory of the run (RUN/rank-R; copy them from each machine)"
    )


EmbedGatherConfig = native_section("embed.gather", "EmbedGatherConfig", front=_GatherFrontEnd)
EmbedImportPbgConfig = native_section("embed.import_pbg", "EmbedImportPbgConfig")


@section("plot")
class PlotConfig:
    target: Path = option(
        positional=True, help="run directory (or a store: its default embedding run, else its only GNN run)"
    )
    out: Path | None = option(None, help="directory for the PNGs (default: RUN/plots)")
    epoch: int = option(0, help="epoch whose timeline to draw (0: the last; embedding runs)")
