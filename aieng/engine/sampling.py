"""Per-row sampling over a batch of logits: each row keeps its own knobs and its own RNG.

Greedy rows take the argmax. Sampled rows go through repetition penalty → temperature → top-k →
top-p, then draw with their own ``torch.Generator`` (seeded from the request's ``seed``), so a
row's draws depend only on its own seed and its own logits, never on its batch-mates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aieng.engine.params import SamplingParams


def new_generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF semantics: seen tokens' positive logits are divided by ``penalty``, negative ones multiplied."""
    # logits: [V]  seen: [N] token ids (prompt + generated)
    scores = logits.gather(0, seen)
    scores = torch.where(scores > 0, scores / penalty, scores * penalty)
    return logits.scatter(0, seen, scores)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf (always keeps the most likely token)."""
    # logits: [V]
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative - sorted_logits.softmax(-1) >= top_p  # mass before this token already reaches top_p
        remove[0] = False
        logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return logits


def limit_overflow(logits: torch.Tensor) -> torch.Tensor:
    """The distribution's limit where a knob overflowed the float range: a valid but extreme
    repetition penalty (1e-300 divides a positive logit to +inf) or temperature. Tokens at +inf
    share the mass, NaN has none; softmax would otherwise give NaN and the draw would raise."""
    if bool(torch.isfinite(logits).all()):
        return logits
    logits = logits.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    top = torch.isposinf(logits)
    return torch.where(top, 0.0, float("-inf")) if bool(top.any()) else logits


def sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, seen: torch.Tensor | None
) -> int:
    """One token for one row. ``logits`` [V] float32."""
    if params.repetition_penalty != 1.0 and seen is not None and seen.numel():
        logits = limit_overflow(apply_repetition_penalty(logits, seen, params.repetition_penalty))
    if params.greedy:
        return int(logits.argmax())
    scaled = logits / params.temperature
    try:
        return int(
            torch.multinomial(
                filter_top_k_top_p(scaled, params.top_k, params.top_p).softmax(-1), 1, generator=generator
            )
        )
    except RuntimeError:  # inf/NaN probabilities: a knob (or the model) overflowed; only then pay for the check
        limited = filter_top_k_top_p(limit_overflow(scaled), params.top_k, params.top_p)
        return int(torch.multinomial(limited.softmax(-1), 1, generator=generator))


def adjust_logits(logits: torch.Tensor, params: list[SamplingParams], generated: list[list[int]]) -> torch.Tensor:
    """OpenAI's presence and frequency penalties (over the tokens each row generated so far, not its
    prompt) and logit bias, for the rows that ask; a new tensor only when one does."""
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i in rows:
        p = params[i]
        if generated[i] and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(generated[i], device=logits.device), minlength=vocab)[:vocab]
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        for token, bias in p.logit_bias:
            if 0 <= token < vocab:
                logits[i, token] += bias
    return logits


def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    seen: list[torch.Tensor | None],
) -> list[int | Exception]:
    """Tokens for a batch. ``logits`` [B, V]. Greedy rows without penalties share one argmax.

    A row whose own sampling raises gets the exception in its place instead of a token, so that
    row fails alone (``row.advance_rows``) and its batch-mates carry on."""
    logits = logits.float()
    plain_greedy = [p.greedy and p.repetition_penalty == 1.0 for p in params]
    argmax = logits.argmax(-1).tolist()
    if all(plain_greedy):
        return argmax
    tokens: list[int | Exception] = []
    for i, plain in enumerate(plain_greedy):
        try:
            tokens.append(argmax[i] if plain else sample_row(logits[i], params[i], generators[i], seen[i]))
        except Exception as exc:  # noqa: BLE001 - this row's failure, reported on this row
            tokens.append(exc)
    return tokens


@dataclass(frozen=True)
class TokenLogprobs:
    """The sampled token's log-probability and the ``top`` most likely alternatives (id, logprob),
    under the model's own distribution: before repetition penalty, temperature, top-k and top-p
    (vLLM's default, "raw" logprobs), so a value means the same whatever the sampling knobs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(
    logits: torch.Tensor, tokens: list[int | Exception], params: list[SamplingParams]
) -> list[TokenLogprobs | None]:
    """Logprobs for the rows that asked (``params.logprobs`` is not None), None for the others.
    One log-softmax and one top-k over the rows that asked, whatever their number."""
    wanted = [i for i, p in enumerate(params) if p.logprobs is not None and not isinstance(tokens[i], Exception)]
    out: list[TokenLogprobs | None] = [None] * len(params)
    if not wanted:
        return out
    scored = _scored(logits[wanted], [tokens[i] for i in wanted], [params[i].logprobs for i in wanted])
    for i, item in zip(wanted, scored):
        out[i] = item
    return out


@torch.inference_mode()
def prompt_logprobs(model, prompt_ids: list[int], k: int, device: torch.device) -> tuple[TokenLogprobs | None, ...]:
    """Each prompt token's logprob given the tokens before it, and the ``k`` likeliest there (the
    first token has none: ``None``). One plain forward over the prompt, separate from the
    engine's cached prefill, which keeps only the last position's logits: scoring requests
    (echo with logprobs, what evaluation harnesses send) pay a second prefill, nobody else does."""
    ids = torch.tensor([prompt_ids], device=device)
    return (None,) + tuple(_scored(model(ids).logits[0, :-1], prompt_ids[1:], [k] * (len(prompt_ids) - 1)))


def _scored(logits: torch.Tensor, tokens: list[int], ks: list[int]) -> list[TokenLogprobs]:
    """Row i's ``tokens[i]`` with its log-probability under ``logits[i]`` and the ``ks[i]`` likeliest
    alternatives: one log-softmax and one top-k for all the rows."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0].tolist()
    k = min(max(ks, default=0), logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    return [
        TokenLogprobs(token, chosen[i], tuple(zip(top_ids[i][: ks[i]], top_values[i][: ks[i]])))
        for i, token in enumerate(tokens)
    ]
