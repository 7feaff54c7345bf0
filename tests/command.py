"""Run an ``aieng`` command the way the console script does, in this process.

``aieng(*args)`` calls ``aieng.cli.main.main(argv)`` with stdout and stderr captured and returns
what ``subprocess.run`` would: the exit status (argparse's ``SystemExit`` included) and both
streams. A fresh interpreter per command costs seconds of imports (torch, transformers) and tests
nothing the command's own code does not; the entry point itself (``python -m aieng`` and its
exit status) is checked once, in a subprocess, by tests/cli/test_cli.py.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from unittest import mock


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


def aieng(*args: str, store: Path | str | None = None, env: dict[str, str] | None = None) -> CommandResult:
    """``aieng [--store STORE] ARGS...`` in this process; ``env`` is laid over ``os.environ`` for the call."""
    from aieng.cli.main import main

    argv = [*(["--store", str(store)] if store else []), *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if env:
            stack.enter_context(mock.patch.dict(os.environ, env))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help exits 0, a usage error 2
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CommandResult(code, out.getvalue(), err.getvalue())
