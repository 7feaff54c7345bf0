"""Run an ops runbook with papermill and keep the executed copy as the audit record.

The executed notebook carries the parameters, every cell's output and per-cell timings; it is
written under ``runbooks/runs/`` (git-ignored) with a timestamped name, whether the run passed
or failed, so the record of a failed deploy is kept too.
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from pathlib import Path

RUNBOOKS_DIR = Path(__file__).resolve().parents[2] / "runbooks"


def execute(
    runbook: str | Path,
    parameters: dict,
    *,
    runs_dir: Path | None = None,
    kernel_name: str = "python3",
    cwd: Path | None = None,
) -> Path:
    """Execute ``runbook`` (a name in ``runbooks/`` or a path) and return the executed copy's path.

    Raises papermill's ``PapermillExecutionError`` when a cell fails (a pre-check or a
    verification assert); the executed copy is still written and its path is on the error as
    ``executed_path``.
    """
    import papermill

    source = Path(runbook)
    if not source.suffix:
        source = RUNBOOKS_DIR / f"{runbook}.ipynb"
    runs_dir = Path(runs_dir) if runs_dir else source.parent / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    output = runs_dir / f"{stamp}-{source.stem}.ipynb"
    try:
        papermill.execute_notebook(
            str(source),
            str(output),
            parameters=parameters,
            kernel_name=kernel_name,
            cwd=str(cwd) if cwd else None,
            progress_bar=False,
        )
    except Exception as exc:
        exc.executed_path = output
        raise
    return output


def command_line(runbook: str, **parameters) -> str:
    """The papermill command that runs ``runbook`` with ``parameters`` (empty and None ones left
    out), ready to paste: what a pre-check prints so that the real run, or an undo, is one copy away."""
    given = {key: value for key, value in parameters.items() if value not in ("", None)}
    args = " ".join(f"-p {key} {shlex.quote(str(value))}" for key, value in given.items())
    runs = f"runbooks/runs/$(date -u +%Y%m%dT%H%M%SZ)-{runbook}.ipynb"
    return f"papermill runbooks/{runbook}.ipynb {runs} {args}"
