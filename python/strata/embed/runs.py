"""Run directories: finding a run from a store or a path, and using a trained run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import _native
from ..errors import ConfigError, RunError
from ..paths import make_dir, refuse_owned_file
from . import hdf5, parquet

ProgressFn = Callable[..., bool]

#: Where ``strata embed train STORE`` puts its run unless told otherwise.
DEFAULT_RUN = Path("runs") / "embed"

#: The ``format`` of an embedding run's ``run.json``.
RUN_FORMAT = "strata-embed-run"


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

    # Each use of a run takes its engine section's options (``[embed.eval]``, ``[embed.predict]``,
    # ...: ``strata config embed.eval`` lists them) as keyword arguments, and passes them on
    # as they are: the engine checks them and fills in its defaults, so neither is written
    # here. The first argument is the one the use is about (a split, the query nodes, ...).

    def evaluate(self, split: str = "test", *, progress: ProgressFn | None = None, **options) -> dict:
        """Ranking metrics of ``split`` (``options``: ``[embed.eval]``'s, e.g. ``checkpoint``,
        ``protocol``, ``max_queries``, ``memory``, ``threads``):
        ``{"epoch", "metrics": {mrr, mr, hits@1, hits@3, hits@10, ...}}``."""
        return _native.embed_eval(str(self.path), _plain({"split": split, **options}), progress)

    def predict(
        self,
        head: str | int | None = None,
        relation: str | int | None = None,
        tail: str | int | None = None,
        *,
        progress: ProgressFn | None = None,
        **options,
    ) -> dict:
        """The ``top`` best tails of ``(head, relation, ?)``, or heads of ``(?, relation, tail)``
        (names, or ids without names; ``options``: ``[embed.predict]``'s, e.g. ``top``,
        ``exclude_known``, ``checkpoint``, ``memory``):
        ``{"predictions": [{"node", "name", "score", "known"}, ...]}``, best first."""
        query = {"head": head, "relation": relation, "tail": tail}
        named = {k: None if v is None else str(v) for k, v in query.items() if k not in options}
        return _native.embed_predict(str(self.path), _plain({**named, **options}), progress)

    def export(self, out: str | Path, *, progress: ProgressFn | None = None, **options) -> dict:
        """Writes the checkpoint's embeddings in node-id order (and relations, id maps) to ``out``
        (``options``: ``[embed.export]``'s, e.g. ``format``, ``checkpoint``, ``overwrite``,
        ``memory``); ``format="pbg"`` writes a PyTorch-BigGraph checkpoint directory instead
        (h5py)."""
        make_dir(Path(out).absolute().parent, "--out")
        # Checked here, defaults filled in, for the format that picks the writer.
        options = _native.config_check("embed.export", _plain({**options, "out": out}))
        if options["format"] == "pbg":
            return hdf5.export_pbg(self.path, options, progress)
        writer = parquet.Writer() if options["format"] == "parquet" else None
        return _native.embed_export(str(self.path), options, progress, writer)

    def neighbors(
        self, nodes: str | int | list[str | int] = (), *, progress: ProgressFn | None = None, **options
    ) -> dict:
        """The ``top`` nearest nodes of each of ``nodes`` (names, or ids without names; and the
        lines of ``nodes_file``) by an exact scan of the table within the budget, all queries
        sharing one scan: ``{"metric", "results": [{"node", "name", "neighbors": [{"node",
        "name", "score"}, ...]}, ...], "scans", "partitions_read"}``, nearest first. ``options``:
        ``[embed.neighbors]``'s, e.g. ``top``, ``metric`` (cos, dot, l2, whose ``score`` is then
        the distance, or model: the run's model's own), ``nodes_file``, ``checkpoint``,
        ``memory``, ``any_type``. In a run with entity types the neighbours are of each query
        node's own type, unless ``any_type`` (queries of one type share a scan of that type's
        rows)."""
        if isinstance(nodes, (str, int)):
            nodes = [nodes]
        options.setdefault("node", [str(n) for n in nodes])
        return _native.embed_neighbors(str(self.path), _plain(options), progress)

    def score(
        self,
        triples: list[tuple[str | int, str | int, str | int]],
        *,
        progress: ProgressFn | None = None,
        **options,
    ) -> list[float]:
        """The run's scores of ``(head, relation, tail)`` triples (names, or ids without
        names), in their order: higher is more plausible (``options``: ``[embed.score]``'s,
        ``checkpoint`` and ``memory``)."""
        named = [tuple(str(x) for x in t) for t in triples]
        if any(len(t) != 3 for t in named):
            raise ConfigError("embed.score: each triple is (head, relation, tail)")
        # The section's input names where triples come from; here they are given, not read.
        options = {**options, "input": "<triples>"}
        return _native.embed_score_triples(str(self.path), named, _plain(options), progress)

    def score_file(
        self,
        input: str | Path,
        out: str | Path | None = None,
        *,
        progress: ProgressFn | None = None,
        **options,
    ) -> dict:
        """Scores the ``head<TAB>relation<TAB>tail`` lines of ``input`` into ``out`` (or standard
        output) as ``head<TAB>relation<TAB>tail<TAB>score`` lines in input order (``options``:
        ``[embed.score]``'s, ``checkpoint`` and ``memory``). ``out`` may be ``input`` (the
        scores replace it once complete), not a directory or a file of a store, grid or run."""
        if out is not None:
            refuse_owned_file(out, "--out")
        return _native.embed_score(str(self.path), _plain({"input": input, "out": out, **options}), progress)


def _plain(options: dict) -> dict:
    """``options`` with paths as strings, as the engine's sections take them."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
