"""Generation through transformers' ``model.generate()``, one request at a time.

This is the walking skeleton's engine: correct and simple, serialised by a lock because a
model's forward pass is not meant to be shared by threads. The hand-written continuous-batching
engine replaces it in the server and is checked token-for-token against it.
"""

from __future__ import annotations

import threading

import torch

from aieng.engine.params import GenerationResult, SamplingParams, validate_request


class ReferenceGenerator:
    def __init__(self, model, tokenizer, *, context_length: int, device: torch.device):
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.device = device
        self._lock = threading.Lock()

    def count_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt)["input_ids"])

    def generate(self, prompt: str, params: SamplingParams) -> GenerationResult:
        params.validate()
        encoded = self.tokenizer(prompt, return_tensors="pt")
        input_ids = encoded["input_ids"].to(self.device)  # [1, T]
        prompt_tokens = int(input_ids.shape[1])
        validate_request(prompt_tokens, params, self.context_length)
        kwargs = dict(
            max_new_tokens=params.max_tokens,
            do_sample=params.temperature > 0,
            pad_token_id=self.tokenizer.pad_token_id,
            repetition_penalty=params.repetition_penalty,
        )
        if params.temperature > 0:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        with self._lock, torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            output = self.model.generate(
                input_ids=input_ids, attention_mask=encoded["attention_mask"].to(self.device), **kwargs
            )
        new_ids = output[0, prompt_tokens:].tolist()
        eos_ids = _eos_ids(self.model, self.tokenizer)
        hit_eos = bool(new_ids) and new_ids[-1] in eos_ids
        if hit_eos:
            new_ids = new_ids[:-1]
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        hit_stop = False
        for stop in params.stop:
            cut = text.find(stop)
            if cut != -1:
                text, hit_stop = text[:cut], True
        finish = "stop" if hit_eos or hit_stop else "length"
        return GenerationResult(text=text, finish_reason=finish, prompt_tokens=prompt_tokens,
                                completion_tokens=len(output[0]) - prompt_tokens)

    def warmup(self) -> None:
        """One tiny greedy generation so the first real request does not pay for lazy initialisation."""
        ids = self.tokenizer("warm up")["input_ids"] or [self.tokenizer.eos_token_id]
        text = self.tokenizer.decode(ids)
        self.generate(text, SamplingParams(max_tokens=2, temperature=0))


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    if ids is None:
        ids = tokenizer.eos_token_id
    return set(ids if isinstance(ids, list) else [ids]) - {None}
