"""Which runner serves a model: the native Llama-family forward where it is exact, else transformers'.

``serving_path`` decides from the config, and a configuration it refuses raises here. The
native runner (static slot cache, chunked prefill, weight formats, a compiled decoder layer)
serves the configurations it names ``native`` unless it is switched off or int8 quantization
replaced the Linear layers it reads; the rest get ``HFRunner``, transformers' own forward, which
is exact for every configuration either path serves. A hot swap's successor takes its format plan
and compiled graphs from the engine it replaces (``succession.donor_runner``).
"""

from __future__ import annotations

import logging

from aieng.engine.hf.runner import HFRunner
from aieng.engine.native.succession import donor_runner
from aieng.engine.serving_path import check_servable
from aieng.loading.device import compute_dtype
from aieng.model_facts import kv_bytes_per_token

log = logging.getLogger("aieng.engine")


def make_runner(model, *, config, context_length: int, pad_id: int, replacing=None, kv_from_replaced: bool = False):
    """``config``: the engine's ``EngineConfig``; ``replacing``: the engine a hot swap replaces."""
    path = check_servable(model.config, context_length=context_length)
    why_not = None if path.kind == "native" else path.reason
    if why_not is None and not config.native:
        why_not = "native forward switched off"
    if why_not is None and config.quantize_int8:
        why_not = "int8 dynamic quantization replaces the Linear layers the native forward reads"
    if why_not is None:
        from aieng.engine.native.formats import format_plan
        from aieng.engine.native.runner import NativeRunner

        donor = donor_runner(replacing, model)
        formats = donor.formats if donor is not None else format_plan(config.weight_formats, model)
        weight = next(model.parameters())
        per_token = kv_bytes_per_token(model.config, compute_dtype(weight.dtype, weight.device).itemsize)
        budget = config.kv_cache_bytes or per_token * (context_length + 1) * config.max_rows
        runner = NativeRunner(
            model,
            context_length=context_length,
            max_rows=config.max_rows,
            kv_cache_bytes=budget,
            formats=formats,
            compile_layers=config.compile,
            decode_attention=config.decode_attention,
            kv_cache_dtype=config.kv_cache_dtype,
            prefix_cache=config.prefix_cache,
            graphs_from=donor,
            cache_from_replaced=kv_from_replaced,
        )
        runner.path_reason = path.reason  # why this forward: engine_decisions reports it
        return runner
    log.info("serving with the transformers forward: %s", why_not, extra={"event": "engine_runner"})
    runner = HFRunner(model, pad_id=pad_id, max_rows=config.max_rows, compile=config.compile)
    runner.path_reason = why_not
    return runner
