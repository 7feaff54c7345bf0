"""Which weight format a step runs in, chosen by measuring this machine, not assumed.

A decode step at batch 1 reads every weight once for little arithmetic: it is bound by how fast
the weights stream from memory, where bf16 (half the bytes) can win. At batch 32 it is bound by
arithmetic, where the winner depends on the CPU: without bf16 matrix units (AVX2) bf16 matrix
multiplies are far slower than fp32, while a CPU with AMX runs bf16 faster than fp32 at batch 32
and can lose at batch 1 (the realistic-shape issue's notes have both measurements). No single
format wins everywhere, and which wins where is a property of the machine, so the engine
measures it.

``measure_format_plan`` times the decoder layers' matrices at 1..64 tokens in both formats (runs
interleaved, medians): over the layers in turn up to 8 tokens, where a step waits on memory and
one layer alone would be served from the cache, and one layer above, where arithmetic decides. It
returns a ``FormatPlan``: for each measured token count, the faster format; a step uses the
plan's choice for the largest measured count not above its own token count.

Those eager timings say nothing about the compiled one-row step, whose matrix-vector kernel
inductor generates (``native_llama.streamed_matvec``): the runner times that graph in both
formats when it builds it. The engine keeps a bf16 copy of the layers only while some step may
use it (it costs half the fp32 weights' memory). Quality: ``aieng eval --dtype bfloat16`` records
the accuracy of bf16 weights beside fp32 in the manifest.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aieng import container_limits

log = logging.getLogger("aieng.engine")

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64)
STREAMED_TOKENS = 8  # up to here a step is bound by memory bandwidth (measured over many layers)
STREAMED_BYTES = 1 << 30  # fp32 bytes of matrices timed for those counts: beyond any CPU cache


@dataclass(frozen=True)
class FormatPlan:
    """``bf16_from``: (token count, use bf16) from that count up, ascending; empty = fp32 always.
    ``measured``: chosen by measurement (``auto``) with room for a bf16 copy, so the compiled
    one-row graph may time both formats for itself (``NativeRunner.build_graphs``)."""

    bf16_from: tuple[tuple[int, bool], ...] = ()
    measured: bool = False

    @classmethod
    def fixed(cls, bf16: bool) -> "FormatPlan":
        return cls(((1, bf16),))

    def use_bf16(self, tokens: int) -> bool:
        choice = False
        for count, bf16 in self.bf16_from:
            if count > tokens:
                break
            choice = bf16
        return choice

    @property
    def uses_bf16(self) -> bool:
        return any(bf16 for _, bf16 in self.bf16_from)

    def describe(self) -> str:
        if not self.uses_bf16:
            return "fp32 weights for every step"
        parts = [f"{'bf16' if bf16 else 'fp32'} from {count} token{'s' if count > 1 else ''}"
                 for i, (count, bf16) in enumerate(self.bf16_from) if i == 0 or bf16 != self.bf16_from[i - 1][1]]
        return ", ".join(parts)


def format_plan(choice: str, model) -> FormatPlan:
    """``float32`` | ``bfloat16`` | ``auto`` (measured on this machine) as a plan for ``model``."""
    if choice == "float32":
        return FormatPlan()
    if choice == "bfloat16":
        return FormatPlan.fixed(True)
    if choice == "auto":
        return measure_format_plan(model)
    raise ValueError(f"weight formats {choice!r}: use auto, float32 or bfloat16")


def measure_format_plan(model, *, repeats: int = 5) -> FormatPlan:
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return FormatPlan()  # on a GPU, or already in a reduced precision: one format
    copy_bytes = sum(p.numel() for p in model.parameters()) * 2
    available = container_limits.limits().memory_available_bytes  # a container's limit, when tighter
    if copy_bytes > available * 0.5:
        log.info("no bf16 weight copy: it would take %.0f MiB of %.0f MiB available", copy_bytes / 2**20,
                 available / 2**20, extra={"event": "engine_weight_formats"})
        return FormatPlan()
    # Up to STREAMED_TOKENS a step is bound by how fast the weights arrive, and one layer's matrices
    # would sit in the last-level cache (300 MiB on this project's CPU) where fp32 looks as cheap
    # as bf16: those counts are timed over the layers in turn, as a step reads them. Above it the
    # arithmetic decides, and one layer is enough.
    per_layer = [_layer_matrices(layer) for layer in model.model.layers]
    layer_bytes = sum(m.numel() * m.element_size() for m in per_layer[0])
    streamed_layers = max(1, min(len(per_layer), STREAMED_BYTES // layer_bytes))
    fp32 = [m for matrices in per_layer[:streamed_layers] for m in matrices]
    timings, plan = {}, []
    with torch.inference_mode():
        bf16 = [m.to(torch.bfloat16) for m in fp32]
        for tokens in TOKEN_COUNTS:
            count = len(fp32) if tokens <= STREAMED_TOKENS else len(per_layer[0])
            fp32_s, bf16_s = _time_pair(fp32[:count], bf16[:count], tokens, repeats)
            timings[tokens] = (round(fp32_s * 1e6), round(bf16_s * 1e6))
            plan.append((tokens, bf16_wins(fp32_s, bf16_s)))
    result = FormatPlan(tuple(plan), measured=True)
    log.info("weight formats: %s (µs fp32/bf16 by tokens, %d layers' matrices up to %d tokens, one layer's above: %s)",
             result.describe(), streamed_layers, STREAMED_TOKENS, timings,
             extra={"event": "engine_weight_formats", "plan": result.describe()})
    return result


def bf16_wins(fp32_s: float, bf16_s: float) -> bool:
    """bf16 must win clearly (by 5%): it costs accuracy."""
    return bf16_s < 0.95 * fp32_s


def interleaved_medians(fp32_run: Callable[[], object], bf16_run: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median seconds of each run over ``rounds`` alternating pairs, after one pair that warms the
    kernels up and is dropped (alternating, so a machine that drifts mid-way biases neither)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds + 1):
        for run, runs in ((fp32_run, times[0]), (bf16_run, times[1])):
            start = time.perf_counter()
            run()
            runs.append(time.perf_counter() - start)
    return statistics.median(times[0][1:]), statistics.median(times[1][1:])


def _layer_matrices(layer) -> list[torch.Tensor]:
    return [m.weight.detach() for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                        layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                                        layer.mlp.down_proj)]


def _time_pair(fp32: list[torch.Tensor], bf16: list[torch.Tensor], tokens: int, repeats: int) -> tuple[float, float]:
    """Median seconds of all the matrices at ``tokens`` rows, fp32 and bf16."""
    x32 = {w.shape[1]: torch.randn(tokens, w.shape[1]) for w in fp32}

    def run(weights):
        return lambda: [F.linear(x32[w.shape[1]].to(w.dtype), w).float() for w in weights]

    return interleaved_medians(run(fp32), run(bf16), repeats)


@contextlib.contextmanager
def bf16_linears(model):
    """Run the decoder layers' Linear layers as the engine's bf16 format does: inputs and weights
    rounded to bf16, the product back in fp32 (the LM head stays fp32, as in the engine).
    For ``aieng eval --dtype bfloat16``: it measures the accuracy of exactly what serving runs."""
    patched = []
    for layer in model.model.layers:
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                half = module.weight.detach().to(torch.bfloat16)

                def forward(x, module=module, half=half):
                    out = F.linear(x.to(torch.bfloat16), half).to(x.dtype)
                    return out if module.bias is None else out + module.bias

                module.forward = forward
                patched.append(module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
