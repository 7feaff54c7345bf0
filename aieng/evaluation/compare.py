"""Compare a candidate's answers with the current version's: the release gate for models without labels.

A user's own model rarely comes with questions whose right answers a program can check. What
can always be checked is change: ask both versions the same prompts, greedily, and measure how
often the answers agree, how their lengths compare, whether more of them are empty or refusals,
and how likely the current version's answers still are under the candidate (perplexity ratio;
1.0 for the same weights). An exact copy scores agreement 1, length ratio 1, ratio 1 and passes;
a changed model is refused with the cases whose answers changed.

The prompts are the suite's gate cases (assertions ignored) or a prompt file: ``.txt`` (one
prompt per line) or ``.jsonl`` (``{"messages": [...]}`` or ``{"prompt": "..."}`` per line, as a
capture file writes them). The versions are loaded one after the other, never both at once.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aieng.engine.chat import has_chat_template
from aieng.errors import SuiteError
from aieng.evaluation.answers import Answer, model_answers
from aieng.evaluation.suite_file import Case, Suite
from aieng.store import ModelRef, ModelStore

if TYPE_CHECKING:
    from aieng.loading.loader import LoadConfig

# A refusal in English or Chinese; a suite's ``refusal_patterns`` replace these.
DEFAULT_REFUSALS = (
    r"\bI(?: am|'m) (?:sorry|unable|not able)\b",
    r"\bI can(?:no|')t (?:help|assist|do|provide|answer)\b",
    r"\bas an AI\b",
    r"抱歉",
    r"我(?:无法|不能)",
)
CHANGED_KEPT = 20  # changed cases kept in the manifest, for the refusal message and people
MAX_TOKENS = 64


def prompt_file_cases(path: str | Path) -> list[Case]:
    """Cases (greedy, ``MAX_TOKENS``) from a ``.txt`` or ``.jsonl`` prompt file."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"cannot read the prompt file {path}: {exc}") from None
    sampling = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        case_id = f"line-{number}"
        if path.suffix != ".jsonl":
            cases.append(Case(case_id, "prompts", ({"role": "user", "content": line},), None, sampling))
            continue
        try:
            item = json.loads(line)
            messages, prompt = item.get("messages"), item.get("prompt")
            prompts = [prompt] if isinstance(prompt, str) else prompt  # completions may send several
            if not (isinstance(messages, list) and messages) and not (
                isinstance(prompts, list) and prompts and all(isinstance(p, str) for p in prompts)
            ):
                raise ValueError("needs `messages` (a list) or `prompt` (a string or a list of them)")
        except (ValueError, AttributeError) as exc:
            raise SuiteError(f"{path}:{number}: not a prompt record ({exc})") from None
        if messages:
            turns = tuple({"role": m["role"], "content": m["content"]} for m in messages)
            cases.append(Case(case_id, "prompts", turns, None, sampling))
        else:
            suffixes = [""] if len(prompts) == 1 else [f".{i}" for i in range(1, len(prompts) + 1)]
            cases.extend(Case(case_id + s, "prompts", None, p, sampling) for s, p in zip(suffixes, prompts))
    if not cases:
        raise SuiteError(f"{path} holds no prompts")
    return cases


def _greedy(cases: list[Case], tokenizer) -> list[Case]:
    chat = has_chat_template(tokenizer)
    out = []
    for case in cases:
        case = replace(case, sampling={**case.sampling, "temperature": 0.0})
        if case.messages is not None and not chat:  # a base model: the last message as a raw prompt
            case = replace(case, messages=None, prompt=case.messages[-1]["content"])
        out.append(case)
    return out


def _answers_and_perplexity(store, ref, config, cases, stable_answers=None):
    from aieng.evaluation.perplexity import reply_perplexity  # torch: only where weights are loaded
    from aieng.loading.loader import LoadConfig, load_version

    loaded = load_version(store, ref, (config or LoadConfig()).full_precision())
    try:
        cases = _greedy(cases, loaded.tokenizer)
        answers = model_answers(loaded.model, loaded.tokenizer, cases)
        scored = stable_answers if stable_answers is not None else answers
        perplexity = reply_perplexity(loaded.model, loaded.tokenizer, [(c, a.text) for c, a in zip(cases, scored)])
        return cases, answers, perplexity
    finally:
        del loaded
        gc.collect()


