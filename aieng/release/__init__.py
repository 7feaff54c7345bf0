"""Release and rollback on a running service.

- ``promotion``: promote through the release gate (``aieng.evaluation.gate``), with a recorded
  override.
- ``decision``: the automatic rollback decision over a window of live metrics.
"""
