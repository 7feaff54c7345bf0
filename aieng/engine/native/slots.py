"""A static key/value cache: one preallocated slot per row, written in place every step.

Why: the dynamic cache (``kv_batch``) concatenates the whole batch's keys and values when a row
joins and grows every layer's tensor by a column per step, so a step at 1,000 tokens of context
copies the cache it attends to. Here the memory is allocated once, at start-up, from a budget
(``EngineConfig.kv_cache_bytes``): ``slots`` rows × ``capacity`` tokens, per layer

    keys, values: [slots, kv_heads, capacity + 1, head_dim]

(the extra column is scratch, where the padding of a batched prefill chunk is written). A step
writes each row's new keys and values at its position and attends to ``[:, :, :length]`` views.

Layout rule that keeps decode free of copies: **the decoding rows are slots ``0..B-1``**, in the
engine's row order, so the decode attention reads the views ``keys[:B, :, :L]``. Rows still being
prefilled sit in higher slots. A row that starts decoding is swapped into slot ``B``; a row that
leaves is replaced by the last decoding row (``swap``: two rows' valid prefixes copied, not the
batch). ``decoding`` lists the request ids in slot order; the engine reads its rows from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aieng.errors import AiengError


@dataclass(frozen=True)
class SlotShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * element


def kv_dtype(setting: str, model_dtype: torch.dtype, *, one_row_bf16: bool, decode_kernel: bool) -> torch.dtype:
    """The cache's dtype. ``auto``: bf16 where the one-row step was measured to be bound by memory
    (the format plan streams bf16 weights at 1 token) and aieng's kernel reads the cache (it widens
    bf16 as it loads; SDPA would copy the cache to fp32 first); else the model's. A bf16 cache
    halves the bytes a long-context decode reads and the memory a row holds; ``aieng eval
    --kv-cache-dtype bfloat16`` records its accuracy."""
    if setting not in ("auto", "model", "bfloat16"):
        raise AiengError(f"KV cache dtype {setting!r}: use auto, model or bfloat16", code="bad_kv_cache_dtype")
    if setting == "bfloat16" or (setting == "auto" and decode_kernel and one_row_bf16):
        return torch.bfloat16
    return model_dtype


def plan_slots(shape: SlotShape, *, budget_bytes: int, capacity: int, max_rows: int) -> int:
    """How many rows of ``capacity`` tokens the budget holds (at most ``max_rows``, at least 1)."""
    per_row = shape.bytes_per_token() * (capacity + 1)
    rows = min(max_rows, budget_bytes // per_row)
    if rows < 1:
        need = per_row / 2**20
        raise AiengError(
            f"the KV cache budget ({budget_bytes / 2**20:.0f} MiB) does not hold one row of "
            f"{capacity} tokens ({need:.0f} MiB): raise AIENG_KV_CACHE_MB or serve a shorter context",
            code="kv_budget_too_small",
        )
    return int(rows)


class SlotKVCache:
    def __init__(self, shape: SlotShape, *, slots: int, capacity: int, device: torch.device):
        self.shape = shape
        self.slots = slots
        self.capacity = capacity  # tokens a row may hold (prompt + generated)
        size = (slots, shape.kv_heads, capacity + 1, shape.head_dim)
        # Inference tensors: the compiled graphs are built for them (``build_graphs`` runs
        # under inference mode, on a scratch cache), and a tensor's inference-ness is part of a graph.
        # Zeroed, and so claimed, up front: the budget is the process's KV memory from the first
        # second (a host short of it fails at start-up, not under load), and attention, which reads
        # masked positions past a row's length (0 × NaN is NaN), never meets uninitialised memory.
        # (Zeroing lazily as rows grow was tried: the first row to reach a long context then paid
        # for zeroing every other row's slot to that length inside one step: a stall of every stream.)
        with torch.inference_mode():
            self.keys = [torch.zeros(size, dtype=shape.dtype, device=device) for _ in range(shape.layers)]
            self.values = [torch.zeros(size, dtype=shape.dtype, device=device) for _ in range(shape.layers)]
        self.lengths = [0] * slots  # valid tokens per slot
        self.owner: list[str | None] = [None] * slots  # request id per slot
        self.slot_of: dict[str, int] = {}
        self.decoding: list[str] = []  # ids of the decoding rows: slot i holds decoding[i]

    @classmethod
    def over(
        cls, shape: SlotShape, keys: list[torch.Tensor], values: list[torch.Tensor], *, capacity: int
    ) -> SlotKVCache:
        """A cache on memory that already exists (per-layer tensors, or views of another cache's),
        every slot free: how a hot swap's new engine works in the serving engine's KV memory."""
        cache = cls.__new__(cls)
        cache.shape, cache.capacity, cache.slots = shape, capacity, keys[0].shape[0]
        cache.keys, cache.values = list(keys), list(values)
        cache.lengths, cache.owner = [0] * cache.slots, [None] * cache.slots
        cache.slot_of, cache.decoding = {}, []
        return cache

    @torch.inference_mode()
    def keep_only_rows(self, *, extra: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Give up every slot but those the rows in it hold (and ``extra`` more, for queued
        requests): the rows move to the top of the allocation, decoding rows first and in order,
        this cache becomes a view of those top slots, and the views of the slots below are
        returned for another cache to use. Call between steps, on the thread that steps it."""
        rows = list(self.decoding) + sorted((r for r in self.slot_of if r not in self.decoding), key=self.slot_of.get)
        keep = min(self.slots, len(rows) + extra)
        start = self.slots - keep
        if rows:
            order = [self.slot_of[r] for r in rows]
            n = max(self.lengths[slot] for slot in order)
            index = torch.tensor(order, device=self.keys[0].device)
            for t in self.keys + self.values:
                if n:  # gathered (a copy) first, so targets may overlap the sources
                    t[start : start + len(rows), :, :n] = t[:, :, :n].index_select(0, index)
        lengths = [self.lengths[self.slot_of[r]] for r in rows]
        below = [t[:start] for t in self.keys], [t[:start] for t in self.values]
        self.keys, self.values = [t[start:] for t in self.keys], [t[start:] for t in self.values]
        self.slots = keep
        self.lengths = lengths + [0] * (keep - len(rows))
        self.owner = rows + [None] * (keep - len(rows))
        self.slot_of = {r: i for i, r in enumerate(rows)}
        return below

    def grow(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Extend to ``keys``/``values``: tensors whose first slots are this cache's (the whole
        allocation, once the engine that held the slots above has finished). Rows keep their slots."""
        added = keys[0].shape[0] - self.slots
        assert added >= 0 and keys[0].data_ptr() == self.keys[0].data_ptr(), "grow() takes the memory this cache starts"
        self.keys, self.values, self.slots = list(keys), list(values), keys[0].shape[0]
        self.lengths += [0] * added
        self.owner += [None] * added

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def free(self) -> int:
        return self.slots - len(self.slot_of)

    def acquire(self, request_id: str) -> int:
        """A free slot for a new row (in prefill), above the decoding rows."""
        for slot in range(len(self.decoding), self.slots):
            if self.owner[slot] is None:
                self.owner[slot], self.slot_of[request_id], self.lengths[slot] = request_id, slot, 0
                return slot
        raise AiengError(f"all {self.slots} KV cache slots are in use", code="kv_cache_full")

    @torch.inference_mode()
    def fork(self, parent: str, child: str) -> None:
        """A new row whose cache is a copy of ``parent``'s (its prompt): one copy of the valid
        prefix per layer, where a prefill would run the whole model over the prompt again."""
        source, n = self.slot_of[parent], self.lengths[self.slot_of[parent]]
        target = self.acquire(child)
        for t in self.keys + self.values:
            t[target, :, :n] = t[source, :, :n]
        self.lengths[target] = n

    def start_decoding(self, request_id: str) -> None:
        """The row's prompt is in the cache: move it to slot B and count it among the decoding rows."""
        target = len(self.decoding)
        self.swap(self.slot_of[request_id], target)
        self.decoding.append(request_id)

    def release(self, request_id: str) -> None:
        """Free the row's slot, keeping the decoding rows packed in slots 0..B-1."""
        slot = self.slot_of.pop(request_id, None)
        if slot is None:
            return
        self.owner[slot], self.lengths[slot] = None, 0  # freed first: the swap below copies one way
        if request_id in self.decoding:
            last = len(self.decoding) - 1
            self.swap(slot, last)  # the last decoding row fills the hole
            self.decoding[slot] = self.decoding[last]
            self.decoding.pop()

    @torch.inference_mode()
    def swap(self, a: int, b: int) -> None:
        """Exchange the contents of two slots. Only valid prefixes are copied, and only one way
        when one slot is free (its contents are dropped): a row leaving or starting to decode next
        to a free slot costs one copy, not two (at long context, a step's worth of memory traffic)."""
        if a == b:
            return
        held = [slot for slot in (a, b) if self.owner[slot] is not None]
        n = max(self.lengths[a], self.lengths[b])
        if n and len(held) == 2:
            index = torch.tensor([b, a], device=self.keys[0].device)
            for tensors in (self.keys, self.values):
                for t in tensors:
                    t[[a, b], :, :n] = t[:, :, :n].index_select(0, index)
        elif n and held:
            source = held[0]
            target = b if source == a else a
            for t in self.keys + self.values:
                t[target, :, :n] = t[source, :, :n]
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]
        self.owner[a], self.owner[b] = self.owner[b], self.owner[a]
        for slot in (a, b):
            if self.owner[slot] is not None:
                self.slot_of[self.owner[slot]] = slot
