"""Which weight format a step runs in, chosen by measuring this machine, not assumed.

At batch 1 a decode step reads every weight once for very little arithmetic: it is bound by how
fast the weights stream from memory, so bf16 weights (half the bytes) can be up to twice as fast.
At batch 32 the same step is bound by arithmetic, and on CPUs without native bf16 matrix units
(AVX2, most AVX-512 parts before Sapphire Rapids) bf16 matrix multiplies are much slower than
fp32 (the realistic-shape issue measured 116 tok/s bf16 vs 379 fp32 at batch 32 on this machine's
kind). So the engine keeps both copies (the bf16 one costs half the fp32 weights' memory) and
runs a step in bf16 when it has at most ``bf16_max_tokens`` tokens.

``choose_bf16_max_tokens`` times one decoder layer's matrices at 1..64 tokens in both formats
(about a second) and returns the largest token count up to which bf16 was faster at every count;
0 means bf16 never wins here (the demo model: its steps are dominated by Python, and the casts
only add work), and then no bf16 copy is made. Quality: ``aieng eval --dtype bfloat16`` records
the accuracy of bf16 weights beside fp32 in the manifest.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time

import psutil
import torch
import torch.nn.functional as F

log = logging.getLogger("aieng.engine")

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def choose_bf16_max_tokens(model, *, repeats: int = 5) -> int:
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return 0  # on a GPU, or already in a reduced precision: one format
    layer = model.model.layers[0]
    matrices = [m.weight.detach() for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                            layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                                            layer.mlp.down_proj)]
    copy_bytes = sum(p.numel() for p in model.parameters()) * 2
    if copy_bytes > psutil.virtual_memory().available * 0.5:
        log.info("no bf16 weight copy: it would take %.0f MiB of %.0f MiB available", copy_bytes / 2**20,
                 psutil.virtual_memory().available / 2**20, extra={"event": "engine_weight_formats"})
        return 0
    halves = [m.to(torch.bfloat16) for m in matrices]
    best = 0
    timings = {}
    with torch.inference_mode():
        for tokens in TOKEN_COUNTS:
            fp32_s, bf16_s = _time_pair(matrices, halves, tokens, repeats)
            timings[tokens] = (round(fp32_s * 1e6), round(bf16_s * 1e6))
            if bf16_s >= fp32_s:
                break
            best = tokens
    log.info("weight formats: bf16 for steps of at most %d tokens, fp32 above (one layer's matrices, µs fp32/bf16 "
             "by tokens: %s)", best, timings, extra={"event": "engine_weight_formats", "bf16_max_tokens": best})
    return best


def _time_pair(fp32: list[torch.Tensor], bf16: list[torch.Tensor], tokens: int, repeats: int) -> tuple[float, float]:
    """Median seconds of all the matrices at ``tokens`` rows, fp32 and bf16, runs interleaved."""
    x32 = {w.shape[1]: torch.randn(tokens, w.shape[1]) for w in fp32}
    runs32, runs16 = [], []
    for _ in range(repeats + 1):  # the first pair warms the kernels up and is dropped
        for weights, runs in ((fp32, runs32), (bf16, runs16)):
            start = time.perf_counter()
            for w in weights:
                F.linear(x32[w.shape[1]].to(w.dtype), w).float()
            runs.append(time.perf_counter() - start)
    return statistics.median(runs32[1:]), statistics.median(runs16[1:])


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
