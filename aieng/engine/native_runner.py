"""Runs the engine's steps on the native Llama forward over the static slot cache.

The engine decides *what* a step does (which rows decode, which prompt chunks prefill); this
runner turns that into tensors, one forward for both groups (``native_llama``), and the cache
bookkeeping (``slots``). It also owns the compiled-layer state: eager until the graphs are
built (at warm-up, or in the background when compilation would exceed its budget).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

from aieng.engine.formats import FormatPlan, bf16_wins, interleaved_medians
from aieng.engine.compile_marks import compile_settings, mark_cache_dynamic
from aieng.engine.native_llama import AttentionPlan, NativeLlama, causal_decode_mask
from aieng.engine.oom import is_out_of_memory, release_cached_memory
from aieng.engine.runner import Chunk, StepLogits
from aieng.engine.slots import SlotKVCache, SlotShape, plan_slots

log = logging.getLogger("aieng.engine")


class NativeRunner:
    chunked = True

    def __init__(self, model, *, context_length: int, max_rows: int, kv_cache_bytes: int,
                 formats: FormatPlan, compile_layers: bool):
        self.device = next(model.parameters()).device
        # The bf16 copy: for the plan's steps, or for build_graphs to time the one-row graph in
        # (it is dropped there if neither uses it).
        bf16_copy = formats.uses_bf16 or (formats.measured and compile_layers)
        self.net = NativeLlama(model, bf16_copy=bf16_copy, compile_layers=compile_layers)
        self.net.build_rotary_table(context_length + 1)  # + the scratch column
        dims = self.net.dims
        shape = SlotShape(self.net.num_layers, dims.kv_heads, dims.head_dim, self.net.dtype)
        rows = plan_slots(shape, budget_bytes=kv_cache_bytes, capacity=context_length, max_rows=max_rows)
        self.cache = SlotKVCache(shape, slots=rows, capacity=context_length, device=self.device)
        mark_cache_dynamic(self.cache)
        self.formats = formats
        self.timed_one_row_bf16: bool | None = None  # what build_graphs measured, when it did
        # Decode-only steps use the compiled stack when this is True. Without a warm-up the first
        # decode compiles inline (the cold start notebook 03 shows); ``warmup`` clears it while
        # it runs the shapes eagerly and sets it again when the graphs are built.
        self.compiled_ready = compile_layers
        self.compile_failed = False
        self._compile_thread: threading.Thread | None = None
        self.splits = 0  # forwards retried in halves after running out of memory

    # -- bookkeeping the engine asks for ---------------------------------------------------------
    @property
    def max_rows(self) -> int:
        return self.cache.slots

    @property
    def one_row_bf16(self) -> bool:
        """The compiled one-row step's format: as build_graphs timed it, else the eager plan's."""
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
        if self._compile_thread is not None:
            self._compile_thread.join(timeout)

    def admit(self, request_id: str) -> None:
        self.cache.acquire(request_id)

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
        return result

    def _after_oom(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int]) -> StepLogits:
        """Out of memory: prefill and decode apart, each bisected; what fails alone is reported."""
        result = StepLogits()
        result.decode = self._decode_bisect(list(decode_tokens), first=0, failed=result.failed) if decode_tokens else None
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
            return [(c, logits[i:i + 1]) for i, c in enumerate(enders)]
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            release_cached_memory(self.device)
            self.splits += 1
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
            self.splits += 1
            if len(tokens) == 1:
                failed[self.cache.decoding[first]] = exc
                return torch.full((1, self.net.lm_head.shape[0]), float("nan"))
            half = len(tokens) // 2
            return torch.cat([self._decode_bisect(tokens[:half], first=first, failed=failed),
                              self._decode_bisect(tokens[half:], first=first + half, failed=failed)])

    def _run(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int], *, first: int):
        cache, device = self.cache, self.device
        b = len(decode_tokens)
        token_lists = [list(decode_tokens)]
        position_lists = [cache.lengths[first:first + b]]
        decode_pos = decode_mask = None
        if b:
            decode_pos = torch.tensor(position_lists[0], device=device)
            decode_mask = causal_decode_mask(decode_pos, span=max(position_lists[0]) + 1)
        prefill = {}
        if chunks:
            prefill = self._prefill_tensors(chunks, token_lists, position_lists)
        tokens = torch.tensor([t for part in token_lists for t in part], dtype=torch.long, device=device)
        positions = torch.tensor([p for part in position_lists for p in part], dtype=torch.long, device=device)
        plan = AttentionPlan(b, first, decode_pos, decode_mask, prefill.get("slots"), prefill.get("pos"),
                             prefill.get("write"), prefill.get("mask"))
        use_compiled = self.compiled and not chunks and first == 0
        bf16 = self.one_row_bf16 if use_compiled and len(tokens) == 1 else self.formats.use_bf16(len(tokens))
        hidden = self._layers(tokens, positions, plan, bf16=bf16, compiled=use_compiled)
        # Only now, with the forward done, do the rows' lengths move: a failed call changes nothing.
        for slot in range(first, first + b):
            cache.lengths[slot] += 1
        picks = list(range(b))
        for i, chunk in enumerate(chunks):
            cache.lengths[cache.slot_of[chunk.request_id]] += len(chunk.token_ids)
            if chunk.last:
                picks.append(b + i * prefill["width"] + len(chunk.token_ids) - 1)
        logits = self.net.logits(hidden[torch.tensor(picks, device=device)]) if picks else None
        decode_logits = logits[:b] if b else None
        prefill_logits = logits[b:] if logits is not None and len(picks) > b else None
        return decode_logits, prefill_logits

    def _prefill_tensors(self, chunks: Sequence[Chunk], token_lists: list, position_lists: list) -> dict:
        """Right-pad the chunks to one width; padding writes to the scratch column."""
        cache, device = self.cache, self.device
        width = max(len(c.token_ids) for c in chunks)
        slots, write, pos = [], [], []
        for chunk in chunks:
            n = len(chunk.token_ids)
            slots.append(cache.slot_of[chunk.request_id])
            row_pos = [chunk.start + j for j in range(width)]
            pos.append(row_pos)
            write.append(row_pos[:n] + [cache.capacity] * (width - n))
            token_lists.append(list(chunk.token_ids) + [0] * (width - n))
            position_lists.append([min(p, cache.capacity - 1) for p in row_pos])
        pos_t = torch.tensor(pos, device=device)
        span = max(c.start + len(c.token_ids) for c in chunks)
        mask = (torch.arange(span, device=device)[None, None, :] <= pos_t[:, :, None])[:, None]
        return {"slots": torch.tensor(slots, device=device), "pos": pos_t, "write": torch.tensor(write, device=device),
                "mask": mask, "width": width}

    def _layers(self, tokens, positions, plan, *, bf16: bool, compiled: bool) -> torch.Tensor:
        if not compiled:
            return self.net.hidden(tokens, positions, plan, self.cache, bf16=bf16, compiled=False)
        try:
            return self.net.hidden(tokens, positions, plan, self.cache, bf16=bf16, compiled=True)
        except torch._dynamo.exc.TorchDynamoException as exc:  # includes inductor's errors
            log.warning("the compiled decoder layer failed (%s); continuing eagerly", str(exc).splitlines()[0],
                        extra={"event": "engine_compile_fallback"})
            self.compile_failed = True
            return self.net.hidden(tokens, positions, plan, self.cache, bf16=bf16, compiled=False)

    # -- compilation ---------------------------------------------------------------------------
    def compile_shapes(self) -> list[tuple[int, bool]]:
        """The decode-only graphs serving uses: (rows, bf16) for one row, and for several rows in
        each format the plan uses. A graph for 2+ rows is dynamic in the row count, so each is
        built at 2 rows whatever step size its format starts at: the measured plan moves between
        restarts, and a graph built at the plan's own threshold would miss the compile cache."""
        if self.formats.measured and self.net.layers_bf16 is not None:
            shapes = [(1, False), (1, True)]  # build_graphs times both and keeps the faster
        else:
            shapes = [(1, self.one_row_bf16)]
        if self.max_rows >= 2:
            counts = [2] + [count for count, _ in self.formats.bf16_from if 2 < count <= self.max_rows]
            for bf16 in dict.fromkeys(self.formats.use_bf16(count) for count in counts):
                shapes.append((2, bf16))
        return shapes

    @torch.inference_mode()
    def build_graphs(self, progress: Callable[[str], None] = lambda detail: None) -> float:
        """Compile the layer for every decode shape, on a scratch cache (any thread may call this)."""
        if self.net.compiled_stack is None:
            return 0.0
        start = time.perf_counter()
        shapes = self.compile_shapes()
        scratch = SlotKVCache(self.cache.shape, slots=max(r for r, _ in shapes), capacity=64, device=self.device)
        mark_cache_dynamic(scratch)
        for i, (rows, bf16) in enumerate(shapes, 1):
            progress(f"compiling the decoder layer: decode {rows} row{'s' if rows > 1 else ''}, "
                     f"{'bf16' if bf16 else 'fp32'} weights ({i}/{len(shapes)})")
            for span in (6, 7):  # two lengths, so the graph is built with a symbolic length
                with compile_settings():
                    self._scratch_decode(scratch, rows, span, bf16=bf16)
        if (1, False) in shapes and (1, True) in shapes:
            self.timed_one_row_bf16 = self._faster_one_row_format(scratch)
        if not self.one_row_bf16 and not self.formats.uses_bf16:
            self.net.layers_bf16 = None  # no step uses the copy: give its memory back
        return time.perf_counter() - start

    def _scratch_decode(self, scratch: SlotKVCache, rows: int, span: int, *, bf16: bool) -> None:
        """One compiled decode step of ``rows`` rows at position ``span - 1`` on the scratch cache."""
        pos = torch.full((rows,), span - 1, device=self.device)
        plan = AttentionPlan(rows, 0, pos, causal_decode_mask(pos, span), None, None, None, None)
        tokens = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.net.hidden(tokens, pos, plan, scratch, bf16=bf16, compiled=True)

    def _faster_one_row_format(self, scratch: SlotKVCache, *, rounds: int = 5, steps: int = 5) -> bool:
        """Time the compiled one-row step in fp32 and bf16 the way ``measure_format_plan`` times
        the eager matrices (interleaved, medians, the same bar for bf16)."""
        def run(bf16: bool):
            return lambda: [self._scratch_decode(scratch, 1, 6, bf16=bf16) for _ in range(steps)]

        fp32_s, bf16_s = (s / steps for s in interleaved_medians(run(False), run(True), rounds))
        choice = bf16_wins(fp32_s, bf16_s)
        log.info("compiled one-row step: %s weights (%.2f ms fp32, %.2f ms bf16)", "bf16" if choice else "fp32",
                 fp32_s * 1e3, bf16_s * 1e3,
                 extra={"event": "engine_weight_formats", "one_row": "bf16" if choice else "fp32",
                        "fp32_ms": round(fp32_s * 1e3, 3), "bf16_ms": round(bf16_s * 1e3, 3)})
        return choice

    def compile_in_background(self, progress: Callable[[str], None], done: Callable[[float], None]) -> threading.Thread:
        """Build the graphs on another thread; the engine serves eagerly until they are ready."""
        def work():
            try:
                seconds = self.build_graphs(progress)
                self.compiled_ready = True
                done(seconds)
            except Exception as exc:  # noqa: BLE001 - a compiler failure must never stop serving
                self.compile_failed = True
                log.warning("compiling the decoder layer failed (%s: %s); serving eagerly", type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "", extra={"event": "engine_compile_fallback"})
                done(-1.0)

        self._compile_thread = threading.Thread(target=work, name="aieng-compile", daemon=True)
        self._compile_thread.start()
        return self._compile_thread
