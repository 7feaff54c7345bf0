"""Runs the engine's steps on the native Llama forward over the static slot cache.

The engine decides *what* a step does (which rows decode, which prompt chunks prefill); this
runner turns that into tensors, one forward for both groups (``native_llama``), and the cache
bookkeeping (``slots``). It also owns the compiled-layer state: eager until the graphs are
built (at warm-up, or in the background when compilation would exceed its budget).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from aieng.engine.decisions import dtype_name, kv_why, setting_said
from aieng.engine.native import graphs, kernels
from aieng.engine.native.compile_marks import mark_cache_dynamic
from aieng.engine.native.formats import FormatPlan
from aieng.engine.native.graphs import GraphShape
from aieng.engine.native.llama import AttentionPlan, causal_decode_mask
from aieng.engine.native.model import NativeLlama
from aieng.engine.native.slots import SlotKVCache, SlotShape, kv_dtype, plan_slots, prefill_tensors
from aieng.engine.oom import is_out_of_memory, release_cached_memory
from aieng.engine.runner import Chunk, RunnerChoices, StepLogits
from aieng.model_facts import head_dim

log = logging.getLogger("aieng.engine")


class NativeRunner:
    """``runner.Runner`` on the native forward (see the module doc)."""

    kind = "native"
    chunked = True
    path_reason = "the native forward implements every option of this config"

    def __init__(
        self,
        model,
        *,
        context_length: int,
        max_rows: int,
        kv_cache_bytes: int,
        formats: FormatPlan,
        compile_layers: bool,
        decode_attention: str = "auto",
        kv_cache_dtype: str = "model",
        prefix_cache: bool = False,
        graphs_from: NativeRunner | None = None,
        cache_from_replaced: bool = False,
    ):
        """``graphs_from``: the runner of the engine this one replaces (same weight layout, and
        ``formats`` is its plan): its bf16 choice, timing and compiled stack are taken as they are.
        ``cache_from_replaced``: allocate no KV cache; a hot swap hands this runner part of
        ``graphs_from``'s, then all of it (``succession``). ``decode_attention``: ``auto`` decodes
        with aieng's CPU kernel when it builds here, ``sdpa`` with PyTorch's attention.
        ``kv_cache_dtype``: ``model`` (the activations' dtype: fp32 on the CPU), ``bfloat16``, or
        ``auto`` (``kv_dtype``).
        ``prefix_cache``: free slots keep what their rows held and new rows reuse it (``slots``)."""
        self.device = next(model.parameters()).device
        # The bf16 copy: for the plan's steps, or for build_graphs to time the one-row graph in
        # (it is dropped there if neither uses it).
        bf16_copy = formats.uses_bf16 or (formats.measured and compile_layers)
        if graphs_from is not None:
            bf16_copy = graphs_from.net.layers_bf16 is not None
        matvec_kernel = self.device.type == "cpu" and kernels.load() is None  # steps of a few rows
        decode_kernel = matvec_kernel and decode_attention == "auto" and kernels.supports(head_dim(model.config))
        packed_from = formats.packed_from if self.device.type == "cpu" else 0
        self.net = NativeLlama(
            model,
            bf16_copy=bf16_copy,
            compile_layers=compile_layers,
            fp32_copy=formats.uses_fp32,
            decode_kernel=decode_kernel,
            matvec_kernel=matvec_kernel,
            packed_from=packed_from,
            packed_formats=frozenset(formats.formats_from(packed_from)),
            quantized_copy=formats.quantized if formats.quantized_rows and matvec_kernel else "",
        )
        self.net.build_rotary_table(context_length + 1)  # + the scratch column
        dims = self.net.dims
        shape = SlotShape(
            self.net.num_layers,
            dims.kv_heads,
            dims.head_dim,
            kv_dtype(kv_cache_dtype, self.net.dtype, one_row_bf16=formats.use_bf16(1), decode_kernel=decode_kernel),
        )
        donor = graphs_from.cache if graphs_from is not None and cache_from_replaced else None
        self.awaits_cache = donor is not None and donor.shape == shape and donor.capacity == context_length
        # The rows it serves once warm (the graphs are built for them): a successor holds 0 until the swap.
        self.planned_rows = donor.slots if self.awaits_cache else 0
        if self.awaits_cache:  # 0 slots until succession.take_cache
            empty = [t[:0] for t in donor.keys], [t[:0] for t in donor.values]
            self.cache = SlotKVCache.over(shape, *empty, capacity=context_length, keep_prefixes=prefix_cache)
        else:
            rows = plan_slots(shape, budget_bytes=kv_cache_bytes, capacity=context_length, max_rows=max_rows)
            self.cache = SlotKVCache(
                shape, slots=rows, capacity=context_length, device=self.device, keep_prefixes=prefix_cache
            )
            mark_cache_dynamic(self.cache)
            self.planned_rows = rows
        log.info(
            "KV cache: %d rows of %d tokens in %s (%.0f MiB); decode attention: %s",
            self.planned_rows,
            context_length,
            str(shape.dtype).removeprefix("torch."),
            shape.bytes_per_token() * (context_length + 1) * self.planned_rows / 2**20,
            "aieng's CPU kernel" if decode_kernel else "PyTorch SDPA",
            extra={
                "event": "engine_kv_cache",
                "rows": self.planned_rows,
                "dtype": str(shape.dtype),
                "decode_kernel": decode_kernel,
            },
        )
        self.formats = formats
        self.timed_one_row_bf16: bool | None = None  # what build_graphs measured, when it did
        self.successor = graphs_from is not None  # its process already ran every kernel this one runs
        self.shared_graphs = self.successor and self.net.share_graphs(graphs_from.net)
        if self.shared_graphs:
            self.timed_one_row_bf16 = graphs_from.timed_one_row_bf16
        # Steps with a graph (``compile_shapes``) use the compiled stack when this is True. Without
        # a warm-up the first such step compiles inline (the cold start notebook 03 shows);
        # ``warmup`` clears it while it runs the shapes eagerly and sets it again when the graphs
        # are built.
        self.compiled_ready = compile_layers
        self.compile_failed = False
        self.head_s = 0.0  # the last step's output projection, seconds (StepLogits.head_s)
        self.compile_thread: threading.Thread | None = None
        self.oom_splits = {"prefill": 0, "decode": 0}  # forwards retried in halves after running out of memory
        self.steps_by_graph: Counter[GraphShape | None] = Counter()  # forwards run per graph (None: eagerly)

    # -- bookkeeping the engine asks for ---------------------------------------------------------
    @property
    def max_rows(self) -> int:
        return self.cache.slots

    @property
    def compiling_inline(self) -> bool:
        return False  # steps never compile: shapes without a graph run eagerly (``_graph_for``)

    def compile_counts(self) -> dict[str, int]:
        return {"rewarms": 0, "compile_fallbacks": int(self.compile_failed)}

    def describe(self, config) -> RunnerChoices:
        one_row = self.quantized_format or ("bf16" if self.one_row_bf16 else "fp32")
        weights = (
            f"{self.formats.describe()}; one-row steps in {one_row} "
            f"({setting_said('AIENG_WEIGHT_FORMATS', config.weight_formats)})"
        )
        cache, kernel = self.cache, self.net.dims.decode_kernel
        kv_bytes = cache.shape.bytes_per_token() * (cache.capacity + 1) * self.planned_rows
        kv = (
            f"{dtype_name(cache.shape.dtype)}, {self.planned_rows} rows x {cache.capacity} tokens "
            f"({kv_bytes / 2**20:.0f} MiB)"
        )
        return RunnerChoices(
            weights,
            kv,
            kv_why(config, cache.shape.dtype, self.net.dtype, kernel),
            "aieng's CPU kernel" if kernel else "PyTorch SDPA",
            "on: the decoder layer, one graph per step shape, built at warm-up"
            if config.compile
            else "off (AIENG_COMPILE=0)",
        )

    def one_row_step_bytes(self) -> int:
        return self.net.step_bytes(bf16=self.one_row_bf16, quantized=bool(self.quantized_rows))

    @property
    def quantized_rows(self) -> int:
        """Steps of up to this many tokens read the quantised copy (0: there is none)."""
        return self.formats.quantized_rows if self.net.layers_quantized is not None else 0

    @property
    def quantized_format(self) -> str:
        """``int8`` or ``int4`` when one-row steps read a quantised copy, else ""."""
        return self.formats.quantized if self.quantized_rows else ""

    @property
    def one_row_bf16(self) -> bool:
        """The compiled one-row step's float format: as build_graphs timed it, else the eager plan's
        (False when it reads quantised weights)."""
        if self.quantized_rows:
            return False
        return self.formats.use_bf16(1) if self.timed_one_row_bf16 is None else self.timed_one_row_bf16

    @property
    def compiled(self) -> bool:
        return self.compiled_ready and not self.compile_failed

    @property
    def compile_status(self) -> str:
        """eager | compiling | compiled | failed."""
        if self.net.compiled_stack is None:
            return "eager"
        if self.compile_failed:
            return "failed"
        return "compiled" if self.compiled_ready else "compiling"

    def wait_for_compile(self, timeout: float | None = None) -> None:
        if self.compile_thread is not None:
            self.compile_thread.join(timeout)

    def admit(self, request_id: str, prompt_ids: Sequence[int]) -> int:
        return self.cache.lengths[self.cache.acquire(request_id, list(prompt_ids))]

    def prefix_counts(self) -> dict[str, int] | None:
        return self.cache.prefix_counts()

    def extend_prefix(self, request_id: str, source_id: str, n: int) -> None:
        self.cache.extend_from(request_id, source_id, n)

    def fork(self, parent: str, children: Sequence[str]) -> None:
        """Rows for ``children`` holding copies of ``parent``'s cache (n > 1 shares the prefill)."""
        for child in children:
            self.cache.fork(parent, child)

    def start_decoding(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self.cache.start_decoding(request_id)

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self.cache.release(request_id)

    def decoding_ids(self) -> list[str]:
        return list(self.cache.decoding)

    # -- the step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int]) -> StepLogits:
        """Decode ``decode_tokens`` (one per decoding row, slot order) and prefill ``chunks``."""
        start = time.perf_counter()
        result = StepLogits()
        try:
            result.decode, result.prefill = self._run(chunks, decode_tokens, first=0)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            release_cached_memory(self.device)
            result = self._after_oom(chunks, decode_tokens)
        elapsed = time.perf_counter() - start
        result.prefill_s = elapsed if chunks else None
        result.decode_s = elapsed if decode_tokens else None
        result.head_s = None if result.failed else self.head_s
        return result

    def _after_oom(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int]) -> StepLogits:
        """Out of memory: prefill and decode apart, each bisected; what fails alone is reported."""
        result = StepLogits()
        result.decode = (
            self._decode_bisect(list(decode_tokens), first=0, failed=result.failed) if decode_tokens else None
        )
        rows = [lg for _, lg in self._prefill_bisect(list(chunks), result.failed)]
        result.prefill = torch.cat(rows) if rows else None
        return result

    def _prefill_bisect(self, chunks: list[Chunk], failed: dict) -> list[tuple[Chunk, torch.Tensor]]:
        """(chunk, its logits row) for the prompt-ending chunks that ran; failures go to ``failed``."""
        if not chunks:
            return []
        try:
            _, logits = self._run(chunks, (), first=0)
            enders = [c for c in chunks if c.last]
            return [(c, logits[i : i + 1]) for i, c in enumerate(enders)]
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            release_cached_memory(self.device)
            self.oom_splits["prefill"] += 1
            if len(chunks) == 1:
                failed[chunks[0].request_id] = exc
                return []
            half = len(chunks) // 2
            return self._prefill_bisect(chunks[:half], failed) + self._prefill_bisect(chunks[half:], failed)

    def _decode_bisect(self, tokens: list[int], *, first: int, failed: dict) -> torch.Tensor:
        try:
            logits, _ = self._run((), tokens, first=first)
            return logits
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            release_cached_memory(self.device)
            self.oom_splits["decode"] += 1
            if len(tokens) == 1:
                failed[self.cache.decoding[first]] = exc
                return torch.full((1, self.net.lm_head.shape[0]), float("nan"))
            half = len(tokens) // 2
            return torch.cat(
                [
                    self._decode_bisect(tokens[:half], first=first, failed=failed),
                    self._decode_bisect(tokens[half:], first=first + half, failed=failed),
                ]
            )

    def _run(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int], *, first: int):
        cache, device = self.cache, self.device
        b = len(decode_tokens)
        decode_pos = decode_mask = tokens = None
        if b:
            lengths = cache.lengths[first : first + b]
            decode_pos = torch.tensor(lengths, device=device)
            decode_mask = causal_decode_mask(decode_pos, span=max(lengths) + 1)
            tokens = torch.tensor(list(decode_tokens), dtype=torch.long, device=device)
        prefill = prefill_tensors(self.cache, chunks, device) if chunks else {}
        plan = AttentionPlan(
            b,
            first,
            decode_pos,
            decode_mask,
            prefill.get("slots"),
            prefill.get("pos"),
            prefill.get("write"),
            prefill.get("mask"),
        )
        n_tokens = b + len(chunks) * prefill.get("width", 0)
        graph = self._graph_for(b, len(chunks), n_tokens, first)
        bf16 = graph.bf16 if graph else self.formats.use_bf16(n_tokens)
        quantized = bool(graph.quantized) if graph else n_tokens <= self.quantized_rows
        self.steps_by_graph[graph] += 1
        compiled = graph is not None
        hidden = self._layers(
            plan,
            tokens,
            prefill.get("tokens"),
            prefill.get("rotary_pos"),
            bf16=bf16,
            quantized=quantized,
            compiled=compiled,
        )
        # Only now, with the forward done, do the rows' lengths move: a failed call changes nothing.
        for slot, token in zip(range(first, first + b), decode_tokens):
            cache.wrote(slot, [token])
        picks = list(range(b))
        for i, chunk in enumerate(chunks):
            cache.wrote(cache.slot_of[chunk.request_id], chunk.token_ids, prompt=True)
            if chunk.last:
                picks.append(b + i * prefill["width"] + len(chunk.token_ids) - 1)
        head_start = time.perf_counter()
        logits = None
        if picks:
            head_bf16 = self.one_row_bf16 if len(picks) == 1 else self.formats.use_bf16(len(picks))
            quantized = len(picks) <= self.quantized_rows
            rows = hidden[torch.tensor(picks, device=device)]
            logits = self.net.logits(rows, bf16=head_bf16, compiled=self.compiled, quantized=quantized)
        self.head_s = time.perf_counter() - head_start
        decode_logits = logits[:b] if b else None
        prefill_logits = logits[b:] if logits is not None and len(picks) > b else None
        return decode_logits, prefill_logits

    def _graph_for(self, rows: int, chunks: int, tokens: int, first: int) -> GraphShape | None:
        """The compiled graph this step runs in, or None to run it eagerly: when nothing is
        compiled, for an out-of-memory split (``first`` > 0), and for the shapes no graph is built
        for (several prompts prefilled alone, one decode row beside a chunk): building one inline
        would stall every stream for as long as compiling takes."""
        if not self.compiled or first or not (rows or chunks == 1):
            return None
        bf16 = self.one_row_bf16 if tokens == 1 else self.formats.use_bf16(tokens)
        shape = GraphShape.of(rows, chunks, bf16, self.quantized_format if tokens <= self.quantized_rows else "")
        return shape if shape in self.graph_shapes else None

    def _layers(self, plan, *tokens, bf16: bool, quantized: bool, compiled: bool) -> torch.Tensor:
        if not compiled:
            return self.net.hidden(plan, self.cache, *tokens, bf16=bf16, quantized=quantized, compiled=False)
        try:
            return self.net.hidden(plan, self.cache, *tokens, bf16=bf16, quantized=quantized, compiled=True)
        except torch._dynamo.exc.TorchDynamoException as exc:  # includes inductor's errors
            log.warning(
                "the compiled decoder layer failed (%s); continuing eagerly",
                str(exc).splitlines()[0],
                extra={"event": "engine_compile_fallback"},
            )
            self.compile_failed = True
            return self.net.hidden(plan, self.cache, *tokens, bf16=bf16, quantized=quantized, compiled=False)

    # -- compilation (graphs.py) ----------------------------------------------------------------
    @functools.cached_property
    def graph_shapes(self) -> frozenset[GraphShape]:
        """``compile_shapes`` as a set, for the per-step lookup (the plan is fixed at start-up)."""
        return frozenset(self.compile_shapes())

    def compile_shapes(self) -> list[GraphShape]:
        return graphs.compile_shapes(self)

    def build_graphs(self, progress: Callable[[str], None] = lambda detail: None) -> float:
        return graphs.build_graphs(self, progress)

    def warm_up(self, run_shapes, shapes, progress, *, budget_s: float | None, compile: bool) -> None:
        graphs.warm_up(self, run_shapes, shapes, progress, budget_s, compile)
