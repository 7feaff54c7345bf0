"""The running batch's key/value cache, right-aligned so rows can join and leave between steps.

Layout: every row's newest token sits in the last column; shorter rows are left-padded, and
``mask`` [B, T] marks real tokens (1) and padding (0). That alignment is what makes continuous
batching cheap on top of transformers' ``DynamicCache``:

- a row **leaves** by index-selecting the batch dimension, then columns that are padding in every
  remaining row are trimmed from the left;
- rows **join** by left-padding the shorter of the two caches to the same length and
  concatenating along the batch dimension;
- a decode step appends one column for everybody.

Positions are per row (``next_pos``: how many real tokens each row has), so rotary embeddings
see each row's true positions whatever its padding.

transformers' cache internals (``cache.layers[i].keys``/``.values``) are touched only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class KVBatch:
    cache: DynamicCache
    mask: torch.Tensor  # [B, T] long, 1 = real token
    next_pos: torch.Tensor  # [B] long, position id of each row's next token

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    _padded: bool | None = None  # cached: the check is a tensor reduction and a sync, once per step otherwise

    @property
    def padded(self) -> bool:
        """True when some row has left padding (then the model needs the attention mask)."""
        if self._padded is None:
            self._padded = bool((self.mask == 0).any())
        return self._padded

    def select(self, indices: list[int]) -> KVBatch:
        """A new batch with only ``indices`` (in that order), trimmed of all-padding columns."""
        index = torch.tensor(indices, dtype=torch.long, device=self.mask.device)
        cache = DynamicCache()
        cache.layers = []
        for layer in self.cache.layers:
            cache.layers.append(
                _layer_like(layer, layer.keys.index_select(0, index), layer.values.index_select(0, index))
            )
        selected = KVBatch(cache, self.mask.index_select(0, index), self.next_pos.index_select(0, index))
        selected.trim()
        return selected

    def trim(self) -> None:
        """Drop leading columns that are padding in every row (keeps T = the longest row)."""
        if self.size == 0:
            return
        real_columns = self.mask.any(dim=0).nonzero()
        first = int(real_columns[0]) if len(real_columns) else self.length
        if first > 0:
            self._padded = None
            self.mask = self.mask[:, first:].contiguous()
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]
            self.make_contiguous()

    def make_contiguous(self) -> KVBatch:
        """Give every cache tensor the plain contiguous layout.

        A compiled prefill returns the cache in whatever layout inductor chose, and ``trim`` leaves
        slices; decode steps are always handed contiguous tensors, so a compiled decode graph (which
        is specialised on strides) sees one layout whatever the batch's history. The copy happens
        only on prefill and trim, and costs nothing when the layout is already plain.
        """
        for layer in self.cache.layers:
            layer.keys = layer.keys.contiguous()
            layer.values = layer.values.contiguous()
        return self

    def append_column(self) -> None:
        """Account for the token a decode step just wrote for every row."""
        ones = torch.ones((self.size, 1), dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        self.next_pos = self.next_pos + 1

    @staticmethod
    def merge(first: KVBatch | None, second: KVBatch) -> KVBatch:
        """Concatenate two batches along the batch dimension, left-padding the shorter one."""
        if first is None or first.size == 0:
            return second
        length = max(first.length, second.length)
        a, b = first._left_pad(length), second._left_pad(length)
        cache = DynamicCache()
        cache.layers = [
            _layer_like(la, torch.cat([la.keys, lb.keys], dim=0), torch.cat([la.values, lb.values], dim=0))
            for la, lb in zip(a.cache.layers, b.cache.layers)
        ]
        return KVBatch(cache, torch.cat([a.mask, b.mask], dim=0), torch.cat([a.next_pos, b.next_pos], dim=0))

    def _left_pad(self, length: int) -> KVBatch:
        extra = length - self.length
        if extra == 0:
            return self
        for layer in self.cache.layers:
            # Each gets zeros of its own shape: some caches hold values narrower than keys
            # (multi-head latent attention, e.g. DeepSeek-V3, caches two different latents).
            layer.keys = _zeros_before(layer.keys, extra)
            layer.values = _zeros_before(layer.values, extra)
        self.mask = torch.cat([self.mask.new_zeros((self.size, extra)), self.mask], dim=1)
        self._padded = None
        return self

    def nbytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, *, min_length: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-align prompts (the batch's layout): ids and mask [n, L], L = the longest, at least ``min_length``."""
    longest = max(min_length, max(len(p) for p in prompts))
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        if prompt:
            ids[i, longest - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[i, longest - len(prompt) :] = 1
    return ids, mask


def _zeros_before(tensor: torch.Tensor, extra: int) -> torch.Tensor:
    """``tensor`` [B, H, T, D] with ``extra`` zero columns in front of T."""
    b, h, _, d = tensor.shape
    return torch.cat([tensor.new_zeros((b, h, extra, d)), tensor], dim=2)


def _layer_like(template, keys: torch.Tensor, values: torch.Tensor):
    layer = type(template)()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer
