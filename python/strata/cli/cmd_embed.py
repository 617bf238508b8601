"""``strata embed plan|train|eval|predict|neighbors|index|score|export|import-pbg|gather``."""

from __future__ import annotations

import json
import sys

from .. import _native
from ..config import (
    EmbedEvalConfig,
    EmbedExportConfig,
    EmbedGatherConfig,
    EmbedImportPbgConfig,
    EmbedIndexConfig,
    EmbedNeighborsConfig,
    EmbedPlanConfig,
    EmbedPredictConfig,
    EmbedScoreConfig,
    EmbedSearchConfig,
    EmbedTrainConfig,
    engine_options,
    from_args,
)
from ..embed import Run, ann, dist, format_metrics, format_plan, format_summary, import_pbg, plan, search, train
from ..errors import ConfigError
from ..units import fmt_bytes, fmt_duration
from .common import add_section_command, emit_summary, run_with_progress
from .parser import SectionParser


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Out-of-core embedding training after Legend: node partitions on disk, a buffer of a few "
        "resident partitions, a prefetch-friendly partition order, native CPU kernels.",
    )
    cmds = p.add_subparsers(parser_class=SectionParser, dest="embed_command", metavar="COMMAND", required=True)
    add_section_command(
        cmds,
        "train",
        EmbedTrainConfig,
        run_train,
        help="train (or resume) embeddings of a store within --memory",
        description="Trains embeddings of STORE in a run directory (default STORE/runs/embed). Prints the budget "
        "plan and the Theorem 3 check, a progress bar per epoch, validation metrics per epoch, and test metrics of "
        "the best checkpoint. A killed run resumes from its last checkpoint when started again.",
    )
    add_section_command(cmds, "eval", EmbedEvalConfig, run_eval, help="rank a split with a run's checkpoint")
    add_section_command(
        cmds, "predict", EmbedPredictConfig, run_predict, help="the best tails of (head, relation, ?) or heads"
    )
    add_section_command(
        cmds,
        "neighbors",
        EmbedNeighborsConfig,
        run_neighbors,
        help="the nearest nodes of nodes' embeddings, by an exact scan within --memory",
        description="Scans every partition of the table (through the buffer when it does not fit --memory) for "
        "the --top nearest nodes of each query node by --metric; several query nodes share one scan.",
    )
    add_section_command(
        cmds,
        "index",
        EmbedIndexConfig,
        run_index,
        help="build an approximate neighbour index of a run (usearch, the ann extra) for neighbors --index",
        description="Exports the checkpoint within --memory and adds its rows to a usearch HNSW graph saved in OUT; "
        "`strata embed neighbors RUN --node NAME --index OUT` then answers from it without scanning the table.",
    )
    add_section_command(
        cmds,
        "score",
        EmbedScoreConfig,
        run_score,
        help="score (head, relation, tail) triples of a file with the run's score function",
        description="Reads head<TAB>relation<TAB>tail lines (names from the store's id maps) and writes "
        "head<TAB>relation<TAB>tail<TAB>score lines in input order to --out or standard output.",
    )
    add_section_command(
        cmds,
        "export",
        EmbedExportConfig,
        run_export,
        help="write a checkpoint's embeddings as .npy, TSV, Parquet or a PyTorch-BigGraph checkpoint",
    )
    add_section_command(
        cmds,
        "import-pbg",
        EmbedImportPbgConfig,
        run_import_pbg,
        help="a PyTorch-BigGraph checkpoint as a run on a store with its entity names (h5py, the hdf5 extra)",
        description="Reads a PBG checkpoint directory (config.json, checkpoint_version.txt, model and embeddings "
        ".h5, entity names and counts) and writes a run OUT on STORE, whose node and relation names must be PBG's "
        "entity and relation names, so that eval, predict, neighbors, export and serve work on it. Entity rows are "
        "read a slice at a time and each partition of the table is written whole, within --memory.",
    )
    add_section_command(
        cmds,
        "gather",
        EmbedGatherConfig,
        run_gather,
        help="one run from every rank's directory of an owner-mode run (dist_storage = owners)",
        description="Copies each partition of the committed and best tables from the rank that owns it into a new "
        "run OUT, with the relations and the run record, so that eval, predict and export work on OUT.",
    )
    add_section_command(
        cmds,
        "search",
        EmbedSearchConfig,
        run_search,
        help="search [embed.train] options with Optuna: trials within --memory, pruned on validation MRR",
        description="Runs --trials training runs of STORE, one after another within --memory, with options drawn "
        "from the SPACE file by Optuna's sampler; each validation reports its MRR to the pruner, which stops "
        "trials behind the others. Prints one table, writes OUT/search.json and OUT/best.toml (a config for "
        "strata embed train --config).",
    )
    add_section_command(
        cmds,
        "plan",
        EmbedPlanConfig,
        run_plan,
        output_flags=False,
        help="print the buffer states and bucket order of an epoch",
    )


