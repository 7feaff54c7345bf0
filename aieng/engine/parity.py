"""Check the engine against transformers' ``generate()``: greedy tokens must be identical.

Used by the tests (two architectures), by notebook 04, and available to anyone serving their own
model: ``parity_report(model, tokenizer, prompts)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aieng.engine.config import EngineConfig
from aieng.engine.engine import Engine
from aieng.engine.params import SamplingParams
from aieng.engine.reference import reference_greedy


@dataclass
class ParityReport:
    prompts: int
    identical: int
    mismatches: list[dict]  # prompt index, first differing position, both token lists

    @property
    def ok(self) -> bool:
        return not self.mismatches


def parity_report(
    model, tokenizer, prompts: list[str], *, max_new_tokens: int = 24, engine: Engine | None = None
) -> ParityReport:
    """Both sides get the same token ids and stop on the same end-of-sequence ids (the engine's)."""
    engine = engine or Engine(model, tokenizer, config=EngineConfig.exact(compile=False))
    ids = [engine.encode(p) for p in prompts]
    ours = [r.token_ids for r in engine.generate(ids, SamplingParams(max_tokens=max_new_tokens, temperature=0))]
    theirs = reference_greedy(model, ids, max_new_tokens=max_new_tokens, eos_ids=engine.eos_ids, pad_id=engine.pad_id)
    mismatches = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatches.append({"prompt": i, "first_difference": first, "aieng": list(a), "generate": list(b)})
    return ParityReport(prompts=len(prompts), identical=len(prompts) - len(mismatches), mismatches=mismatches)
