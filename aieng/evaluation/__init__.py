"""Quality metrics for a model folder: held-out exact match per task family, and perplexity.

These numbers go into a version's manifest and are what release gates and rollback decisions
compare (docs/architecture.md, "manifest.json").
"""

from aieng.evaluation.suite import SUITE_NAME, EvalReport, evaluate, evaluate_dir

__all__ = ["SUITE_NAME", "EvalReport", "evaluate", "evaluate_dir"]
