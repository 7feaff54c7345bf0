"""Check the engine against transformers' ``generate()``: greedy tokens must be identical.

Used by the tests (two architectures), by notebook 04, and available to anyone serving their own
model: ``parity_report(model, tokenizer, prompts)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aieng.engine.engine import Engine
from aieng.engine.params import SamplingParams


def reference_tokens(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[tuple[int, ...]]:
    """``generate(do_sample=False)`` on the left-padded batch; each row cut after its first EOS."""
    eos = tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    finally:
        tokenizer.padding_side = side
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
    rows = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        if eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(tuple(row))
    return rows


@dataclass
class ParityReport:
    prompts: int
    identical: int
    mismatches: list[dict]  # prompt index, first differing position, both token lists

    @property
    def ok(self) -> bool:
        return not self.mismatches


def parity_report(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 24,
                  engine: Engine | None = None) -> ParityReport:
    engine = engine or Engine(model, tokenizer)
    ours = [r.token_ids for r in engine.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0))]
    theirs = reference_tokens(model, tokenizer, prompts, max_new_tokens)
    mismatches = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatches.append({"prompt": i, "first_difference": first, "aieng": list(a), "generate": list(b)})
    return ParityReport(prompts=len(prompts), identical=len(prompts) - len(mismatches), mismatches=mismatches)