def run_train(args) -> int:
    cfg = from_args(EmbedTrainConfig, args)
    run = run_with_progress(args, lambda bar: train(cfg, bar))
    if not dist.follower():
        emit_summary(args, run.meta, format_summary(run))
    return 0


def run_search(args) -> int:
    cfg = from_args(EmbedSearchConfig, args)
    lines: list[str] = []

    def report(line: str) -> None:
        # Each trial's row as it finishes, under the table's header.
        if not getattr(args, "quiet", False):
            print(*([search.HEADER] if not lines else []), line, sep="\n", file=sys.stderr, flush=True)
        lines.append(line)

    results = run_with_progress(args, lambda bar: search.search(cfg, bar, report))
    emit_summary(args, results, search.format_table(results))
    return 0


def run_eval(args) -> int:
    cfg = from_args(EmbedEvalConfig, args)
    run = Run(cfg.target)
    result = run_with_progress(args, lambda bar: run.evaluate(progress=bar, **engine_options(cfg)))
    if cfg.json:
        print(json.dumps(result, indent=2))
    else:
        m = result["metrics"]
        print(f"{run.path} epoch {result['epoch']} ({cfg.checkpoint}), {cfg.split}: {format_metrics(m)}")
        if m.get("tail_mrr") is not None and m.get("head_mrr") is not None:
            print(f"  tails MRR {m['tail_mrr']:.4f}, heads MRR {m['head_mrr']:.4f}; {fmt_duration(m['seconds'])}")
    return 0


def run_predict(args) -> int:
    cfg = from_args(EmbedPredictConfig, args)
    run = Run(cfg.target)
    result = run_with_progress(args, lambda bar: run.predict(progress=bar, **engine_options(cfg)))
    if cfg.json:
        print(json.dumps(result, indent=2))
        return 0
    query = (
        f"({cfg.head}, {cfg.relation or '-'}, ?)" if cfg.head is not None else f"(?, {cfg.relation or '-'}, {cfg.tail})"
    )
    print(f"{query} by {run.path} epoch {result['epoch']}:")
    print_ranked(result["predictions"], "score", known=True)
    return 0


def print_ranked(rows: list[dict], value: str, known: bool = False) -> None:
    """A ranked table of ``rows`` (``name``, ``score``, and ``known`` when ``known``): rank, node,
    the score under the heading ``value``, and whether the answer is a known edge."""
    width = max((len(r["name"]) for r in rows), default=4)
    print(f"  {'rank':>4}  {'node':<{width}}  {value:>10}" + ("  known" if known else ""))
    for i, r in enumerate(rows, 1):
        flag = f"  {'yes' if r['known'] else ''}" if known else ""
        print(f"  {i:>4}  {r['name']:<{width}}  {r['score']:>10.4f}{flag}")


def run_neighbors(args) -> int:
    cfg = from_args(EmbedNeighborsConfig, args)
    run = Run(cfg.target)
    if cfg.index is not None:
        result = ann.search_run_index(run, cfg)
    else:
        result = run_with_progress(args, lambda bar: run.neighbors(progress=bar, **engine_options(cfg)))
    if cfg.json:
        print(json.dumps(result, indent=2))
        return 0
    value = "distance" if result["metric"] == "l2" else result["metric"]
    for q in result["results"]:
        print(f"nearest to {q['name']} ({result['metric']}) by {run.path} epoch {result['epoch']}:")
        print_ranked(q["neighbors"], value)
    return 0


