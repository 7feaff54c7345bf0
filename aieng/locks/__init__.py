"""The dependency locks in ``locks/``: how they are read, generated, checked and audited.

Every file a set-up installs is pinned with its sha256 and installed with ``pip --require-hashes``.
torch is locked apart from the rest because the same release comes as two different files:

- ``server.lock``: what the server runs on, without torch (``make serve``);
- ``dev.lock``: that plus the workbook, the test suite and the lock tools (``make test``, ``make lab``);
- ``torch-cpu.lock``: torch's CPU build from PyTorch's CPU wheel index (a CPU host's choice);
- ``torch-registry.lock``: torch as the package registry serves it, with the CUDA libraries its
  Linux build requires (a GPU host's choice, and a CPU host's fallback where PyTorch's index is
  out of reach);
- ``pip.lock``: the pip that installs the rest.

``scripts/install-deps.sh`` picks the torch lock for the host; ``make lock`` regenerates all of
them (:mod:`aieng.locks.generate`); :mod:`aieng.locks.registry_check` proves the registry still
serves the locked files; :mod:`aieng.locks.audit` checks them for known vulnerabilities.
"""

from pathlib import Path

#: Where the lock files live, relative to the repository root.
LOCKS_DIR = Path("locks")
