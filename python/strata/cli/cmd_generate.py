"""``strata generate rmat|kg|sbm|hetsbm``."""

from __future__ import annotations

from ..config import GENERATORS, from_args
from ..generate import format_summary, generate
from .common import add_section_command, emit_summary, run_with_progress
from .parser import SectionParser

HELP = {
    "rmat": "Graph500 R-MAT/Kronecker graph (power-law), as int32 pairs, TSV or .npy",
    "kg": "knowledge graph with planted latent structure, as train/valid/test TSV triples",
    "sbm": "labelled degree-corrected SBM with class-correlated features, as NumPy arrays",
    "hetsbm": "ogbn-mag-like typed SBM with weights and times, written as a typed store",
}


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Streams a synthetic graph to disk; equal options give identical files. "
        "Convert the files of rmat, kg and sbm with `strata convert`; hetsbm writes a store. "
        "See docs/generators.md.",
    )
    kinds = p.add_subparsers(parser_class=SectionParser, dest="kind", metavar="KIND", required=True)
    for kind, cls in GENERATORS.items():
        add_section_command(kinds, kind, cls, run, help=HELP[kind])


def run(args) -> int:
    cfg = from_args(GENERATORS[args.kind], args)
    summary = run_with_progress(args, lambda bar: generate(cfg, bar))
    emit_summary(args, summary, format_summary(summary))
    return 0
