"""KVBatch: rows leave (select + trim), join (merge), and grow (append_column) with exact contents.

Every key is ``layer * 1000 + row * 10 + column + 1`` and its value is the negative, so each
assertion names exactly which cache entry ended up where; padding columns are zero.
"""

import pytest
import torch
from transformers import DynamicCache

from aieng.engine.hf.kv_batch import KVBatch, left_pad

HEADS, HEAD_DIM, LAYERS = 2, 3, 2


def _entry(layer: int, row: int, column: int) -> float:
    return float(layer * 1000 + row * 10 + column + 1)


def make_batch(
    mask: list[list[int]],
    next_pos: list[int] | None = None,
    *,
    row_ids: list[int] | None = None,
    value_dim: int = HEAD_DIM,
) -> KVBatch:
    """A batch whose cache holds the coded entries where ``mask`` is 1 and zeros where it is 0.

    ``row_ids`` names the rows in the code (default 0..B-1), so two batches can be told apart
    after a merge. The cache is filled the way the model fills it: ``cache.update`` per layer.
    """
    mask_t = torch.tensor(mask, dtype=torch.long)
    rows, length = mask_t.shape
    row_ids = row_ids if row_ids is not None else list(range(rows))
    cache = DynamicCache()
    for layer in range(LAYERS):
        codes = torch.tensor([[_entry(layer, r, c) for c in range(length)] for r in row_ids])
        codes = codes * mask_t  # padding positions hold zeros
        keys = codes[:, None, :, None].expand(rows, HEADS, length, HEAD_DIM).contiguous()
        values = -codes[:, None, :, None].expand(rows, HEADS, length, value_dim).contiguous()
        cache.update(keys, values, layer)
    if next_pos is None:
        next_pos = [int(sum(row)) for row in mask]
    return KVBatch(cache, mask_t, torch.tensor(next_pos, dtype=torch.long))


def codes(batch: KVBatch, layer: int, *, values: bool = False) -> list[list[float]]:
    """The [B, T] grid of codes in one layer (checks every head and dim hold the same code)."""
    tensor = batch.cache.layers[layer].values if values else batch.cache.layers[layer].keys
    first = tensor[:, :1, :, :1]
    assert torch.equal(tensor, first.expand_as(tensor)), "heads/dims disagree"
    return first[:, 0, :, 0].tolist()


def expected(rows: list[tuple[int, list[int]]], layer: int, *, sign: float = 1.0) -> list[list[float]]:
    """Codes for (row id, [column or None for padding, ...]) in order."""
    return [[0.0 if c is None else sign * _entry(layer, r, c) for c in columns] for r, columns in rows]


def _all_contiguous(batch: KVBatch) -> bool:
    return batch.mask.is_contiguous() and all(
        layer.keys.is_contiguous() and layer.values.is_contiguous() for layer in batch.cache.layers
    )


