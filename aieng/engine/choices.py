"""``n`` > 1: several choices from one prompt, the prompt prefilled once.

A request with ``n`` choices is admitted as one row. When its prompt is in the cache, ``fork``
makes ``n - 1`` more rows whose caches are copies of it (the runner copies the prompt's keys and
values; no forward runs again), and all ``n`` are sampled from the same last-position logits, each
with its own generator (seed, seed + 1, ... when the request has a seed), its own grammar
matcher, and its own detokenizer started from the same prompt's context (each choice's text is
what its tokens add after the prompt, ``detokenize``). From then on they are rows like any other.

The engine's rows have their own ids (``rid``, ``rid#1``, ``rid#2``, ...); the scheduler and the
HTTP layer know only the request's. ``publish`` turns the rows' events into the request's:
``index`` names the choice, ``choice_finish`` ends one, and ``finished`` comes once, with the last
choice, carrying the completion tokens of all of them. If one choice fails, the request fails
and its other rows are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aieng.engine.request import GenerationRequest, TokenEvent


def row_id(request_id: str, index: int) -> str:
    return request_id if index == 0 else f"{request_id}#{index}"


@dataclass
class _Group:
    rows: list[str]  # row ids still running, choice 0 first
    index: dict[str, int]  # row id -> choice index
    tokens: int = 0  # completion tokens of the choices that finished


class ChoiceGroups:
    """The requests with ``n`` > 1 the engine is running, and how their rows map to them."""

    def __init__(self):
        self.groups: dict[str, _Group] = {}  # request id -> its rows
        self.owner: dict[str, str] = {}  # row id -> request id

    def children(self, request: GenerationRequest) -> list[GenerationRequest]:
        """The ``n - 1`` requests of a prompt that is in the cache, for rows ``rid#1``...; registers the group."""
        n = request.params.n
        if n == 1:
            return []
        out = []
        for i in range(1, n):
            params = replace(request.params, seed=None if request.params.seed is None else request.params.seed + i)
            matcher = request.matcher.deep_copy() if request.matcher is not None else None
            out.append(
                GenerationRequest(
                    row_id(request.request_id, i),
                    request.prompt_ids,
                    params,
                    trace_id=request.trace_id,
                    matcher=matcher,
                )
            )
        ids = [request.request_id] + [r.request_id for r in out]
        self.groups[request.request_id] = _Group(rows=list(ids), index={rid: i for i, rid in enumerate(ids)})
        self.owner.update({rid: request.request_id for rid in ids})
        return out

    def rows_of(self, request_ids) -> list[str]:
        """The engine rows of these requests (a request with n > 1 has n)."""
        return [
            rid
            for request_id in request_ids
            for rid in (self.groups[request_id].rows if request_id in self.groups else [request_id])
        ]

    def publish(self, events: list[TokenEvent]) -> tuple[list[TokenEvent], list[str]]:
        """The rows' events as their requests' (see the module doc); also the sibling rows to drop
        because a choice of their request failed."""
        if not self.owner:  # no request with n > 1 running: the events are the requests' already
            return events, []
        out, doomed = [], []
        for event in events:
            request_id = self.owner.get(event.request_id)
            if request_id is None:
                out.append(event)
                continue
            group = self.groups[request_id]
            index = group.index[event.request_id]
            if event.error is not None:  # one choice failed: so does the request
                doomed += [rid for rid in group.rows if rid != event.request_id]
                self._forget(request_id)
                out.append(replace(event, request_id=request_id, index=index))
                continue
            if not event.finished:
                out.append(replace(event, request_id=request_id, index=index))
                continue
            group.rows.remove(event.request_id)
            group.tokens += event.completion_tokens
            last = not group.rows
            out.append(
                replace(
                    event,
                    request_id=request_id,
                    index=index,
                    finished=last,
                    finish_reason=event.finish_reason if last else None,
                    finish_cause=event.finish_cause if last else None,
                    completion_tokens=group.tokens if last else event.completion_tokens,
                    token_ids=event.token_ids if last else (),
                )
            )
            if last:
                self._forget(request_id)
        return out, doomed

    def _forget(self, request_id: str) -> None:
        group = self.groups.pop(request_id)
        for rid in group.index:
            self.owner.pop(rid, None)

    def drop(self, row_ids) -> None:
        """Rows the engine dropped (cancelled, timed out): their groups go with them."""
        for rid in row_ids:
            request_id = self.owner.get(rid)
            if request_id is not None and request_id in self.groups:
                self._forget(request_id)
