"""transformers' own ``generate()``, greedy, as the reference the engine is checked against.

Shared by ``parity`` (token-for-token equality with the engine) and the evaluation suite (which
grades the reference's answers): left-pad the prompts, generate, cut each row after its first
end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from aieng.engine.hf.kv_batch import left_pad


@torch.inference_mode()
def reference_greedy(
    model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_ids: set[int], pad_id: int
) -> list[tuple[int, ...]]:
    """Greedy new tokens per prompt (token ids in), each cut after its first EOS (the EOS kept)."""
    ids, mask = left_pad(prompts, pad_id)
    out = model.generate(
        input_ids=ids.to(model.device),
        attention_mask=mask.to(model.device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(eos_ids),
        pad_token_id=pad_id,
    )
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        cut = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
        rows.append(tuple(row[:cut]))
    return rows


@torch.inference_mode()
def reference_sample(
    model,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int | None = None,
) -> tuple[int, ...]:
    """One sampled reply by transformers' ``generate()``, seeded without touching the caller's
    random state, cut after its first EOS (the EOS kept). Evaluation suites use it for cases
    that sample; the engine's own sampler is checked separately (its seeds are per row)."""
    ids = torch.tensor([list(prompt)], device=model.device)
    with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []):
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos_ids),
            pad_token_id=pad_id,
        )
    row = out[0, ids.shape[1] :].tolist()
    cut = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
    return tuple(row[:cut])
