"""The runner interface: everything the engine (and only the engine) asks of a forward.

The engine decides *what* a step does: which rows join, decode and leave, which prompt chunks
prefill, how tokens are sampled. A runner turns that into tensors on one of two forwards, chosen
per model by ``serving_path`` (``runner_choice.make_runner``):

- ``native.runner.NativeRunner``: aieng's Llama-family forward over a static slot cache, prompts
  prefilled in chunks beside decoding rows, weights in the format each step size runs fastest in,
  one compiled decoder layer;
- ``hf.runner.HFRunner``: transformers' own forward over a left-padded dynamic cache, whole
  prompts, the whole forward compiled.

Both implement ``Runner``. Code outside ``aieng/engine`` never touches a runner: it asks the
``Engine``, which answers from these members (a test checks that nothing probes a runner with
``hasattr``/``getattr``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens ``token_ids`` of one request, at positions ``start``.. in its row."""

    request_id: str
    token_ids: list[int]
    start: int
    last: bool  # the chunk ends the prompt: the step samples the row's first token


@dataclass
class StepLogits:
    decode: torch.Tensor | None = None  # [B, vocab], one row per decoding row in slot order
    prefill: torch.Tensor | None = None  # [k, vocab], one row per chunk with ``last``, in chunk order
    failed: dict[str, BaseException] = field(default_factory=dict)  # request id -> out of memory
    prefill_s: float | None = None
    decode_s: float | None = None
    head_s: float | None = None  # of those, the output projection (None: not timed apart, as in transformers' forward)


@dataclass(frozen=True)
class RunnerChoices:
    """What a runner chose for its model on this host, each in words (``engine.decisions``)."""

    weights: str
    kv_cache: str
    kv_cache_why: str
    decode_attention: str
    compile: str


#: ``run_shapes(shapes, mode)``: the engine runs each (batch size, prompt length) once, announcing it.
RunShapes = Callable[[list[tuple[int, int]], str], None]


class Runner(Protocol):
    kind: str  # "native" | "transformers": serving_path's name for the forward
    chunked: bool  # prompts prefill in chunks beside decoding rows (else whole, in steps of their own)
    device: torch.device
    path_reason: str  # why this forward serves the model (``serving_path``'s reason, or the override)
    oom_splits: dict[str, int]  # forwards retried in halves after running out of memory, by phase

    # -- capacity
    @property
    def max_rows(self) -> int:
        """Rows the runner can hold now (a hot-swap successor: only what its predecessor handed over)."""

    @property
    def planned_rows(self) -> int:
        """Rows it holds once warm and owning its whole cache: what requests are validated against."""

    @property
    def awaits_cache(self) -> bool:
        """A successor built to work in its predecessor's KV memory, before the hand-over."""

    # -- compilation
    @property
    def shared_graphs(self) -> bool:
        """It runs the compiled graphs of the engine it replaced (nothing was compiled for it)."""

    @property
    def compiled(self) -> bool: ...

    @property
    def compile_status(self) -> str:
        """eager | compiling | compiled | failed."""

    @property
    def compiling_inline(self) -> bool:
        """A step is compiling a graph warm-up missed: slow, not hung (the step watchdog asks)."""

    def compile_counts(self) -> dict[str, int]:
        """``rewarms`` (graphs built after warm-up) and ``compile_fallbacks`` (compiled code that failed)."""

    def wait_for_compile(self, timeout: float | None = None) -> None: ...

    def warm_up(
        self,
        run_shapes: RunShapes,
        shapes: list[tuple[int, int]],
        progress: Callable[[str], None],
        *,
        budget_s: float | None,
        compile: bool,
    ) -> None:
        """Run the serving shapes through ``run_shapes`` and build what compilation needs."""

    def describe(self, config) -> RunnerChoices:
        """Its choices for ``config`` (the engine's ``EngineConfig``), for ``engine.decisions``."""

    def one_row_step_bytes(self) -> int:
        """Bytes of weights a one-row decode step reads, in the formats it runs in: memory bandwidth
        over this is the ceiling of batch-1 decoding (``aieng bench memory``)."""

    # -- rows
    def admit(self, request_id: str, prompt_ids: Sequence[int]) -> int:
        """Hold a row for a new request; returns how many of its first prompt tokens the row
        already has in its cache (a prefix cache hit), which are not to be prefilled."""

    def extend_prefix(self, request_id: str, source_id: str, n: int) -> None:
        """Copy positions from the row's length up to ``n`` out of ``source_id``'s row, whose
        prompt shares them (``shared_prefill``); only where ``prefix_counts`` is not None."""

    def prefix_counts(self) -> dict[str, int] | None:
        """Running totals of the prefix cache: prompt tokens ``hit`` and ``miss``, tokens
        ``evicted``, and the tokens ``kept`` for reuse now; None where there is none."""

    def fork(self, parent: str, children: Sequence[str]) -> None:
        """Rows for ``children`` that continue ``parent``'s prefilled prompt (``n`` > 1)."""

    def start_decoding(self, request_ids: Sequence[str]) -> None: ...

    def release(self, request_ids: Sequence[str]) -> None: ...

    def decoding_ids(self) -> list[str]:
        """The decoding rows in the order ``forward``'s ``decode_tokens`` and logits follow."""

    # -- the step
    def forward(self, chunks: Sequence[Chunk], decode_tokens: Sequence[int]) -> StepLogits:
        """Prefill ``chunks`` and decode one token per decoding row, in one step where it can."""
