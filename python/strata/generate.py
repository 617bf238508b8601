"""``strata generate``: deterministic synthetic graphs streamed to disk (RMAT, a knowledge
graph with planted structure, a labelled SBM with features, and a typed SBM written as a
store)."""

from __future__ import annotations

from collections.abc import Callable

from . import _native
from .config import GENERATORS, as_dict
from .paths import refuse_owned_file
from .units import fmt_bytes, fmt_count, fmt_duration


def generate(cfg, progress: Callable[..., bool] | None = None) -> dict:
    """Runs the generator of config section ``cfg`` (an RmatConfig, KgConfig, SbmConfig or
    HetSbmConfig)."""
    kind = next(k for k, cls in GENERATORS.items() if isinstance(cfg, cls))
    if kind == "rmat":  # the one file output: --overwrite must not replace a store's file
        refuse_owned_file(cfg.out, "--out")
    return _native.generate(kind, as_dict(cfg), progress)


def format_summary(s: dict) -> str:
    """The one-paragraph summary printed after a generation."""
    secs = s["seconds"]
    details = s.get("details") or {}
    extra = ""
    if s["kind"] == "kg":
        splits = details.get("splits", {})
        extra = (
            " ("
            + " / ".join(f"{splits[k]:,} {k}" for k in ("train", "valid", "test") if k in splits)
            + f" triples, {details.get('relations', '?')} relations)"
        )
    elif s["kind"] == "sbm":
        extra = f" ({details.get('classes', '?')} classes, {details.get('feature_dim', '?')}-dim features)"
    elif s["kind"] == "hetsbm":
        types = ", ".join(f"{t['count']:,} {t['name']}" for t in details.get("node_types", []))
        extra = f" ({types}; {len(details.get('edge_types', []))} edge types, {details.get('classes', '?')} classes)"
    # A store's files are many; its directory names them all.
    files = str(s["out"]) if s["kind"] == "hetsbm" else ", ".join(str(f) for f in s["files"])
    return (
        f"Generated {s['kind']}: {s['num_nodes']:,} nodes and {s['num_edges']:,} edges{extra} in "
        f"{fmt_duration(secs)} ({fmt_count(s['num_edges'] / max(secs, 1e-9))} edges/s, "
        f"{s['bytes_written'] / max(secs, 1e-9) / 1e6:.0f} MB/s), {fmt_bytes(s['bytes_written'])} written: {files}."
    )
