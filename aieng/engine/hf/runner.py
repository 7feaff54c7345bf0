"""Runs the engine's steps on the transformers model's own forward, over a dynamic cache: the
configurations ``serving_path`` sends here (the native forward would not be exact for them).

Whole prompts only (no chunking: the model's forward takes one length per call), prefilled
together, left-padded, then merged into the running batch (``kv_batch.KVBatch``) after this step's
decode. The whole forward is compiled (``compiled.CompiledForward``) when compilation is on.
Out of memory: the prefill group and the decoding rows are bisected (``oom.bisect_on_oom``).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence

import torch

from aieng.engine.decisions import dtype_name
from aieng.engine.hf.compiled import CompiledForward
from aieng.engine.hf.kv_batch import KVBatch, left_pad
from aieng.engine.hf_model import cache_kwarg
from aieng.engine.oom import bisect_on_oom
from aieng.engine.runner import Chunk, RunnerChoices, StepLogits


class HFRunner:
    """``runner.Runner`` on transformers' own forward (see the module doc)."""

    kind = "transformers"
    chunked = False
    path_reason = "transformers' own forward"
    awaits_cache = False  # its cache grows with the rows in flight: a hot swap hands nothing over
    shared_graphs = False

    def __init__(self, model, *, pad_id: int, max_rows: int, compile: bool):
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.max_rows = max_rows
        self.forward_fn = CompiledForward(model, enabled=compile)
        self._cache_kwarg = cache_kwarg(model)
        self.batch: KVBatch | None = None  # the decoding rows' cache; row i is decoding[i]
        self.decoding: list[str] = []
        self._joined: list[tuple[str, KVBatch, int]] = []  # prefilled this step: (id, batch, row)
        self.oom_splits = {"prefill": 0, "decode": 0}  # batches retried in halves after running out of memory

    @property
    def compiled(self) -> bool:
        return self.forward_fn.active

    @property
    def compile_status(self) -> str:
        """compiled (graphs are built lazily, at warm-up), eager, or failed (fell back to eager)."""
        if self.forward_fn.fallbacks:
            return "failed"
        return "compiled" if self.forward_fn.active else "eager"

    @property
    def planned_rows(self) -> int:
        return self.max_rows

    @property
    def compiling_inline(self) -> bool:
        return self.forward_fn.compiling

    def compile_counts(self) -> dict[str, int]:
        return {"rewarms": self.forward_fn.rewarms, "compile_fallbacks": self.forward_fn.fallbacks}

    def wait_for_compile(self, timeout: float | None = None) -> None:
        pass  # compiles in the calling thread

    def warm_up(self, run_shapes, shapes, progress, *, budget_s: float | None, compile: bool) -> None:
        """The shapes through the compiled whole-model forward (that *is* the compilation), then
        guard evaluation off for the warmed graphs (``CompiledForward.mark_warm``)."""
        run_shapes(shapes, "compiling the forward" if self.compiled else "eager")
        if self.compiled:
            self.forward_fn.mark_warm()

    def one_row_step_bytes(self) -> int:
        """Every parameter but an untied input embedding, of which a step reads one row per token."""
        embedding = self.model.get_input_embeddings().weight
        tied = embedding is self.model.get_output_embeddings().weight
        skip = 0 if tied else embedding.nbytes
        return sum(p.nbytes for p in self.model.parameters()) - skip

    def describe(self, config) -> RunnerChoices:
        dtype = dtype_name(next(self.model.parameters()).dtype)
        weights = "int8 dynamic (AIENG_INT8=1)" if config.quantize_int8 else f"{dtype} as loaded"
        return RunnerChoices(
            weights,
            f"{dtype}, transformers' dynamic cache, up to {self.max_rows} rows",
            "grows with each row's tokens; the native forward's static cache needs its own forward",
            "the model's own attention",
            "on: the whole forward, built at warm-up" if config.compile else "off (AIENG_COMPILE=0)",
        )

    def admit(self, request_id: str, prompt_ids: Sequence[int]) -> int:
        return 0  # no prefix cache: every prompt is prefilled whole

    def prefix_counts(self) -> dict[str, int] | None:
        return None

    def extend_prefix(self, request_id: str, source_id: str, n: int) -> None:
        raise NotImplementedError("the transformers forward prefills whole prompts: nothing to share")

    def fork(self, parent: str, children: Sequence[str]) -> None:
        """``children`` take ``parent``'s prefilled row: the merge copies it once per child."""
        _, batch, row = next(j for j in self._joined if j[0] == parent)
        self._joined += [(child, batch, row) for child in children]

    def start_decoding(self, request_ids: Sequence[str]) -> None:
        """Merge the named rows prefilled this step into the batch (one merge per prefill group)."""
        wanted = set(request_ids)
        groups: dict[int, tuple[KVBatch, list[tuple[int, str]]]] = {}
        for rid, batch, row in self._joined:
            if rid in wanted:
                groups.setdefault(id(batch), (batch, []))[1].append((row, rid))
        self._joined = [j for j in self._joined if j[0] not in wanted]
        for batch, members in groups.values():
            rows = [row for row, _ in members]
            part = batch if rows == list(range(batch.size)) else batch.select(rows)
            self.batch = KVBatch.merge(self.batch, part)
            self.decoding += [rid for _, rid in members]

    def release(self, request_ids: Sequence[str]) -> None:
        doomed = set(request_ids)
        self._joined = [j for j in self._joined if j[0] not in doomed]
        keep = [i for i, rid in enumerate(self.decoding) if rid not in doomed]
        if len(keep) < len(self.decoding):
            self.decoding = [self.decoding[i] for i in keep]
            self.batch = self.batch.select(keep) if keep else None

    def decoding_ids(self) -> list[str]:
        return list(self.decoding)

    @torch.inference_mode()
    def forward(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int]) -> StepLogits:
        result = StepLogits()
        start = time.perf_counter()
        if chunks:
            assert all(c.start == 0 and c.last for c in chunks), "the transformers runner prefills whole prompts"
            pieces = bisect_on_oom(
                list(chunks),
                self._prefill_group,
                combine=operator.add,
                fail_one=lambda chunk, exc: [(chunk.request_id, None, exc)],
                device=self.device,
                phase="prefill",
                on_split=self._count_split,
            )
            logits = []
            for request_id, row_logits, exc in pieces:
                if exc is not None:
                    result.failed[request_id] = exc
                else:
                    logits.append(row_logits)
            result.prefill = torch.stack(logits) if logits else None
            result.prefill_s = time.perf_counter() - start
        middle = time.perf_counter()
        if decode_tokens:
            result.decode = self._decode(list(decode_tokens), result.failed)
            result.decode_s = time.perf_counter() - middle
        return result

    def _count_split(self, phase: str) -> None:
        self.oom_splits[phase] += 1

    def _prefill_group(self, chunks: Sequence[Chunk]) -> list:
        from transformers import DynamicCache

        # Compiled: a 1-token prompt gets one pad column (length 1 would be a graph of its own).
        input_ids, mask = left_pad([c.token_ids for c in chunks], self.pad_id, min_length=2 if self.compiled else 1)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)  # [n, L]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, L]

        # A fresh cache on every try (a failed call may have half-filled one), built without the
        # model's config: every layer then keeps every column, which KVBatch's select, merge and
        # trim rely on, and sliding-window layers get their window from the mask (in cache
        # columns) instead. DynamicCache(config=...) would give them layers that keep only the
        # last window of columns: every serving_table row with sliding-window layers fails on it.
        def inputs() -> dict:
            pass_mask = self.compiled or bool((mask == 0).any())
            return dict(
                input_ids=input_ids,
                attention_mask=mask if pass_mask else None,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: DynamicCache()},
            )

        out, used = self._call_model(inputs)
        batch = KVBatch(used[self._cache_kwarg], mask, mask.sum(-1)).make_contiguous()
        self._joined += [(c.request_id, batch, i) for i, c in enumerate(chunks)]
        return [(c.request_id, out.logits[i, -1, :], None) for i, c in enumerate(chunks)]

    def _decode(self, tokens: list[int], failed: dict) -> torch.Tensor:
        batch, ids = self.batch, self.decoding

        def attempt(indices: Sequence[int]):
            part = batch if len(indices) == len(ids) else batch.select(list(indices))
            return [(part, self._decode_rows(part, [tokens[i] for i in indices]), list(indices))]

        def fail_one(index: int, exc: BaseException):
            failed[ids[index]] = exc
            return [(None, torch.full((1, self.model.config.vocab_size), float("nan")), [index])]

        parts = bisect_on_oom(
            range(len(ids)),
            attempt,
            combine=operator.add,
            fail_one=fail_one,
            device=self.device,
            phase="decode",
            on_split=self._count_split,
        )
        if len(parts) > 1:  # split on out of memory: rebuild the batch from the halves that ran
            kept = [(b, idx) for b, _, idx in parts if b is not None]
            merged = None
            for b, _ in kept:
                merged = KVBatch.merge(merged, b)
            order = [i for _, idx in kept for i in idx]
            self.batch, self.decoding = merged, [ids[i] for i in order]
            by_index = {i: row for (_, lg, idx) in parts for i, row in zip(idx, lg)}
            return torch.stack([by_index[i] for i in range(len(ids))])
        return parts[0][1]

    def _decode_rows(self, batch: KVBatch, tokens: list[int]) -> torch.Tensor:
        snapshot = [(layer.keys, layer.values) for layer in batch.cache.layers]

        def undo() -> None:  # a failed call may have appended to some layers: put them back
            for layer, (keys, values) in zip(batch.cache.layers, snapshot):
                layer.keys, layer.values = keys, values

        def inputs() -> dict:
            input_ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=self.device)  # [B, 1]
            mask = None
            # Compiled: every step carries a mask, so one graph serves padded and unpadded batches.
            if batch.padded or self.compiled:
                ones = torch.ones((batch.size, 1), dtype=batch.mask.dtype, device=batch.mask.device)
                mask = torch.cat([batch.mask, ones], dim=1)  # [B, T+1]
            return dict(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=batch.next_pos[:, None],
                use_cache=True,
                **{self._cache_kwarg: batch.cache},
            )

        out, _ = self._call_model(inputs, undo=undo)
        batch.append_column()
        return out.logits[:, -1, :]

    def _call_model(self, make_inputs, *, undo=lambda: None):
        """The forward; a compiler failure the compile state recovers from is retried (after ``undo``)."""
        while True:
            inputs = make_inputs()
            try:
                return self.forward_fn(**inputs), inputs
            except Exception as exc:
                undo()
                if not self.forward_fn.recover(exc):
                    raise
