"""Graph and knowledge-graph embedding training on graphs larger than memory (Legend).

``train`` runs (or resumes) a training run; ``Run`` opens one for evaluation, prediction and
export; ``plan`` shows an ordering's epoch schedule.
"""

from .hdf5 import import_pbg
from .plan import format_plan, plan
from .runs import Run, default_run_dir, resolve_run
from .train import format_metrics, format_summary, train

__all__ = [
    "Run",
    "default_run_dir",
    "format_metrics",
    "format_plan",
    "format_summary",
    "import_pbg",
    "plan",
    "resolve_run",
    "train",
]
