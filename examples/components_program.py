"""Connected components written as a vertex program with an active set (label propagation).

    strata run program STORE --program examples/components_program.py

Each vertex starts with its own id as its label; a vertex whose label dropped in the last
iteration sends it along its edges, a vertex takes the smallest label it receives, and the run
stops when no label drops. Only the edges of active vertices are streamed (blocks whose source
chunk has none are skipped), so the later iterations, with few labels still moving, read little.
On a symmetric grid (``symmetric=True``: built or found with both directions of every edge) the
labels are the weakly connected components, each named by its smallest vertex id, as
``strata run wcc`` names them.
"""

from __future__ import annotations

from strata.grid import VertexProgram

program = VertexProgram(
    "components",
    values={"component": ("i64", "id")},
    edge="src.component",
    combine="min",
    apply={"component": "min(component, acc)"},
    active="component < old.component",
    aggregates={"moved": ("sum", "component < old.component")},
    symmetric=True,
)
