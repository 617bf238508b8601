"""``strata datasets list|fetch``."""

from __future__ import annotations

import json

from ..config import DatasetsListConfig, FetchConfig, from_args
from ..convert import format_summary
from ..datasets.fetch import MIRROR_ENV, fetch
from ..datasets.registry import CATALOGUE
from ..units import fmt_bytes
from .common import add_section_command, emit_summary, run_with_progress
from .parser import SectionParser


def register(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Downloads public graph datasets with resume and checksums, and converts "
        "them into stores. See docs/datasets.md.",
    )
    actions = p.add_subparsers(parser_class=SectionParser, dest="action", metavar="ACTION", required=True)
    add_section_command(
        actions,
        "list",
        DatasetsListConfig,
        run_list,
        output_flags=False,
        help="show the catalogue: what each dataset is, its size, host and checksums",
    )
    add_section_command(
        actions,
        "fetch",
        FetchConfig,
        run_fetch,
        help="download (resuming), verify, extract and convert a dataset",
        description=f"Downloads the files of NAME into DIR/NAME/raw/ (resuming FILE.part, checking published "
        f"checksums), extracts archives, and converts them into DIR/NAME/NAME.strata. Complete files "
        f"are not downloaded again. A mirror (--mirror or ${MIRROR_ENV}) serves file F of dataset N "
        f"at MIRROR/N/F.",
    )


def catalogue_rows() -> list[dict]:
    """The catalogue as plain data, one dict per dataset (what ``list --json`` prints)."""
    return [
        {
            "name": d.name,
            "summary": d.summary,
            "task": d.task,
            "size_bytes": d.size,
            "source": d.source,
            "checksums": d.checksums,
            "urls": [f.url for f in d.files],
        }
        for d in CATALOGUE.values()
    ]


def run_list(args) -> int:
    cfg = from_args(DatasetsListConfig, args)
    rows = catalogue_rows()
    if cfg.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("NAME", "SIZE", "CHECKSUM", "SOURCE", "WHAT")]
    for r in rows:
        size = fmt_bytes(r["size_bytes"]) if r["size_bytes"] is not None else "unknown"
        table.append((r["name"], size, r["checksums"], r["source"], f"{r['summary']}; {r['task']}"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print("\nSizes are approximate where not measured; `strata datasets fetch NAME --dir D` downloads one.")
    return 0


def run_fetch(args) -> int:
    cfg = from_args(FetchConfig, args)
    result = run_with_progress(args, lambda bar: fetch(cfg, bar))
    paragraph = result.describe()
    if result.summary is not None:
        paragraph += "\n" + format_summary(result.summary)
    emit_summary(args, result.as_dict(), paragraph)
    return 0
