"""How a model is served on this host, in one line: the engine's choices and the worker plan.

An operator who serves their own model needs to see what aieng decided for it, and why, without
reading five log events: which forward, which weight formats, the KV cache's dtype and size, the
decode attention, and how many workers with how many torch threads. ``aieng serve`` logs this line
(event ``serving_plan``) once each process has its engine; ``aieng model inspect`` builds the
engine the same way, without serving, and prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aieng.engine.decisions import EngineDecisions
from aieng.server.process.worker_plan import WorkerPlan


@dataclass(frozen=True)
class ServingPlan:
    model: str
    version: str
    engine: EngineDecisions
    workers: WorkerPlan

    def line(self) -> str:
        return (
            f"{self.model}@{self.version}: {self.engine.line()}; {self.workers.workers} worker(s) x "
            f"{self.workers.torch_threads} torch thread(s) ({self.workers.reason})"
        )

    def fields(self) -> dict:
        return {
            "model": self.model,
            "version": self.version,
            **self.engine.fields(),
            "workers": self.workers.workers,
            "torch_threads": self.workers.torch_threads,
            "workers_why": self.workers.reason,
        }

    def lines(self) -> list[str]:
        """For a terminal: one choice per line."""
        e = self.engine
        return [
            f"model            {self.model}@{self.version} on {e.device}",
            f"forward          {e.runner}: {e.runner_why}",
            f"weights          {e.weights}",
            f"KV cache         {e.kv_cache}: {e.kv_cache_why}",
            f"decode attention {e.decode_attention}",
            f"compile          {e.compile}",
            f"workers          {self.workers.workers} x {self.workers.torch_threads} torch thread(s): "
            f"{self.workers.reason}",
        ]
