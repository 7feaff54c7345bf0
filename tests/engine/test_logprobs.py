"""Logprobs: the engine's per-token values equal a plain full forward's, whatever the batch; token
texts and bytes rebuild the text even where a token splits a character."""

import pytest
import torch

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.sampling import TokenLogprobs, token_logprobs
from aieng.engine.token_text import TokenTexts

EAGER = EngineConfig(compile=False)


def test_token_logprobs_only_for_rows_that_asked():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    params = [SamplingParams(logprobs=2), SamplingParams(), SamplingParams(logprobs=0)]
    out = token_logprobs(logits, [1, 2, 3], params)
    reference = torch.log_softmax(logits, -1)
    assert out[1] is None
    assert out[0].token_id == 1 and out[0].logprob == pytest.approx(reference[0, 1].item())
    assert [t for t, _ in out[0].top] == [0, 1] and out[0].top[0][1] == pytest.approx(reference[0, 0].item())
    assert out[2] == TokenLogprobs(3, pytest.approx(reference[2, 3].item()), ())
    failed = token_logprobs(logits, [1, ValueError("row failed"), 3], [SamplingParams(logprobs=1)] * 3)
    assert failed[1] is None and failed[0] is not None  # a failed row has no token to score


def test_engine_logprobs_equal_a_full_forward_in_a_mixed_batch(demo, render):
    """Greedy rows with logprobs batched beside rows without: each token's logprob is the full
    forward's log-softmax at that position, and the chosen token tops its list."""
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    prompts = [render("reverse: apple stone river"), render("add: 27+58"), render("json: name=ana age=31")]
    params = [
        SamplingParams(max_tokens=12, temperature=0, logprobs=3),
        SamplingParams(max_tokens=12, temperature=0),
        SamplingParams(max_tokens=12, temperature=0.8, seed=1, logprobs=1),
    ]
    requests = [engine._request(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    events: dict[str, list] = {r.request_id: [] for r in requests}
    result = engine.step(requests)
    while True:
        for event in result.events:
            events[event.request_id].append(event)
        if not engine.num_running:
            break
        result = engine.step()
    assert all(e.logprobs is None for e in events["r1"])
    for request in (requests[0], requests[2]):
        got = [e.logprobs for e in events[request.request_id]]
        generated = [e.token_id for e in events[request.request_id]]
        ids = torch.tensor([request.prompt_ids + generated])
        with torch.inference_mode():
            full = torch.log_softmax(model(ids).logits[0].float(), -1)
        start = len(request.prompt_ids) - 1
        for i, item in enumerate(got):
            assert item.token_id == generated[i]
            assert item.logprob == pytest.approx(full[start + i, generated[i]].item(), abs=2e-3)
            assert len(item.top) == request.params.logprobs
            assert item.top[0][0] == int(full[start + i].argmax())
        if request.params.greedy:
            assert all(item.top[0][0] == item.token_id for item in got)


def test_token_bytes_rebuild_text_that_tokens_split_mid_character(demo):
    _, tokenizer = demo
    texts = TokenTexts(tokenizer)
    for text in ("héllo wörld", "price: 5€", "🙂 ok"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = [texts(i) for i in ids]
        assert bytes(b for _, raw in pieces for b in raw).decode("utf-8") == text
    split = [texts(i) for i in tokenizer.encode("🙂", add_special_tokens=False)]
    assert len(split) > 1 and "\ufffd" in split[0][0]  # the demo BPE never learnt it: one token per byte
    assert texts(ids[0]) is texts(ids[0])  # cached
