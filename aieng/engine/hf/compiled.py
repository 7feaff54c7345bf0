"""The model's forward, compiled with ``torch.compile`` or eager, and the state that goes with it.

Why compile: on a small model a step's time is mostly Python and operator dispatch, which the
compiled graph removes (``aieng bench engine`` measures compiled against eager in the same run).

How, and what keeps the number of graphs to a handful (all built by ``Engine.warmup``):
- ``dynamic=True`` keeps batch size, prompt length and KV length symbolic; dynamo still
  specialises size 1, so prefill and decode each get a one-row and a several-row graph;
- compiled calls always pass an attention mask (None-or-tensor would double the graphs), prompts
  shorter than 2 tokens are padded to 2, and cache tensors are always contiguous
  (``KVBatch.make_contiguous``);
- ``cpp_wrapper`` calls the kernels from generated C++ instead of Python;
- once warm, calls run under ``skip_guard_eval_unsafe``: only the guards that tell the warmed
  graphs apart are evaluated.

The states: **eager** (compile off, or switched off after a compiler error), **cold** (compiled,
guards evaluated: warm-up, or a form warm-up missed is being compiled), **warm** (guards skipped).
``recover(exc)`` tells the engine whether a failed call may simply be retried.
``tests/engine/test_compile.py`` checks that a mixed schedule needs no graph after warm-up.
"""

from __future__ import annotations

import logging

import torch

from aieng.engine.compile_keys import key_kernels_by_torch_version
from aieng.engine.oom import is_out_of_memory

log = logging.getLogger("aieng.engine")


class CompiledForward:
    def __init__(self, model, *, enabled: bool):
        self.model = model
        self.active = enabled  # False: eager (never compiled, or fell back)
        if enabled:
            key_kernels_by_torch_version()  # a new venv with this torch reuses the cached kernels
        self._compiled = torch.compile(model.forward, dynamic=True, options={"cpp_wrapper": True}) if enabled else None
        self._warm = False  # graphs exist for every form the engine calls: guards may be skipped
        self._rewarming = False  # a form warm-up missed is being compiled with full guards
        self.rewarms = 0
        self.fallbacks = 0

    def __call__(self, **inputs):
        if not self.active:
            return self.model.forward(**inputs)
        if self._warm:
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                return self._compiled(**inputs)
        out = self._compiled(**inputs)
        if self._rewarming:  # the missing graph now exists: skipping guards is safe again
            self._rewarming, self._warm = False, True
        return out

    @property
    def warm(self) -> bool:
        return self._warm

    @property
    def compiling(self) -> bool:
        """A form warm-up missed is being compiled inside a step (seconds to minutes: not a hang)."""
        return self._rewarming

    def mark_warm(self) -> None:
        """Warm-up has called every form the engine uses: skip guard evaluation from now on."""
        self._warm = True

    def recover(self, exc: BaseException) -> bool:
        """True when ``exc`` came from the compiler and the same call may be retried.

        Only compiler errors count: a model or input error raised inside a compiled call would be
        raised again eagerly, and must not switch compilation off for the whole process.
        """
        if not self.active or is_out_of_memory(exc):
            return False
        if self._warm and "skip_guard_eval_unsafe" in str(exc):
            self._rewarm(exc)
            return True
        if isinstance(exc, torch._dynamo.exc.TorchDynamoException):  # includes inductor's errors
            self._fall_back_to_eager(exc)
            return True
        return False

    def _rewarm(self, exc: BaseException) -> None:
        """A form warm-up did not cover: compile it with full guards, then skip them again."""
        log.warning(
            "a forward call needed a graph warm-up did not compile (%s); compiling it now",
            str(exc).splitlines()[0],
            extra={"event": "engine_compile_rewarm"},
        )
        self.rewarms += 1
        self._warm, self._rewarming = False, True

    def _fall_back_to_eager(self, exc: BaseException) -> None:
        """A model torch.compile cannot handle still serves, eagerly; say so once, loudly."""
        log.warning(
            "torch.compile failed for this model (%s: %s); continuing eagerly",
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
            extra={"event": "engine_compile_fallback"},
        )
        self.fallbacks += 1
        self.active = False
