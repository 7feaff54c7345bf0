"""Training loop for the demo model: batches of whole documents, loss on the reply only.

Documents are a few dozen tokens, so each one is its own row (no packing, no cross-document
attention) and rows are padded on the right: with a causal mask a real token never attends to
the padding after it, so no attention mask is needed and SDPA takes its fast causal path. To
keep padding small, rows are bucketed by length before they are shuffled into batches.

Only the assistant reply (and the closing <|end|>) is scored: the prompts are random words and
numbers, and learning to predict them would spend the small step budget on noise.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM

IGNORE = -100  # label value cross-entropy skips


@dataclass(frozen=True)
class Batch:
    """One step's input ids and labels (IGNORE on prompt and padding), both [rows, length]."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    n_tokens: int  # real (non-padding) tokens, for the throughput figure


@dataclass(kw_only=True)
class TrainResult:
    """What the loop measured: recorded in demo_build.json as provenance."""

    steps: int
    final_loss: float  # mean loss over the last few steps (smoother than the last one)
    tokens: int
    seconds: float
    losses: list[float] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def make_batches(
    documents: list[list[int]], answer_starts: list[int], *, batch_size: int, pad_id: int, seed: int
) -> list[Batch]:
    """Cut tokenised documents into right-padded batches of similar length, in seeded order.

    ``answer_starts[i]`` is the index of the first reply token of ``documents[i]``; labels
    before it are ignored. Documents are taken in order, so a caller that wants ``steps``
    batches passes ``steps * batch_size`` documents.
    """
    if len(documents) != len(answer_starts):
        raise ValueError("documents and answer_starts differ in length")
    rng = random.Random(f"batches:{seed}")
    order = list(range(len(documents)))
    # Sort within windows of 32 batches by length, then shuffle the batches: little padding,
    # and the families still mix across steps.
    window = batch_size * 32
    groups: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: (len(documents[i]), i))
        groups.extend(chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size))
    rng.shuffle(groups)
    batches = []
    for rows in groups:
        width = max(len(documents[i]) for i in rows)
        ids_rows, label_rows, n_tokens = [], [], 0
        for i in rows:
            doc, start = documents[i], answer_starts[i]
            pad = width - len(doc)
            ids_rows.append(doc + [pad_id] * pad)
            label_rows.append([IGNORE] * start + doc[start:] + [IGNORE] * pad)
            n_tokens += len(doc)
        batches.append(Batch(torch.tensor(ids_rows), torch.tensor(label_rows), n_tokens))
    return batches


def lr_at(step: int, *, total: int, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warm-up then cosine decay to ``peak * min_ratio`` (a standard, forgiving schedule)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: LlamaForCausalLM,
    batches: list[Batch],
    *,
    lr: float,
    warmup_steps: int,
    min_lr_ratio: float,
    weight_decay: float,
    grad_clip: float,
    progress: bool = True,
) -> TrainResult:
    """Run one AdamW step per batch; show step, loss and tokens/s on a tqdm bar."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
        eps=1e-8,
        fused=True,  # one kernel for all parameters instead of one per tensor: faster steps on CPU
    )
    model.train()
    total = len(batches)
    losses: list[float] = []
    tokens = 0
    start = time.perf_counter()
    bar = tqdm(total=total, desc="demo train", unit="step", disable=not progress, dynamic_ncols=True)
    try:
        for step, batch in enumerate(batches):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total=total, peak=lr, warmup=warmup_steps, min_ratio=min_lr_ratio)
            out = model(input_ids=batch.input_ids, labels=batch.labels, use_cache=False)
            out.loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = float(out.loss.detach())
            if not math.isfinite(loss):
                raise FloatingPointError(f"training diverged at step {step}: loss {loss}")
            losses.append(loss)
            tokens += batch.n_tokens
            elapsed = time.perf_counter() - start
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / max(elapsed, 1e-9):,.0f}", refresh=False)
    finally:
        bar.close()
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return TrainResult(
        steps=total, final_loss=sum(tail) / len(tail), tokens=tokens, seconds=time.perf_counter() - start, losses=losses
    )
