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

Prefix caching (``keep_prefixes``): each slot records the token ids whose keys and values it
holds (``tokens``). A row that leaves keeps its tokens in its (now free) slot, so the slots no row
holds are the prefix cache, within the same budget: a new row finds the slot holding the longest
prefix of its prompt and prefills only the rest. It takes that slot when the slot keeps little
more than the prefix; else (a running row, or a free slot that also keeps another conversation's
turns) the prefix is copied into an empty slot, or the least recently used free one, whose
contents are evicted. Keys and values at a position depend only on the tokens up to it, so a reused
prefix is the prefill it replaces. A leaving decoding row is then exchanged with the last one
(two copies, not one), so what it kept survives the move.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from aieng.errors import AiengError

#: The shortest prefix looked for in other slots: shorter matches are mostly a chat template's
#: opening, not worth a copy, and must not decide which slot a new row takes (a slot keeping a long
#: system prompt would be given to the first prompt sharing its first three tokens).
MIN_REUSED_PREFIX = 16


@dataclass
class PrefixCounts:
    """Prompt tokens read from the cache (``hit``) and prefilled (``miss``), tokens dropped from
    free slots to make room (``evicted``): running totals since the cache was built, each only
    ever growing (a follower's tokens become hits when it copies them, never misses first)."""

    hit: int = 0
    miss: int = 0
    evicted: int = 0


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, at most ``limit``: a binary
    search over slice comparisons, which run in C (a Python loop over a long prompt per slot
    would cost more than the step)."""
    lo, hi = 0, min(len(a), len(b), limit)
    if hi <= 0 or a[0] != b[0]:
        return 0
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class SlotShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * element


def kv_dtype(setting: str, activations_dtype: torch.dtype, *, one_row_bf16: bool, decode_kernel: bool) -> torch.dtype:
    """The cache's dtype. ``auto``: bf16 where the one-row step was measured to be bound by memory
    (the format plan streams bf16 weights at 1 token) and aieng's kernel reads the cache (it widens
    bf16 as it loads; SDPA would copy the cache to fp32 first); else ``activations_dtype`` (fp32 on
    the CPU, also for weights kept in bf16). A bf16 cache
    halves the bytes a long-context decode reads and the memory a row holds; ``aieng eval
    --kv-cache-dtype bfloat16`` records its accuracy."""
    if setting not in ("auto", "model", "bfloat16"):
        raise AiengError(f"KV cache dtype {setting!r}: use auto, model or bfloat16", code="bad_kv_cache_dtype")
    if setting == "bfloat16" or (setting == "auto" and decode_kernel and one_row_bf16):
        return torch.bfloat16
    return activations_dtype


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
    def __init__(
        self, shape: SlotShape, *, slots: int, capacity: int, device: torch.device, keep_prefixes: bool = False
    ):
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
        self._start_prefixes(keep_prefixes)

    def _start_prefixes(self, keep_prefixes: bool) -> None:
        self.keep_prefixes = keep_prefixes
        # The ids whose keys and values slot i holds at positions 0..: a row's so far (as long as
        # ``lengths``), or what a free slot keeps for reuse (empty with ``keep_prefixes`` off).
        self.tokens: list[list[int]] = [[] for _ in range(self.slots)]
        self.used_at = [0] * self.slots  # when each slot last held a row (a step count): LRU order
        self.clock = 0
        self.counts = PrefixCounts()

    @classmethod
    def over(
        cls,
        shape: SlotShape,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        *,
        capacity: int,
        keep_prefixes: bool = False,
    ) -> SlotKVCache:
        """A cache on memory that already exists (per-layer tensors, or views of another cache's),
        every slot free and keeping nothing: how a hot swap's new engine works in the serving
        engine's KV memory (and never reads the old version's keys and values as its own)."""
        cache = cls.__new__(cls)
        cache.shape, cache.capacity, cache.slots = shape, capacity, keys[0].shape[0]
        cache.keys, cache.values = list(keys), list(values)
        cache.lengths, cache.owner = [0] * cache.slots, [None] * cache.slots
        cache.slot_of, cache.decoding = {}, []
        cache._start_prefixes(keep_prefixes)
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
        tokens = [self.tokens[self.slot_of[r]] for r in rows]
        below = [t[:start] for t in self.keys], [t[:start] for t in self.values]
        self.keys, self.values = [t[start:] for t in self.keys], [t[start:] for t in self.values]
        self.slots = keep
        self.lengths = lengths + [0] * (keep - len(rows))
        self.owner = rows + [None] * (keep - len(rows))
        self.slot_of = {r: i for i, r in enumerate(rows)}
        self.tokens = tokens + [[] for _ in range(keep - len(rows))]  # what free slots kept is given away
        self.used_at = [self.clock] * keep
        return below

    def grow(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Extend to ``keys``/``values``: tensors whose first slots are this cache's (the whole
        allocation, once the engine that held the slots above has finished). Rows keep their slots."""
        added = keys[0].shape[0] - self.slots
        assert added >= 0 and keys[0].data_ptr() == self.keys[0].data_ptr(), "grow() takes the memory this cache starts"
        self.keys, self.values, self.slots = list(keys), list(values), keys[0].shape[0]
        self.lengths += [0] * added
        self.owner += [None] * added
        self.tokens += [[] for _ in range(added)]  # the slots of the engine that finished keep nothing
        self.used_at += [0] * added

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def free(self) -> int:
        return self.slots - len(self.slot_of)

    def prefix_counts(self) -> dict[str, int] | None:
        """``Runner.prefix_counts``: the running totals and the tokens kept now; None when off."""
        if not self.keep_prefixes:
            return None
        return {**asdict(self.counts), "kept": self.kept_tokens}

    @property
    def kept_tokens(self) -> int:
        """Tokens free slots keep for reuse: the prefix cache's occupancy."""
        return sum(len(self.tokens[slot]) for slot in range(self.slots) if self.owner[slot] is None)

    def acquire(self, request_id: str, prompt: list[int] = ()) -> int:
        """A free slot for a new row (in prefill), above the decoding rows, holding the longest
        prefix of ``prompt`` the cache has (never all of it: the last prompt token must run to give
        the row's first logits). Returns the slot; its ``lengths`` entry is that prefix's length,
        the prompt tokens not to prefill."""
        free = [slot for slot in range(len(self.decoding), self.slots) if self.owner[slot] is None]
        if not free:
            raise AiengError(f"all {self.slots} KV cache slots are in use", code="kv_cache_full")
        prompt = list(prompt)
        cached, source = self._longest_prefix(prompt) if self.keep_prefixes else (0, None)
        others = [slot for slot in free if slot != source]
        if source is not None and self.owner[source] is None and (cached >= len(self.tokens[source]) - 1 or not others):
            target = source  # a free slot keeping little more than that prefix: taken as it is, no copy
        elif not self.keep_prefixes:
            target = free[0]  # the lowest: where start_decoding puts the row, so nothing moves
        else:  # an empty slot, else the least recently used: what it keeps is evicted
            target = min(others, key=lambda slot: (bool(self.tokens[slot]), self.used_at[slot]))
            if source is None:  # nothing worth a copy: whatever the chosen slot itself holds
                cached = common_prefix(self.tokens[target], prompt, len(prompt) - 1)
                source = target if cached else None
            else:  # the source keeps the rest of what it holds (another conversation's turns), and is fresh again
                self.clock += 1
                self.used_at[source] = self.clock
        self.counts.evicted += len(self.tokens[target]) - (cached if source == target else 0)
        if source is not None and source != target:
            self._copy_prefix(source, target, cached)
        self.tokens[target] = self.tokens[target][:cached] if source == target else list(prompt[:cached])
        self.owner[target], self.slot_of[request_id], self.lengths[target] = request_id, target, cached
        self.counts.hit += cached
        return target

    def _longest_prefix(self, prompt: list[int]) -> tuple[int, int | None]:
        """(length, slot) of the longest prefix of ``prompt`` any slot holds, from
        ``MIN_REUSED_PREFIX`` tokens, or from all of a shorter prompt but its last token (a
        repeated short prompt is a whole hit, however few its tokens); a free slot wins ties (it
        may need no copy)."""
        whole = len(prompt) - 1  # the last prompt token always runs
        shortest = min(MIN_REUSED_PREFIX, max(whole, 1))
        best, source = shortest - 1, None
        for slot in range(self.slots):
            n = common_prefix(self.tokens[slot], prompt, whole)
            if n > best or (n == best and source is not None and self.owner[slot] is None):
                best, source = n, slot
        return (best, source) if source is not None else (0, None)

    @torch.inference_mode()
    def _copy_prefix(self, source: int, target: int, n: int, start: int = 0) -> None:
        """Positions ``start``..``n`` of every layer's keys and values, from one slot to another."""
        for t in self.keys + self.values:
            t[target, :, start:n] = t[source, :, start:n]

    def extend_from(self, request_id: str, source_id: str, n: int) -> None:
        """A prefilling row takes positions up to ``n`` from another row that has written them
        (the same prompt opening, ``shared_prefill``): counted as hits, not misses."""
        slot, source = self.slot_of[request_id], self.slot_of[source_id]
        done = self.lengths[slot]
        assert done <= n <= self.lengths[source], (done, n, self.lengths[source])
        self._copy_prefix(source, slot, n, start=done)
        self.tokens[slot] = self.tokens[source][:n]
        self.lengths[slot] = n
        self.counts.hit += n - done

    def wrote(self, slot: int, token_ids: list[int], *, prompt: bool = False) -> None:
        """A forward wrote the keys and values of ``token_ids`` at the slot's next positions
        (``prompt``: a prefilled chunk, counted as prefix cache misses)."""
        self.lengths[slot] += len(token_ids)
        self.counts.miss += len(token_ids) if prompt else 0
        if self.keep_prefixes:
            self.tokens[slot].extend(token_ids)

    def fork(self, parent: str, child: str) -> None:
        """A new row whose cache is a copy of ``parent``'s (its prompt): one copy of the valid
        prefix per layer, where a prefill would run the whole model over the prompt again."""
        source, n = self.slot_of[parent], self.lengths[self.slot_of[parent]]
        target = self.acquire(child)  # no prompt: an empty slot, else the least recently used
        if target != source:
            self._copy_prefix(source, target, n)
        self.lengths[target] = n
        self.tokens[target] = list(self.tokens[source])

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
        self.clock += 1
        self.used_at[slot] = self.clock
        # Freed first: the swap below copies one way, or both where the slot keeps its tokens.
        self.owner[slot], self.lengths[slot] = None, 0
        if not self.keep_prefixes:
            self.tokens[slot] = []
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
        held = [slot for slot in (a, b) if self.owner[slot] is not None or self.tokens[slot]]
        n = max(self.lengths[a], self.lengths[b], len(self.tokens[a]), len(self.tokens[b]))
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
        self.tokens[a], self.tokens[b] = self.tokens[b], self.tokens[a]
        self.used_at[a], self.used_at[b] = self.used_at[b], self.used_at[a]
        for slot in (a, b):
            if self.owner[slot] is not None:
                self.slot_of[self.owner[slot]] = slot


