"""A model-free engine with the real engine's step contract: each row emits one token per step."""

from __future__ import annotations

from aieng.engine import StepResult, TokenEvent


class FakeEngine:
    def __init__(self):
        self.rows: dict[str, list] = {}  # request_id -> [request, tokens emitted]
        self.steps: list[dict] = []  # what each step ran: joiners and the batch size decoded

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def running_ids(self) -> list[str]:
        return list(self.rows)

    def remove(self, request_ids):
        removed = [r for r in request_ids if r in self.rows]
        for r in removed:
            del self.rows[r]
        return removed

    def step(self, joiners=(), leaving=()):
        self.remove(leaving)
        events = []
        for request in joiners:
            self.rows[request.request_id] = [request, 0]
        self.steps.append(
            {
                "joiners": [r.request_id for r in joiners],
                "prompt_lengths": [len(r.prompt_ids) for r in joiners],
                "batch": len(self.rows),
            }
        )
        for request_id, row in list(self.rows.items()):
            request = row[0]
            row[1] += 1
            done = row[1] >= request.params.max_tokens
            events.append(
                TokenEvent(
                    request_id,
                    row[1],
                    f"t{row[1]} ",
                    finished=done,
                    finish_reason="length" if done else None,
                    prompt_tokens=len(request.prompt_ids),
                    completion_tokens=row[1],
                )
            )
            if done:
                del self.rows[request_id]
        return StepResult(
            events, prefill_s=0.001 if joiners else None, decode_s=0.001 if events else None, decoded_rows=len(events)
        )
