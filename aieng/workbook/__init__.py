"""What the notebooks and runbooks use so they hold no logic of their own: where the project's
store is (``paths``), running a runbook with papermill, keeping its executed copy (``runbooks``),
and stopping a lesson's server when one of its cells fails (``servers``)."""

from aieng.workbook.paths import PROJECT_ROOT, default_store, demo_model_dir, store_root

__all__ = ["PROJECT_ROOT", "default_store", "demo_model_dir", "store_root"]
