"""Perplexity: of replies given their prompts (teacher-forced), and of a plain text.

Replies: a suite's reference answers (how surprised the model is by the answers it should give),
and in the comparison gate the stable version's answers scored under the candidate (how far the
candidate has moved from what users got so far). Text: a file the suite names, scored in
windows of the model's context, in process or through a server's ``/v1/completions`` with
``echo`` and ``logprobs`` (the prompt's own token log-probabilities).
"""

from __future__ import annotations

import math

import httpx
import torch

from aieng.engine.chat import chat_text
from aieng.engine.hf_model import pad_token_id
from aieng.evaluation.answers import prompt_ids
from aieng.evaluation.suite_file import Case
from aieng.model_facts import eos_token_ids


def _conversation_ids(tokenizer, case: Case, reply: str) -> list[int]:
    """Prompt and reply as one sequence, closed the way the model closes a turn."""
    if case.messages is None:
        return tokenizer(case.prompt + reply)["input_ids"]
    turns = [*case.messages, {"role": "assistant", "content": reply}]
    return tokenizer(chat_text(tokenizer, turns, add_generation_prompt=False), add_special_tokens=False)["input_ids"]


@torch.inference_mode()
def reply_perplexity(model, tokenizer, pairs: list[tuple[Case, str]], *, batch_size: int = 32) -> float:
    """exp(mean NLL) of each reply's tokens (the turn's closing tokens included) given its prompt.

    Rows are right-padded and run without an attention mask: under the causal mask no real token
    sees the padding after it, so the scores are exact."""
    pad_id = pad_token_id(tokenizer, eos_token_ids(model, tokenizer))
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        rows = [_conversation_ids(tokenizer, case, reply) for case, reply in chunk]
        prompts = [prompt_ids(tokenizer, case) for case, _ in chunk]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        scored = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, (row, prompt) in enumerate(zip(rows, prompts)):
            if row[: len(prompt)] != prompt:
                raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
            ids[i, : len(row)] = torch.tensor(row)
            scored[i, len(prompt) : len(row)] = True
        total_nll, total_tokens = _add_nll(model, ids.to(device), scored.to(device), total_nll, total_tokens)
    return math.exp(total_nll / max(total_tokens, 1))


@torch.inference_mode()
def text_perplexity(model, tokenizer, text: str, *, window: int = 512) -> float:
    """exp(mean NLL) of ``text`` in consecutive windows of at most ``window`` tokens (capped at
    the model's context), each window's first token unscored."""
    context = getattr(model.config, "max_position_embeddings", None) or window
    window = max(2, min(window, context))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        raise ValueError("the perplexity text is shorter than two tokens")
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        piece = torch.tensor([ids[start : start + window]], device=device)
        if piece.shape[1] < 2:
            break
        scored = torch.ones_like(piece, dtype=torch.bool)
        scored[:, 0] = False
        total_nll, total_tokens = _add_nll(model, piece, scored, total_nll, total_tokens)
    return math.exp(total_nll / max(total_tokens, 1))


def _add_nll(model, ids, scored, total_nll: float, total_tokens: int) -> tuple[float, int]:
    logits = model(input_ids=ids, use_cache=False).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    nll = -logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = scored[:, 1:]
    return total_nll + float(nll[mask].sum()), total_tokens + int(mask.sum())


def server_text_perplexity(
    url: str, model: str, text: str, *, chunk_chars: int = 2000, token: str | None = None, timeout_s: float = 120.0
) -> float:
    """The same measure through a server: each chunk of text sent as a prompt with ``echo`` and
    ``logprobs: 0``, scoring every prompt token after the chunk's first."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    total_nll, total_tokens = 0.0, 0
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers) as client:
        for start in range(0, len(text), chunk_chars):
            body = {"model": model, "prompt": text[start : start + chunk_chars], "max_tokens": 1}
            reply = client.post("/v1/completions", json={**body, "echo": True, "logprobs": 0, "temperature": 0})
            reply.raise_for_status()
            logprobs = reply.json()["choices"][0]["logprobs"]["token_logprobs"][:-1]  # the last is the new token
            scored = [lp for lp in logprobs[1:] if lp is not None]
            total_nll -= sum(scored)
            total_tokens += len(scored)
    if not total_tokens:
        raise ValueError("the perplexity text is shorter than two tokens")
    return math.exp(total_nll / total_tokens)
