"""The hardware's reference rate: the model's own batched forward decoding, with nothing else.

``plain_decode_tokens_per_s`` runs transformers' forward on ``batch`` identical short prompts and
then decodes with its dynamic cache: no sampling beyond argmax, no per-row bookkeeping, no
server. It is what "the plain batched forward decodes" means in the realistic-shape issue, and
the denominator of ``aieng bench serve``'s share-of-hardware ratio.
"""

from __future__ import annotations

import statistics
import time

import torch


@torch.inference_mode()
def plain_decode_tokens_per_s(
    model, *, batch: int, prompt_tokens: int = 20, steps: int = 32, repeats: int = 3
) -> float:
    from transformers import DynamicCache

    device = next(model.parameters()).device
    prompt = torch.arange(5, 5 + prompt_tokens, device=device).repeat(batch, 1)
    rates = []
    for _ in range(repeats + 1):  # the first is a warm-up and is dropped
        cache = DynamicCache()
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        position = prompt_tokens
        start = time.perf_counter()
        for _ in range(steps):
            positions = torch.full((batch, 1), position, device=device)
            out = model(input_ids=token, past_key_values=cache, position_ids=positions, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            position += 1
        rates.append(batch * steps / (time.perf_counter() - start))
    return statistics.median(rates[1:])
