"""The ``demo-heldout-v1`` suite: exact match on held-out demo prompts, plus perplexity.

Prompts come from :func:`aieng.demo.corpus.held_out_examples`, which only draws prompts that
no training corpus contains, so the score measures generalisation, not memory. Each prompt is
rendered with the model's own chat template and answered greedily; the decoded reply (up to
the first end-of-sequence token, special tokens removed, surrounding whitespace stripped) must
equal the expected answer exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from aieng.demo.corpus import FAMILIES, Example, held_out_examples
from aieng.engine.chat import chat_text, user_prompt
from aieng.engine.hf_model import pad_token_id
from aieng.engine.reference import reference_greedy
from aieng.model_facts import eos_token_ids

#: Name recorded with the metrics. Bump when prompts, split or scoring change: numbers from
#: different suite versions are not comparable.
SUITE_NAME = "demo-heldout-v1"


@dataclass(kw_only=True)
class EvalReport:
    """Result of one suite run.

    ``accuracy`` maps each task family to its exact-match rate in [0, 1]; ``perplexity`` is
    over the reference answer tokens (reply plus closing end token) of the same held-out
    prompts. ``mistakes`` holds a few wrong answers per family for humans and is not part of
    :meth:`to_dict` (the manifest keeps metrics only).
    """

    suite: str
    accuracy: dict[str, float]
    perplexity: float
    n_per_family: int
    seconds: float
    mistakes: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready metrics, as written into manifest.json's ``eval`` field."""
        data = asdict(self)
        data.pop("mistakes")
        return data


def _prompt_texts(tokenizer, examples: list[Example]) -> list[str]:
    return [user_prompt(tokenizer, e.prompt) for e in examples]


def _generate_answers(model, tokenizer, examples, *, batch_size, max_new_tokens) -> list[str]:
    """The reference generator's greedy replies (the same one the engine's parity is checked
    against), up to the first end-of-sequence token, special tokens removed, stripped."""
    eos = eos_token_ids(model, tokenizer)
    pad_id = pad_token_id(tokenizer, eos)
    prompts = tokenizer(_prompt_texts(tokenizer, examples), add_special_tokens=False)["input_ids"]
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        for row in reference_greedy(
            model, prompts[start : start + batch_size], max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=pad_id
        ):
            reply = row[:-1] if row and row[-1] in eos else row
            answers.append(tokenizer.decode(list(reply), skip_special_tokens=True).strip())
    return answers


@torch.inference_mode()
def _answer_perplexity(model, tokenizer, examples, *, batch_size) -> float:
    """exp(mean NLL) of the reference reply tokens given the prompt, teacher-forced.

    Rows are right-padded and run without an attention mask: under the causal mask no real
    token sees the padding after it, so the scores are exact.
    """
    pad_id = pad_token_id(tokenizer, eos_token_ids(model, tokenizer))
    device = next(model.parameters()).device
    prompts = tokenizer(_prompt_texts(tokenizer, examples), add_special_tokens=False)["input_ids"]
    # The reply is the full rendered conversation minus the rendered prompt (a prefix of it).
    full_texts = [
        chat_text(
            tokenizer,
            [{"role": "user", "content": e.prompt}, {"role": "assistant", "content": e.answer}],
            add_generation_prompt=False,
        )
        for e in examples
    ]
    fulls = tokenizer(full_texts, add_special_tokens=False)["input_ids"]
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(fulls), batch_size):
        rows = fulls[start : start + batch_size]
        starts = prompts[start : start + batch_size]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        scored = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, (row, prompt) in enumerate(zip(rows, starts)):
            if row[: len(prompt)] != prompt:
                raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
            ids[i, : len(row)] = torch.tensor(row)
            scored[i, len(prompt) : len(row)] = True
        ids = ids.to(device)
        logits = model(input_ids=ids, use_cache=False).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        targets = ids[:, 1:]
        mask = scored[:, 1:].to(device)
        nll = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        total_nll += float(nll[mask].sum())
        total_tokens += int(mask.sum())
    return math.exp(total_nll / max(total_tokens, 1))


def evaluate(
    model, tokenizer, *, n_per_family: int = 50, seed: int = 1234, batch_size: int = 32, max_new_tokens: int = 48
) -> EvalReport:
    """Grade ``model`` on ``n_per_family`` held-out prompts of each demo task family.

    Greedy decoding in batches with left padding, each prompt rendered through the tokenizer's
    chat template with the generation prompt added. Perplexity is over the reference answer
    tokens only (reply + end token), the same tokens the demo model is trained on. ``seed``
    picks which held-out prompts are used; keep the default to compare versions.
    """
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        examples = held_out_examples(seed, n_per_family)
        answers = _generate_answers(model, tokenizer, examples, batch_size=batch_size, max_new_tokens=max_new_tokens)
        perplexity = _answer_perplexity(model, tokenizer, examples, batch_size=batch_size)
    finally:
        model.train(was_training)
    accuracy: dict[str, float] = {}
    mistakes: dict[str, list[dict[str, str]]] = {}
    for family in FAMILIES:
        pairs = [(e, a) for e, a in zip(examples, answers) if e.family == family]
        right = sum(a == e.answer for e, a in pairs)
        accuracy[family] = right / len(pairs) if pairs else 0.0
        mistakes[family] = [{"prompt": e.prompt, "expected": e.answer, "got": a} for e, a in pairs if a != e.answer][:3]
    return EvalReport(
        suite=SUITE_NAME,
        accuracy=accuracy,
        perplexity=perplexity,
        n_per_family=n_per_family,
        seconds=time.perf_counter() - started,
        mistakes=mistakes,
    )


def evaluate_dir(path: str | Path, **kwargs) -> EvalReport:
    """Load the model folder at ``path`` (local files only, no remote code) and :func:`evaluate` it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return evaluate(model, tokenizer, **kwargs)
