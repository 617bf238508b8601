"""``strata info``: what a store holds, its degree statistics, bytes per array, and the memory
plan each engine makes for it under a given budget (from the engines' own planners)."""

from __future__ import annotations

from . import _native
from .store import Store
from .units import fmt_bytes


def describe(store: Store, memory: int | None = None) -> dict:
    """A JSON-able description of ``store`` (and each engine's memory plan when ``memory`` is
    given)."""
    m = store.manifest
    g = m["graph"]
    usage = store.disk_usage()
    desc = {
        "path": str(store.path),
        "name": m["name"],
        "format_version": m["format_version"],
        "strata_version": m["strata_version"],
        "converter": (m.get("provenance") or {}).get("converter"),
        "generator": (m.get("provenance") or {}).get("generator"),
        "graph": g,
        "features": m.get("features"),
        "labels": m.get("labels"),
        "node_splits": m.get("node_splits", {}),
        "node_types": m.get("node_types", []),
        "edge_types": store.edge_types,
        "edge_attributes": m.get("edge_attributes"),
        "stats": m["stats"],
        # Kept by the converter; a store written before digests existed is hashed once here.
        "digest": _native.content_digest(str(store.path)),
        "bytes_per_file": usage,
        "bytes_total": sum(usage.values()),
    }
    if memory is not None:
        desc["memory"] = memory
        desc["memory_plans"] = memory_plans(store, memory)
    return desc


def memory_plans(store: Store, memory: int) -> list[dict]:
    """The plan of each engine that applies to ``store`` under ``memory`` bytes, with that
    engine's defaults otherwise: embed always; gnn with node features and labels; grid
    (pagerank) on the grid ``strata run`` would use; serve with node features. Each is the
    dict of ``_native.memory_plan`` (``error`` set when the budget cannot hold the engine,
    ``not_planned`` when there is nothing to plan yet: no grid built)."""

    m = store.manifest
    path = str(store.path)
    plans = [_native.memory_plan("embed", path, {"memory": memory})]
    if m.get("features") and m.get("labels"):
        plans.append(_native.memory_plan("gnn", path, {"memory": memory}))
    plans.append(_native.memory_plan("grid", path, {"algorithm": "pagerank", "memory": memory}))
    if m.get("features"):
        plans.append(_native.memory_plan("serve", path, {"memory": memory}))
    return plans


def plan_lines(plan: dict) -> list[str]:
    """A plan as the engine prints it, ``ENGINE: does not fit: REASON`` or ``ENGINE: not
    planned: REASON``."""
    if "error" in plan:
        return [f"{plan['engine']}: does not fit: {plan['error']}"]
    if "not_planned" in plan:
        return [f"{plan['engine']}: not planned: {plan['not_planned']}"]
    return _native.describe_memory_plan(plan)


def _deg_line(s: dict) -> str:
    return (
        f"min {s['min']:,}  median {s['median']:,}  mean {s['mean']:.2f}  p90 {s['p90']:,}  "
        f"p99 {s['p99']:,}  max {s['max']:,}  ({s['zeros']:,} nodes with none)"
    )


def render(desc: dict) -> str:
    """Human-readable text of :func:`describe`'s output."""
    g = desc["graph"]
    # A generator that writes a store (hetsbm) is named instead of a converter.
    made_by = f"generator {desc['generator']}" if desc.get("generator") else f"converter {desc['converter']}"
    lines = [
        f"Store {desc['path']}  ({desc['name']}; format {desc['format_version']}, strata "
        f"{desc['strata_version']}, {made_by})"
    ]
    named = " (named)" if g["node_names"] else " (integer ids)"
    lines.append(f"  nodes         {g['num_nodes']:,}{named}")
    for t in desc["node_types"]:
        lines.append(f"  node type     {t['name']}: ids {t['offset']:,}..{t['offset'] + t['count']:,}")
    if desc["edge_types"]:
        for k, (src, rel, dst) in enumerate(desc["edge_types"]):
            lines.append(f"  edge type {k:<3} ({src}, {rel}, {dst})")
    elif g["num_relations"]:
        lines.append(f"  relations     {g['num_relations']:,}{' (named)' if g['relation_names'] else ''}")
    attrs = desc["edge_attributes"] or {}
    if attrs:
        held = [k for k in ("weights", "times") if attrs.get(k)] + (["features"] if attrs.get("features") else [])
        lines.append(f"  edge data     {', '.join(held)} (parallel to the edge lists and to CSR/CSC)")
    edges = " / ".join(f"{g['num_edges'][k]:,} {k}" for k in ("train", "valid", "test") if k in g["num_edges"])
    cols = "src,etype,dst" if desc["edge_types"] else "src,rel,dst" if g["num_relations"] else "src,dst"
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
    lines.append(f"  digest        {desc['digest']}")
    lines.append("Bytes on disk")
    for name, size in sorted(desc["bytes_per_file"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<28}{fmt_bytes(size):>12}")
    lines.append(f"  {'total':<28}{fmt_bytes(desc['bytes_total']):>12}")
    if "memory_plans" in desc:
        lines.append(f"Memory plans for a budget of {fmt_bytes(desc['memory'])}")
        for plan in desc["memory_plans"]:
            lines += [f"  {line}" for line in plan_lines(plan)]
    return "\n".join(lines)