# -- left_pad ------------------------------------------------------------------------------------
def test_left_pad_right_aligns_prompts_and_marks_real_tokens():
    ids, mask = left_pad([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert ids.dtype == mask.dtype == torch.long


def test_left_pad_honours_min_length_the_pad_id_and_empty_prompts():
    ids, mask = left_pad([[4, 5], []], pad_id=99, min_length=4)
    assert ids.tolist() == [[99, 99, 4, 5], [99, 99, 99, 99]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]


# -- select / trim -------------------------------------------------------------------------------
MASK = [
    [0, 0, 1, 1],  # row 0: 2 tokens
    [0, 1, 1, 1],  # row 1: 3 tokens
    [0, 0, 0, 1],  # row 2: 1 token
]


def test_select_keeps_rows_in_the_given_order_and_trims_columns_padding_in_all_of_them():
    batch = make_batch(MASK, next_pos=[7, 8, 9])
    picked = batch.select([2, 0])
    assert picked.size == 2 and picked.length == 2  # columns 0 and 1 are padding in rows 2 and 0
    assert picked.mask.tolist() == [[0, 1], [1, 1]]
    assert picked.next_pos.tolist() == [9, 7]
    for layer in range(LAYERS):
        assert codes(picked, layer) == expected([(2, [None, 3]), (0, [2, 3])], layer)
        assert codes(picked, layer, values=True) == expected([(2, [None, 3]), (0, [2, 3])], layer, sign=-1)
    assert _all_contiguous(picked)


def test_select_trims_only_the_columns_that_are_padding_in_every_kept_row():
    batch = make_batch(MASK)
    picked = batch.select([2, 1])  # row 1 is real from column 1: only column 0 goes
    assert picked.length == 3
    assert picked.mask.tolist() == [[0, 0, 1], [1, 1, 1]]
    assert codes(picked, 1) == expected([(2, [None, None, 3]), (1, [1, 2, 3])], 1)


def test_select_leaves_the_original_batch_alone():
    batch = make_batch(MASK)
    before = [layer.keys.clone() for layer in batch.cache.layers]
    batch.select([1])
    assert batch.mask.tolist() == MASK
    assert all(torch.equal(layer.keys, old) for layer, old in zip(batch.cache.layers, before))


def test_select_can_repeat_and_keep_a_single_row():
    batch = make_batch(MASK)
    single = batch.select([1])
    assert single.mask.tolist() == [[1, 1, 1]] and not single.padded
    assert codes(single, 0) == expected([(1, [1, 2, 3])], 0)


def test_trim_without_leading_padding_changes_nothing():
    batch = make_batch([[1, 1], [0, 1]])
    keys = batch.cache.layers[0].keys
    batch.trim()
    assert batch.length == 2 and batch.cache.layers[0].keys is keys


def test_trim_drops_all_padding_columns_and_makes_tensors_contiguous():
    batch = make_batch([[0, 0, 1, 1], [0, 0, 0, 1]])
    batch.trim()
    assert batch.mask.tolist() == [[1, 1], [0, 1]]
    assert codes(batch, 0) == expected([(0, [2, 3]), (1, [None, 3])], 0)
    assert _all_contiguous(batch)  # a slice [:, :, 2:, :] alone would not be


def test_padded_is_recomputed_after_trim():
    batch = make_batch([[0, 1], [0, 1]])
    assert batch.padded  # cached True while column 0 is padding everywhere
    batch.trim()
    assert batch.mask.tolist() == [[1], [1]]
    assert not batch.padded


def test_padded_after_select_reflects_the_kept_rows():
    batch = make_batch(MASK)
    assert batch.padded
    assert not batch.select([1]).padded
    assert batch.select([0, 1]).padded


# -- merge -------------------------------------------------------------------------------------
def test_merge_left_pads_the_shorter_batch_with_zeros_and_carries_next_pos():
    first = make_batch([[1, 1, 1], [0, 1, 1]], next_pos=[3, 2], row_ids=[0, 1])
    second = make_batch([[1]], next_pos=[5], row_ids=[7])
    merged = KVBatch.merge(first, second)
    assert merged.size == 3 and merged.length == 3
    assert merged.mask.tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert merged.next_pos.tolist() == [3, 2, 5]
    for layer in range(LAYERS):
        rows = [(0, [0, 1, 2]), (1, [None, 1, 2]), (7, [None, None, 0])]
        assert codes(merged, layer) == expected(rows, layer)
        assert codes(merged, layer, values=True) == expected(rows, layer, sign=-1)


def test_merge_pads_the_first_batch_when_it_is_the_shorter():
    first = make_batch([[1, 1]], row_ids=[0])
    second = make_batch([[1, 1, 1, 1]], row_ids=[5])
    merged = KVBatch.merge(first, second)
    assert merged.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert codes(merged, 1) == expected([(0, [None, None, 0, 1]), (5, [0, 1, 2, 3])], 1)


def test_merge_recomputes_padded():
    first = make_batch([[1, 1, 1]])
    second = make_batch([[1, 1]])
    assert not first.padded and not second.padded  # both cached False
    merged = KVBatch.merge(first, second)
    assert merged.padded
    assert not KVBatch.merge(make_batch([[1, 1]]), make_batch([[1, 1]])).padded


def test_merge_into_nothing_returns_the_joining_batch():
    second = make_batch([[0, 1]])
    assert KVBatch.merge(None, second) is second
    empty = make_batch(MASK).select([])
    assert empty.size == 0
    assert KVBatch.merge(empty, second) is second


def test_merge_then_select_round_trips_a_row():
    first = make_batch([[1, 1, 1]], next_pos=[3], row_ids=[0])
    second = make_batch([[1]], next_pos=[1], row_ids=[4])
    back = KVBatch.merge(first, second).select([1])
    assert back.mask.tolist() == [[1]] and back.next_pos.tolist() == [1]
    assert codes(back, 0) == expected([(4, [0])], 0)


def test_merge_pads_values_to_their_own_head_dim():
    """Some architectures (multi-head latent attention) cache values narrower than keys."""
    first = make_batch([[1, 1]], row_ids=[0], value_dim=2)
    second = make_batch([[1]], row_ids=[1], value_dim=2)
    merged = KVBatch.merge(first, second)
    assert merged.cache.layers[0].keys.shape == (2, HEADS, 2, HEAD_DIM)
    assert merged.cache.layers[0].values.shape == (2, HEADS, 2, 2)
    assert codes(merged, 0, values=True) == expected([(0, [0, 1]), (1, [None, 0])], 0, sign=-1)


# -- append_column / make_contiguous -------------------------------------------------------------
def test_append_column_adds_a_real_column_and_advances_positions():
    batch = make_batch([[0, 1], [1, 1]], next_pos=[4, 6])
    batch.append_column()
    assert batch.mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert batch.mask.dtype == torch.long
    assert batch.next_pos.tolist() == [5, 7]


def test_make_contiguous_copies_strided_tensors_without_changing_them():
    batch = make_batch([[1, 1, 1]])
    layer = batch.cache.layers[0]
    layer.keys = layer.keys.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not layer.keys.is_contiguous()
    before = layer.keys.clone()
    assert batch.make_contiguous() is batch
    assert layer.keys.is_contiguous() and torch.equal(layer.keys, before)


def test_nbytes_counts_every_layers_keys_and_values():
    batch = make_batch([[1, 1]])
    per_tensor = 1 * HEADS * 2 * HEAD_DIM * 4  # float32
    assert batch.nbytes() == LAYERS * 2 * per_tensor


@pytest.mark.parametrize("indices", [[0], [1, 0], [0, 1, 2], [2, 1, 0]])
def test_select_then_merge_keeps_every_real_entry(indices):
    batch = make_batch(MASK)
    left, right = batch.select(indices[:1]), batch.select(indices[1:]) if len(indices) > 1 else None
    merged = KVBatch.merge(left, right) if right is not None else left
    for out_row, row in enumerate(indices):
        real = [c for c, m in enumerate(MASK[row]) if m]
        got = [v for v, m in zip(codes(merged, 1)[out_row], merged.mask[out_row].tolist()) if m]
        assert got == [_entry(1, row, c) for c in real]
