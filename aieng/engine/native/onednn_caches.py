"""A bound on oneDNN's caches of built kernels, so a long-running server's memory stays flat.

oneDNN builds a kernel (a "primitive") for each matrix shape it multiplies and keeps it, keyed by
shape, in two caches: oneDNN's own (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's, PyTorch's
wrapper around it (``LRU_CACHE_CAPACITY``). Both hold 1,024 entries by default. Every step with a
new row count (a decode batch of another size, a prefill chunk of another length) adds one entry
per weight shape, and on this package's request path every oneDNN multiply (bf16 ``F.linear`` on a
CPU with AVX-512, and the packed weights of ``packed_weights``) sees the row count change all the
time. Measured on the smollm2-135m shape's four fused projections, one thread, row counts 1-299
(tests/engine/test_onednn_caches.py does it with half as many): packed fp32 grew the process by
763 MiB with the defaults, 35 MiB with both caches at 16. Each entry holds some hundreds of KiB
whatever the model's size (its generated code and working buffers), so even the demo model grew.

A bound costs a rebuild when an evicted row count comes back (about 1 ms per weight shape on the
smollm2-135m shape). Served, that does not show: the smollm2-135m shape at 32 concurrent streams,
64 tokens each, bounds at 1,024 then 32 alternated twice: 526 / 648 / 683 / 677 tok/s, and at one
stream 74.1 / 71.2 / 75.7 / 77.4. A micro-benchmark that draws a new row count from 20-32 for
every step shows the worst case: 120 matrices a step, packed bf16, 2 threads, 23.5-25.1 ms with
the defaults, 29.2-29.8 ms at 32, 22.5-27.6 ms at 64. The demo model shows the other side: at 64
the load-test runbook's memory check still failed 3 times in 3 (+9.4% to +10.5% over 50
requests: the caches filled after the warm-up); at 32 it failed 1 time in 4 (+5.8%), at 16
it passed 6 in 6. With the demo's formats at fp32 (``formats.MIN_SAVING_S``) it passes at 32. So ``CAPACITY`` is 32:
six to eight row counts of a model's four or five weight shapes.

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
