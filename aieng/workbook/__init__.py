"""What the notebooks and runbooks use so they hold no logic of their own: where the project's
store is (``paths``), and running a runbook with papermill, keeping its executed copy (``runbooks``)."""

from aieng.workbook.paths import PROJECT_ROOT, default_store, demo_model_dir, store_root

__all__ = ["PROJECT_ROOT", "default_store", "demo_model_dir", "store_root"]
