"""A model's answers to suite cases: from the weights in this process, or from a running server.

In process, answers come from transformers' own ``generate()`` (``engine.reference``), the same
reference the engine's token parity is checked against, so a suite grades the model rather than
one serving path; greedy cases run in batches, sampled ones one at a time with their seed. Over
HTTP, each case goes to the route a client would use (``/v1/chat/completions`` for messages,
``/v1/completions`` for a prompt) with its sampling settings, so a suite grades what a server
really answers, template, stop strings and all.

Every answer is the reply up to its first end-of-sequence token, special tokens removed, cut at
the first stop string, surrounding whitespace stripped.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from aieng.engine.chat import chat_text, has_chat_template
from aieng.errors import SuiteError
from aieng.evaluation.suite_file import SAMPLING_KEYS, Case
from aieng.model_facts import eos_token_ids


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: int  # reply tokens generated (without the closing end token); from usage over HTTP


def cut_at_stop(text: str, stops) -> str:
    """The text before the earliest stop string, as the server's stop matcher cuts it."""
    cut = min((i for i in (text.find(s) for s in stops or ()) if i >= 0), default=len(text))
    return text[:cut]


def prompt_ids(tokenizer, case: Case) -> list[int]:
    """The tokens the server would feed for this case: the chat template's rendering of the
    messages (assistant turn opened), or the raw prompt tokenized as ``/v1/completions`` does."""
    if case.messages is None:
        return tokenizer(case.prompt)["input_ids"]
    if not has_chat_template(tokenizer):
        raise SuiteError(f"case {case.id} has chat messages but this model has no chat template; use `prompt`")
    return tokenizer(chat_text(tokenizer, list(case.messages)), add_special_tokens=False)["input_ids"]


def model_answers(model, tokenizer, cases: list[Case], *, batch_size: int = 32) -> list[Answer]:
    """Answers of ``model`` in this process, in the order of ``cases``."""
    # torch's modules, imported here: a server's answers (the probe, a runbook) need none of them
    from aieng.engine.hf_model import pad_token_id
    from aieng.engine.reference import reference_greedy, reference_sample

    eos = eos_token_ids(model, tokenizer)
    pad_id = pad_token_id(tokenizer, eos)
    out: list[Answer | None] = [None] * len(cases)

    def finish(index: int, row: tuple[int, ...]) -> None:
        reply = row[:-1] if row and row[-1] in eos else row
        text = tokenizer.decode(list(reply), skip_special_tokens=True)
        out[index] = Answer(cut_at_stop(text, cases[index].sampling.get("stop")).strip(), len(reply))

    greedy: dict[int, list[int]] = {}  # max_tokens -> indices, batched together
    for index, case in enumerate(cases):
        if case.greedy:
            greedy.setdefault(int(case.sampling["max_tokens"]), []).append(index)
        else:
            row = reference_sample(
                model,
                prompt_ids(tokenizer, case),
                max_new_tokens=int(case.sampling["max_tokens"]),
                eos_ids=eos,
                pad_id=pad_id,
                temperature=float(case.sampling["temperature"]),
                top_p=float(case.sampling.get("top_p", 1.0)),
                seed=case.sampling.get("seed"),
            )
            finish(index, row)
    for max_tokens, indices in greedy.items():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            rows = reference_greedy(
                model,
                [prompt_ids(tokenizer, cases[i]) for i in chunk],
                max_new_tokens=max_tokens,
                eos_ids=eos,
                pad_id=pad_id,
            )
            for index, row in zip(chunk, rows):
                finish(index, row)
    return out  # type: ignore[return-value]


def server_answers(
    url: str,
    model: str,
    cases: list[Case],
    *,
    token: str | None = None,
    concurrency: int = 4,
    timeout_s: float = 120.0,
    headers: dict | None = None,
) -> list[Answer]:
    """Answers of the server at ``url`` for ``model`` (``name`` or ``name@version``), in order.

    A few requests at a time: a suite is a check, not a load test. A failed request raises
    ``httpx.HTTPStatusError`` naming the case; a suite graded on half its cases is no grade."""
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    sent.update(headers or {})

    def ask(client: httpx.Client, case: Case) -> Answer:
        sampling = {k: v for k, v in case.sampling.items() if k in SAMPLING_KEYS}
        if case.messages is not None:
            body = {"model": model, "messages": list(case.messages), **sampling}
            reply = client.post("/v1/chat/completions", json=body)
        else:
            reply = client.post("/v1/completions", json={"model": model, "prompt": case.prompt, **sampling})
        if reply.is_error:
            raise httpx.HTTPStatusError(
                f"case {case.id}: {url} answered {reply.status_code}: {reply.text[:300]}",
                request=reply.request,
                response=reply,
            )
        data = reply.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if case.messages is not None else choice["text"]
        return Answer((text or "").strip(), int((data.get("usage") or {}).get("completion_tokens", 0)))

    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=sent) as client:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(lambda case: ask(client, case), cases))
