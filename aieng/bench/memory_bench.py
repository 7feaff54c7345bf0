"""``aieng bench memory``: how fast this machine reads memory, the ceiling of a batch-1 decode step.

At batch 1 a decode step reads every weight once and does two flops per weight it reads, so the
step is bound by how fast the cores stream memory, not by arithmetic: ``weight bytes / read
bandwidth`` is the shortest a step can be, and its inverse the most tokens per second one stream
can get. A batch-1 result means little until it is said as a share of that ceiling.

Two readings, with the threads the engine uses, over buffers far larger than the caches:

- ``read``: a sum over the buffer, next to no arithmetic per byte: the read bandwidth the machine
  gives torch's threads (the ceiling). Two readers sum it, torch's ``sum`` and aieng's
  ``stream_read`` (read as the matrix-vector kernel reads, with prefetch), and the faster counts:
  a general reduction can read slower than a product does, and a ceiling below what a kernel
  reaches would say nothing.
- ``matvec``: the bf16 matrix-vector product a batch-1 linear layer runs (``F.linear`` of one row),
  over a weight of the same size: how much of the ceiling torch's own kernel reaches.
- ``kernel``: the same product by aieng's kernel (``torch.ops.aieng.matvec``), which the native
  forward runs for steps of a few rows: how much of the ceiling the served step's products reach
  (None where the kernels cannot be built on this host).

Both are medians over repeats, run in turn (one round of each, then the next, after a dropped
warm-up round) so a machine that drifts mid-way biases neither; the share is their ratio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GB = 1e9


@dataclass(frozen=True)
class MemoryBandwidth:
    """The machine's read bandwidth, and torch's and aieng's bf16 matrix-vector products over it."""

    threads: int
    buffer_bytes: int
    repeats: int
    read_gb_s: float
    matvec_gb_s: float
    kernel_gb_s: float | None = None

    @property
    def matvec_share(self) -> float:
        return self.matvec_gb_s / self.read_gb_s

    @property
    def kernel_share(self) -> float | None:
        return None if self.kernel_gb_s is None else self.kernel_gb_s / self.read_gb_s

    def ceiling_tok_s(self, step_bytes: int) -> float:
        """The most batch-1 tokens per second a step that reads ``step_bytes`` can reach here."""
        return self.read_gb_s * GB / step_bytes

    def share(self, tok_s: float, step_bytes: int) -> float:
        """A measured batch-1 rate as a share of the ceiling for its step's bytes."""
        return tok_s / self.ceiling_tok_s(step_bytes)

    def to_dict(self) -> dict:
        return {**asdict(self), "matvec_share": self.matvec_share, "kernel_share": self.kernel_share}


def measure_bandwidth(
    threads: int | None = None, buffer_mib: int = 512, repeats: int = 7, progress=None
) -> MemoryBandwidth:
    """Measure ``read``, ``matvec`` and ``kernel`` over ``buffer_mib`` MiB with ``threads`` torch
    threads (default: torch's current count, which is what a served worker uses)."""
    import torch
    import torch.nn.functional as F

    if buffer_mib < 1 or repeats < 1:
        raise ValueError("buffer_mib and repeats are >= 1")
    from aieng.engine.native import kernels
    from aieng.engine.native.formats import interleaved_medians

    previous = torch.get_num_threads()
    threads = threads or previous
    torch.set_num_threads(threads)
    try:
        size = buffer_mib * 2**20
        cols = 4096
        with torch.inference_mode():
            buffer = torch.ones(size // 4, dtype=torch.float32)
            weight = torch.randn(size // 2 // cols, cols, dtype=torch.bfloat16)
            row = torch.randn(1, cols, dtype=torch.bfloat16)
            runs = [buffer.sum, lambda: F.linear(row, weight)]
            if kernels.load() is None:
                row32 = row.float()
                runs += [lambda: torch.ops.aieng.stream_read(buffer), lambda: torch.ops.aieng.matvec(row32, weight)]
            if progress:
                progress("allocated")
            read_s, matvec_s, *kernel_runs = interleaved_medians(*runs, rounds=repeats)
            stream_s, kernel_s = kernel_runs or (read_s, None)
            read_s = min(read_s, stream_s)
            if progress:
                progress("measured")
    finally:
        torch.set_num_threads(previous)
    return MemoryBandwidth(
        threads=threads,
        buffer_bytes=size,
        repeats=repeats,
        read_gb_s=size / read_s / GB,
        matvec_gb_s=size / matvec_s / GB,
        kernel_gb_s=size / kernel_s / GB if kernel_s else None,
    )


def report(result: MemoryBandwidth, model: tuple[str, int] | None = None) -> list[str]:
    """The lines ``aieng bench memory`` prints; with ``model`` (label, parameters) its ceilings."""
    lines = [
        f"read bandwidth, {result.threads} threads, {result.buffer_bytes / 2**20:.0f} MiB buffer: "
        f"{result.read_gb_s:.1f} GB/s (median of {result.repeats})",
        f"torch's bf16 matrix-vector product (F.linear of one row): {result.matvec_gb_s:.1f} GB/s, "
        f"{result.matvec_share:.0%} of the read bandwidth",
        (
            f"aieng's bf16 matrix-vector kernel (what a served step of 1-4 rows runs): {result.kernel_gb_s:.1f} GB/s, "
            f"{result.kernel_share:.0%} of the read bandwidth"
            if result.kernel_gb_s is not None
            else "aieng's matrix-vector kernel: not built on this host (the log of `aieng serve` says why)"
        ),
    ]
    if model is not None:
        label, parameters = model
        # int8 and int4 with their fp32 scales (a group of 128 int8 weights, of 32 int4 ones)
        for name, element_bytes in (("float32", 4), ("bfloat16", 2), ("int8", 1 + 4 / 128), ("int4", 0.5 + 4 / 32)):
            step = parameters * element_bytes
            lines.append(
                f"{label} in {name} reads {step / 1e6:.0f} MB a step: at most "
                f"{result.ceiling_tok_s(step):.0f} tokens/s at batch 1 here"
            )
    return lines