def prefill_tensors(cache: SlotKVCache, chunks, device) -> dict:
    """A step's prompt chunks (``runner.Chunk``) as the tensors of its ``AttentionPlan``, in their
    rows of ``cache``. Right-pads the chunks to one width, at least 2 (a width of 1 would need a graph of its
    own); padding writes to the scratch column and is never attended by a real token."""
    width = max(2, max(len(c.token_ids) for c in chunks))
    slots, write, pos, tokens, rotary_pos = [], [], [], [], []
    for chunk in chunks:
        n = len(chunk.token_ids)
        slots.append(cache.slot_of[chunk.request_id])
        row_pos = [chunk.start + j for j in range(width)]
        pos.append(row_pos)
        write.append(row_pos[:n] + [cache.capacity] * (width - n))
        tokens.append(list(chunk.token_ids) + [0] * (width - n))
        rotary_pos.append([min(p, cache.capacity - 1) for p in row_pos])
    pos_t = torch.tensor(pos, device=device)
    # At least 2 keys too: a one-token prompt's span of 1 would be a graph of its own. The extra
    # column is masked for the real token (its position is 0) and only padding attends it.
    span = max(2, max(c.start + len(c.token_ids) for c in chunks))
    mask = (torch.arange(span, device=device)[None, None, :] <= pos_t[:, :, None])[:, None]
    return {
        "slots": torch.tensor(slots, device=device),
        "pos": pos_t,
        "write": torch.tensor(write, device=device),
        "mask": mask,
        "width": width,
        "tokens": torch.tensor(tokens, dtype=torch.long, device=device),
        "rotary_pos": torch.tensor(rotary_pos, device=device),
    }
