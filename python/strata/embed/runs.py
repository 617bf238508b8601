"""Run directories: finding a run from a store or a path, and using a trained run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import _native
from ..errors import ConfigError, RunError
from ..paths import make_dir
from . import hdf5, parquet

ProgressFn = Callable[..., bool]

#: Where ``strata embed train STORE`` puts its run unless told otherwise.
DEFAULT_RUN = Path("runs") / "embed"


def default_run_dir(store: Path) -> Path:
    """The run directory used for ``store`` when none is given: ``STORE/runs/embed``."""
    return Path(store) / DEFAULT_RUN


def resolve_run(target: str | Path) -> Path:
    """The run directory ``target`` names: a run itself, or a store holding its default run."""
    target = Path(target)
    if (target / "run.json").is_file():
        return target
    if (target / "manifest.json").is_file():
        run = default_run_dir(target)
        if (run / "run.json").is_file():
            return run
        raise RunError(f"store {target} has no embedding run at {run}; train one with `strata embed train {target}`")
    if not target.exists():
        raise RunError(f"{target}: no such run directory or store")
    raise RunError(f"{target}: neither a run directory (run.json) nor a store (manifest.json)")


class Run:
    """A training run on disk: its record (``meta``), and evaluation, prediction and export of
    its checkpoints (``checkpoint="best"`` by validation MRR, or ``"last"``)."""

    def __init__(self, target: str | Path):
        self.path = resolve_run(target)
        self.meta: dict = _native.embed_run_info(str(self.path))

    def __repr__(self) -> str:
        c = self.meta["config"]
        return (
            f"Run({str(self.path)!r}: {c['model']} dim {c['dim']}, {self.epochs} epochs, "
            f"best epoch {self.meta['best']['epoch']})"
        )

    @property
    def epochs(self) -> int:
        """Epochs committed so far."""
        return self.meta["current"]["epoch"]

    @property
    def history(self) -> list[dict]:
        """One record per epoch: loss, timings, I/O, validation metrics."""
        return self.meta["history"]

    @property
    def test(self) -> dict | None:
        """Test metrics of the best checkpoint, once training finished."""
        return self.meta.get("test")

    def evaluate(
        self,
        split: str = "test",
        checkpoint: str = "best",
        protocol: str | None = None,
        max_queries: int = 0,
        memory=None,
        threads: int = 0,
        progress: ProgressFn | None = None,
    ) -> dict:
        """Ranking metrics of ``split``: ``{"epoch", "metrics": {mrr, mr, hits@1, hits@3, hits@10, ...}}``."""
        options = {
            "split": split,
            "checkpoint": checkpoint,
            "protocol": protocol or "run",
            "max_queries": max_queries,
            "memory": memory,
            "threads": threads,
        }
        return _native.embed_eval(str(self.path), options, progress)

    def predict(
        self,
        head: str | int | None = None,
        relation: str | int | None = None,
        tail: str | int | None = None,
        top: int = 10,
        exclude_known: bool = False,
        checkpoint: str = "best",
        memory=None,
        progress: ProgressFn | None = None,
    ) -> dict:
        """The ``top`` best tails of ``(head, relation, ?)``, or heads of ``(?, relation, tail)``:
        ``{"predictions": [{"node", "name", "score", "known"}, ...]}``, best first."""
        options = {
            "head": None if head is None else str(head),
            "tail": None if tail is None else str(tail),
            "relation": None if relation is None else str(relation),
            "top": top,
            "exclude_known": exclude_known,
            "checkpoint": checkpoint,
            "memory": memory,
        }
        return _native.embed_predict(str(self.path), options, progress)

    def export(
        self,
        out: str | Path,
        format: str = "npy",
        checkpoint: str = "best",
        overwrite: bool = False,
        memory=None,
        progress: ProgressFn | None = None,
    ) -> dict:
        """Writes the checkpoint's embeddings in node-id order (and relations, id maps) to ``out``;
        ``format="pbg"`` writes a PyTorch-BigGraph checkpoint directory instead (h5py)."""
        make_dir(Path(out).absolute().parent, "--out")
        options = {
            "out": str(out),
            "format": format,
            "checkpoint": checkpoint,
            "overwrite": overwrite,
            "memory": memory,
        }
        if format == "pbg":
            return hdf5.export_pbg(self.path, options, progress)
        writer = parquet.Writer() if format == "parquet" else None
        return _native.embed_export(str(self.path), options, progress, writer)

    def neighbors(
        self,
        nodes: str | int | list[str | int] = (),
        top: int = 10,
        metric: str = "model",
        nodes_file: str | Path | None = None,
        checkpoint: str = "best",
        memory=None,
        progress: ProgressFn | None = None,
        any_type: bool = False,
    ) -> dict:
        """The ``top`` nearest nodes of each of ``nodes`` (names, or ids without names; and the
        lines of ``nodes_file``) by an exact scan of the table within the budget, all queries
        sharing one scan: ``{"metric", "results": [{"node", "name", "neighbors": [{"node",
        "name", "score"}, ...]}, ...], "scans", "partitions_read"}``, nearest first. ``metric``:
        cos, dot, l2 (``score`` is then the distance) or model (the run's model's own). In a run
        with entity types the neighbours are of each query node's own type, unless ``any_type``
        (queries of one type share a scan of that type's rows)."""
        if isinstance(nodes, (str, int)):
            nodes = [nodes]
        options = {
            "node": [str(n) for n in nodes],
            "nodes_file": None if nodes_file is None else str(nodes_file),
            "top": top,
            "metric": metric,
            "checkpoint": checkpoint,
            "memory": memory,
            "any_type": any_type,
        }
        return _native.embed_neighbors(str(self.path), options, progress)

    def score(
        self,
        triples: list[tuple[str | int, str | int, str | int]],
        checkpoint: str = "best",
        memory=None,
        progress: ProgressFn | None = None,
    ) -> list[float]:
        """The run's scores of ``(head, relation, tail)`` triples (names, or ids without
        names), in their order: higher is more plausible."""
        named = [tuple(str(x) for x in t) for t in triples]
        if any(len(t) != 3 for t in named):
            raise ConfigError("embed.score: each triple is (head, relation, tail)")
        # The section's input names where triples come from; here they are given, not read.
        options = {"input": "<triples>", "checkpoint": checkpoint, "memory": memory}
        return _native.embed_score_triples(str(self.path), named, options, progress)

    def score_file(
        self,
        input: str | Path,
        out: str | Path | None = None,
        checkpoint: str = "best",
        memory=None,
        progress: ProgressFn | None = None,
    ) -> dict:
        """Scores the ``head<TAB>relation<TAB>tail`` lines of ``input`` into ``out`` (or standard
        output) as ``head<TAB>relation<TAB>tail<TAB>score`` lines in input order."""
        options = {
            "input": str(input),
            "out": None if out is None else str(out),
            "checkpoint": checkpoint,
            "memory": memory,
        }
        return _native.embed_score(str(self.path), options, progress)
