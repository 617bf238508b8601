"""Graph and knowledge-graph embedding training on graphs larger than memory (Legend)."""

from .plan import format_plan, plan

__all__ = ["format_plan", "plan"]
