"""A bound on oneDNN's caches of built kernels, so a long-running server's memory stays flat.

oneDNN builds a kernel (a "primitive") for each matrix shape it multiplies and keeps it, keyed by
shape, in two caches: oneDNN's own (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's, PyTorch's
wrapper around it (``LRU_CACHE_CAPACITY``). Both hold 1,024 entries by default. Every step with a
new row count (a decode batch of another size, a prefill chunk of another length) adds one entry
per weight shape, and on this package's request path every oneDNN multiply (bf16 ``F.linear`` on a
CPU with AVX-512, and the packed weights of ``packed_weights``) sees the row count change all the
time. Each entry holds some hundreds of KiB whatever the model's size (its generated code and
working buffers), so unbounded even the demo model grows by hundreds of MiB as row counts come
and go (``tests/engine/test_onednn_caches.py`` measures a process's growth with and without the
bound).

A bound costs a rebuild when an evicted row count comes back. Too high, and the caches still
fill after the warm-up, which the load test's memory check (``rss_growth``, the ``load_test``
runbook) catches; too low, and steps rebuild the kernels they just evicted, which ``aieng bench
serve`` shows as lost throughput. ``CAPACITY`` sits between: six to eight row counts of a
model's four or five weight shapes (with the demo's formats at fp32, ``formats.MIN_SAVING_S``).

Both variables are read when the process makes its first oneDNN call, so this must run before
that: ``aieng serve`` calls it first thing, and ``Engine`` at construction for in-process use
(a no-op on a process that already multiplied through oneDNN). A value the user set wins.
"""

from __future__ import annotations

import os

CAPACITY = 32
VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches(capacity: int = CAPACITY, environ=os.environ) -> dict[str, str]:
    """Set both cache bounds to ``capacity`` where the environment leaves them unset; returns
    the bounds in force (for the start-up log)."""
    for name in VARIABLES:
        environ.setdefault(name, str(capacity))
    return {name: environ[name] for name in VARIABLES}
