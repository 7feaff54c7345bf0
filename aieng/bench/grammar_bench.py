"""``aieng bench grammar``: what constrained decoding costs, and what it buys.

- **Cost:** the same batch of rows decoded free and constrained, alternated, median over repeats,
  on two workloads. ``forced``: the rows follow a JSON schema they cannot complete within the
  token budget (an array of at least 1,000 integers) and that the model would not write, so
  every row is masked at every step: the worst case. ``json_task``: held-out json prompts, each
  under its own schema, which the model mostly follows: greedy rows whose own choice the grammar
  accepts skip the mask (``constraints.masks_needed``), the common case.
- **Effect:** the demo model's held-out ``json`` prompts answered free, with ``json_object``
  and with a schema per prompt (its fields, in order, typed as the prompt's values are):
  validity (parses, and validates against the prompt's schema) and accuracy (exact answer).
  A realistic-shape stand-in has random weights: its "accuracy" is noise, only cost is measured.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, replace

from aieng.bench.engine_bench import render_prompts
from aieng.engine import Engine, SamplingParams
from aieng.engine.chat import user_prompt
from aieng.engine.constraints import Constraint

#: Never complete within a benchmark's tokens: every row decodes the full budget under its mask.
ENDLESS_ARRAY = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}


@dataclass
class GrammarCost:
    workload: str  # "forced": every row's mask every step; "json_task": the model mostly agrees with its schema
    batch: int
    repeats: int
    free_tok_s: float
    constrained_tok_s: float
    cost_pct: float  # throughput lost to the constraint, in % of the free run's

    def to_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def measure_mask_cost(
    engine: Engine, *, batch: int = 32, new_tokens: int = 64, repeats: int = 5, workload: str = "forced", progress=None
) -> GrammarCost:
    """``forced``: ``batch`` bench prompts decode ``new_tokens`` each under ``ENDLESS_ARRAY`` (a
    format the model does not want to write, so every row is masked every step). ``json_task``:
    ``batch`` held-out json prompts, greedy, each under its own schema, against the same prompts
    free (the constrained rows skip the EOS step: tokens/s, not time, is compared)."""
    tick = progress or (lambda _=1: None)
    if workload == "forced":
        ids = [engine.encode(p) for p in render_prompts(engine.tokenizer, batch)]
        free = [SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)] * batch
        constrained = [replace(free[0], constraint=Constraint.json_schema(ENDLESS_ARRAY))] * batch
    elif workload == "json_task":
        from aieng.demo.corpus import held_out_examples

        examples = [e for e in held_out_examples(0, batch) if e.family == "json"][:batch]
        ids = [engine.encode(user_prompt(engine.tokenizer, e.prompt)) for e in examples]
        free = [SamplingParams(max_tokens=48, temperature=0)] * len(ids)
        constrained = [
            replace(free[0], constraint=Constraint.json_schema(schema_for(json.loads(e.answer)))) for e in examples
        ]
    else:
        raise ValueError(f"unknown workload {workload!r}: forced or json_task")
    rates: dict[str, list[float]] = {"free": [], "constrained": []}
    engine.generate(ids, free), engine.generate(ids, constrained)  # warm-ups, not timed
    for _ in range(repeats):
        for name, params in (("free", free), ("constrained", constrained)):
            start = time.perf_counter()
            results = engine.generate(ids, params)
            rates[name].append(sum(r.completion_tokens for r in results) / (time.perf_counter() - start))
            tick()
    free_rate, constrained_rate = statistics.median(rates["free"]), statistics.median(rates["constrained"])
    return GrammarCost(
        workload=workload,
        batch=len(ids),
        repeats=repeats,
        free_tok_s=free_rate,
        constrained_tok_s=constrained_rate,
        cost_pct=100 * (1 - constrained_rate / free_rate),
    )


def schema_for(record: dict) -> dict:
    """The schema a client expecting ``record``'s shape would send: its fields in order, typed."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(record),
        "properties": {k: {"type": "integer" if isinstance(v, int) else "string"} for k, v in record.items()},
    }


def json_task_report(
    engine: Engine, *, n: int = 64, seed: int = 0, max_tokens: int = 48, temperature: float = 0.0
) -> dict:
    """Validity and accuracy on ``n`` held-out ``json`` prompts, free / json_object / per-prompt
    schema; sampled rows (``temperature`` > 0) are seeded by their index, the same in every mode."""
    import jsonschema

    from aieng.demo.corpus import held_out_examples

    examples = [e for e in held_out_examples(seed, n) if e.family == "json"]
    prompts = [user_prompt(engine.tokenizer, e.prompt) for e in examples]
    expected = [json.loads(e.answer) for e in examples]
    schemas = [schema_for(record) for record in expected]
    modes = {
        "free": [None] * len(examples),
        "json_object": [Constraint("json_object")] * len(examples),
        "json_schema": [Constraint.json_schema(schema) for schema in schemas],
    }
    report = {"prompts": len(examples), "temperature": temperature}
    for mode, constraints in modes.items():
        params = [
            SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=i, constraint=c)
            for i, c in enumerate(constraints)
        ]
        valid = correct = 0
        for result, schema, answer in zip(engine.generate(prompts, params), schemas, expected):
            try:
                value = json.loads(result.text)
                jsonschema.validate(value, schema)
            except (ValueError, jsonschema.ValidationError):
                continue
            valid += 1
            correct += value == answer and list(value) == list(answer)
        report[mode] = {"valid": valid / len(examples), "accuracy": correct / len(examples)}
    return report