def run_index(args) -> int:
    cfg = from_args(EmbedIndexConfig, args)
    run = Run(cfg.target)
    meta = run_with_progress(args, lambda bar: ann.index_run(run, cfg, bar))
    emit_summary(
        args,
        meta,
        f"Indexed {meta['num_nodes']:,} x {meta['dim']} embeddings of epoch {meta['epoch']} of {run.path} "
        f"({meta['metric']}) into {cfg.out}; query it with strata embed neighbors {run.path} --index {cfg.out}.",
    )
    return 0


def run_score(args) -> int:
    cfg = from_args(EmbedScoreConfig, args)
    run = Run(cfg.target)
    report = run_with_progress(args, lambda bar: run.score_file(progress=bar, **engine_options(cfg)))
    if cfg.out is not None:
        emit_summary(
            args,
            report,
            f"Scored {report['triples']:,} triples with epoch {report['epoch']} of {run.path} into {cfg.out} "
            f"in {fmt_duration(report['seconds'])}.",
        )
    return 0


def run_export(args) -> int:
    cfg = from_args(EmbedExportConfig, args)
    run = Run(cfg.target)
    report = run_with_progress(args, lambda bar: run.export(progress=bar, **engine_options(cfg)))
    if cfg.format == "pbg":
        emit_summary(args, report, f"Exported epoch {report['epoch']} of {run.path} as a PyTorch-BigGraph checkpoint: "
                     f"{pbg_summary(report)} in {fmt_duration(report['seconds'])}.")  # fmt: skip
        return 0
    size = sum((cfg.out / f).stat().st_size for f in report["files"])
    emit_summary(
        args,
        report,
        f"Exported epoch {report['epoch']} of {run.path}: {report['num_nodes']:,} x {report['dim']} embeddings "
        f"in node-id order to {cfg.out} ({', '.join(report['files'])}; {fmt_bytes(size)}) "
        f"in {fmt_duration(report['seconds'])}.",
    )
    return 0


def pbg_summary(report: dict) -> str:
    """What a PyTorch-BigGraph export or import wrote, for its summary line."""
    return (
        f"{report['num_nodes']:,} x {report['dim']} embeddings in {report['partitions']} partition(s), "
        f"{report['num_relations']} relation type(s), {report['model']} = operator {report['operator']}, comparator "
        f"{report['comparator']}, to {report['out']}"
    )


def run_import_pbg(args) -> int:
    cfg = from_args(EmbedImportPbgConfig, args)
    report = run_with_progress(args, lambda bar: import_pbg(engine_options(cfg), bar))
    inverse = "with reciprocal relations" if report["reciprocal"] else "without reciprocal relations"
    emit_summary(
        args,
        report,
        f"Imported {cfg.checkpoint}: {pbg_summary(report)} ({inverse}) in {fmt_duration(report['seconds'])}; "
        f"eval, predict, neighbors, export or serve it as any run.",
    )
    return 0


def run_gather(args) -> int:
    cfg = from_args(EmbedGatherConfig, args)
    if not cfg.ranks:
        raise ConfigError("embed gather: name every rank's directory after OUT (RUN/rank-0 RUN/rank-1 ...)")
    meta = run_with_progress(
        args, lambda bar: _native.embed_gather(str(cfg.out), [str(d) for d in cfg.ranks], engine_options(cfg), bar)
    )
    emit_summary(
        args,
        meta,
        f"Gathered epoch {meta['current']['epoch']} of {meta['world_size']} ranks into {cfg.out}: "
        f"evaluate, predict or export it as any run.",
    )
    return 0


def run_plan(args) -> int:
    cfg = from_args(EmbedPlanConfig, args)
    p = plan(**engine_options(cfg))
    print(json.dumps(p, indent=2) if cfg.json else format_plan(p, cfg.show_buckets))
    return 0
