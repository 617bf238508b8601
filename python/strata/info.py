"""``strata info``: what a store holds, its degree statistics, bytes per array, and what fits
in a given memory budget."""

from __future__ import annotations

import math

from .store import Store
from .units import fmt_bytes


def describe(store: Store, memory: int | None = None, dim: int = 128) -> dict:
    """A JSON-able description of ``store`` (and a fit analysis when ``memory`` is given)."""
    m = store.manifest
    g = m["graph"]
    usage = store.disk_usage()
    arrays = m["arrays"]
    by_array = {name: usage[info["file"]] for name, info in arrays.items()}
    desc = {
        "path": str(store.path),
        "name": m["name"],
        "format_version": m["format_version"],
        "strata_version": m["strata_version"],
        "converter": (m.get("provenance") or {}).get("converter"),
        "graph": g,
        "features": m.get("features"),
        "labels": m.get("labels"),
        "node_splits": m.get("node_splits", {}),
        "stats": m["stats"],
        "bytes_per_file": usage,
        "bytes_total": sum(usage.values()),
    }
    if memory is not None:
        desc["fit"] = fit_analysis(m, by_array, memory, dim)
    return desc


def _size(by_array: dict, *names: str) -> int:
    # Aliased arrays (CSC of a symmetrized store) share one file: count each file once.
    return sum(by_array.get(n, 0) for n in dict.fromkeys(names))


def fit_analysis(m: dict, by_array: dict, memory: int, dim: int) -> list[dict]:
    """What each engine would keep in memory for this store, and whether it fits ``memory``."""
    g = m["graph"]
    n = g["num_nodes"]
    symmetric = g["symmetrized"]
    topo = _size(by_array, "csr_indptr", "csr_indices") + (
        0 if symmetric else _size(by_array, "csc_indptr", "csc_indices")
    )
    rows = [{"what": "topology (CSR + CSC), for neighbour sampling", "bytes": topo}]
    rows.append({"what": "train edges", "bytes": _size(by_array, "edges_train")})
    feats = _size(by_array, "features")
    if feats:
        spare = max(memory - topo, 0)
        frac = min(spare / feats, 1.0)
        note = "all rows in RAM" if frac >= 1 else f"{frac:.0%} of rows as a RAM cache, the rest read from SSD"
        rows.append({"what": "node features", "bytes": feats, "note": note})
    table = n * dim * 4 * 2
    parts = max(1, math.ceil(3 * table / max(memory * 0.8, 1)))
    note = "one partition (in memory)" if parts == 1 else f">= {parts} partitions with a buffer of 3"
    rows.append({"what": f"embeddings dim {dim} + Adagrad state", "bytes": table, "note": note})
    rows.append({"what": "PageRank vertex data (2 x float64)", "bytes": n * 16})
    for r in rows:
        r["fits"] = r["bytes"] <= memory
    return rows


def _deg_line(s: dict) -> str:
    return (
        f"min {s['min']:,}  median {s['median']:,}  mean {s['mean']:.2f}  p90 {s['p90']:,}  "
        f"p99 {s['p99']:,}  max {s['max']:,}  ({s['zeros']:,} nodes with none)"
    )


def render(desc: dict, memory: int | None = None) -> str:
    """Human-readable text of :func:`describe`'s output."""
    g = desc["graph"]
    lines = [
        f"Store {desc['path']}  ({desc['name']}; format {desc['format_version']}, strata "
        f"{desc['strata_version']}, converter {desc['converter']})"
    ]
    named = " (named)" if g["node_names"] else " (integer ids)"
    lines.append(f"  nodes         {g['num_nodes']:,}{named}")
    if g["num_relations"]:
        lines.append(f"  relations     {g['num_relations']:,}{' (named)' if g['relation_names'] else ''}")
    edges = " / ".join(f"{g['num_edges'][k]:,} {k}" for k in ("train", "valid", "test") if k in g["num_edges"])
    cols = "src,rel,dst" if g["num_relations"] else "src,dst"
    lines.append(f"  edges         {edges}  ({g['id_dtype']} ids, columns {cols})")
    sym = ", symmetrized: CSR = CSC" if g["symmetrized"] else ""
    lines.append(f"  topology      {g['num_topology_edges']:,} edges in CSR and CSC{sym}")
    lines.append(f"  out-degree    {_deg_line(desc['stats']['out_degree'])}")
    if not g["symmetrized"]:
        lines.append(f"  in-degree     {_deg_line(desc['stats']['in_degree'])}")
    if desc["features"]:
        f = desc["features"]
        lines.append(f"  features      {f['dim']} x {f['dtype']} per node")
    if desc["labels"]:
        lines.append(f"  labels        {desc['labels']['num_classes']} classes")
    if desc["node_splits"]:
        ns = desc["node_splits"]
        lines.append("  node splits   " + " / ".join(f"{ns[k]:,} {k}" for k in ("train", "valid", "test") if k in ns))
    lines.append("Bytes on disk")
    for name, size in sorted(desc["bytes_per_file"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<28}{fmt_bytes(size):>12}")
    lines.append(f"  {'total':<28}{fmt_bytes(desc['bytes_total']):>12}")
    if "fit" in desc:
        lines.append(f"In a memory budget of {fmt_bytes(memory)}")
        for r in desc["fit"]:
            mark = "fits" if r["fits"] else "does not fit"
            note = f"; {r['note']}" if r.get("note") else ""
            lines.append(f"  {r['what']:<46}{fmt_bytes(r['bytes']):>12}  {mark}{note}")
    return "\n".join(lines)