def comparison_metrics(
    cases: list[Case],
    stable: list[Answer],
    candidate: list[Answer],
    *,
    refusal_patterns=DEFAULT_REFUSALS,
    stable_perplexity: float | None = None,
    candidate_perplexity: float | None = None,
) -> tuple[dict, list[dict]]:
    """(metrics, changed cases) of two versions' answers to the same cases."""
    refusal = re.compile("|".join(f"(?:{p})" for p in refusal_patterns), re.IGNORECASE)
    n = len(cases)
    changed = [
        {
            "id": case.id,
            "family": case.family,
            "question": case.brief(),
            "stable": old.text[:200],
            "candidate": new.text[:200],
        }
        for case, old, new in zip(cases, stable, candidate)
        if old.text != new.text
    ]
    stable_tokens = sum(a.tokens for a in stable)
    metrics = {
        "cases": n,
        "changed": len(changed),
        "agreement": (n - len(changed)) / n if n else 1.0,
        "length_ratio": sum(a.tokens for a in candidate) / stable_tokens if stable_tokens else 1.0,
        "empty_rate": sum(not a.text for a in candidate) / n if n else 0.0,
        "stable_empty_rate": sum(not a.text for a in stable) / n if n else 0.0,
        "refusal_rate": sum(bool(refusal.search(a.text)) for a in candidate) / n if n else 0.0,
        "stable_refusal_rate": sum(bool(refusal.search(a.text)) for a in stable) / n if n else 0.0,
        "stable_perplexity": stable_perplexity,
        "candidate_perplexity": candidate_perplexity,
        "perplexity_ratio": (
            candidate_perplexity / stable_perplexity if stable_perplexity and candidate_perplexity else None
        ),
    }
    return metrics, changed


def compare_versions(
    store: ModelStore,
    name: str,
    version: str,
    *,
    against: str | None = None,
    config: LoadConfig | None = None,
    suite: Suite | None = None,
    prompts: str | Path | None = None,
    per_family: int | None = None,
) -> dict:
    """Answer the same prompts with ``name@against`` (default: current) and ``name@version``,
    record the comparison in the candidate's manifest (``comparison``) and return it."""
    against = against or store.current(name)
    if against is None:
        raise SuiteError(f"{name} has no current version to compare {name}@{version} with; pass --against VERSION")
    if against == version:
        raise SuiteError(f"{name}@{version} is the version to compare with; pick another (--against)")
    if prompts is not None:
        cases, source = prompt_file_cases(prompts), {"prompts": str(prompts)}
        refusals = DEFAULT_REFUSALS
    elif suite is not None:
        cases, source = suite.gate_cases(per_family), {"suite": suite.label, "suite_sha256": suite.sha256}
        refusals = suite.refusal_patterns or DEFAULT_REFUSALS
    else:
        raise SuiteError(
            f"nothing to compare {name}@{version} on: register a suite with it (its cases are the prompts) "
            "or pass --prompts FILE (.txt, one prompt per line, or .jsonl with messages/prompt)"
        )
    cases, stable, stable_ppl = _answers_and_perplexity(store, ModelRef(name, against), config, cases)
    _, candidate, candidate_ppl = _answers_and_perplexity(store, ModelRef(name, version), config, cases, stable)
    metrics, changed = comparison_metrics(
        cases,
        stable,
        candidate,
        refusal_patterns=refusals,
        stable_perplexity=stable_ppl,
        candidate_perplexity=candidate_ppl,
    )
    digest = hashlib.sha256(json.dumps([[c.messages, c.prompt] for c in cases], sort_keys=True).encode()).hexdigest()
    record = {
        "against": against,
        **source,
        "prompts_sha256": digest,
        "metrics": metrics,
        "changed": changed[:CHANGED_KEPT],
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    store.update_manifest(ModelRef(name, version), comparison=record)
    return {"name": name, "version": version, **record}
