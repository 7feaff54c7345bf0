"""Send a workload's requests on schedule and time every one of them, token by token.

Times are taken against the request's *scheduled* start, not the moment the client got round to
sending it: when the client (or the server's accept queue) falls behind an open-loop schedule,
that wait is part of what a user would have seen, and measuring from the send time would hide it
(coordinated omission). ``sent - scheduled`` is kept as the client's own lag, so a run where the
client, not the server, was the bottleneck can be told apart.

Streaming is parsed as ``aieng.bench.load`` does it (aiohttp's C parser, JSON only for the chunks
that carry the first token, usage, errors or the finish), since the client shares the cores with
the server it measures.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import aiohttp
import aiohttp.http_exceptions
from tqdm.auto import tqdm

from aieng.bench.load import plain_content_chunk, run_sync
from aieng.bench.peers import peer_body_extra
from aieng.loadtest.arrivals import arrival_times
from aieng.loadtest.workload import RequestClass, Workload


@dataclass
class RequestRecord:
    cls: str  # the workload class it belongs to
    scheduled: float  # seconds since the run began when it was due
    sent: float = 0.0  # when it was sent (the client's lag is sent - scheduled)
    first_token: float | None = None
    end: float = 0.0
    status: int = 0  # HTTP status; 0 when no response came (connection refused, reset, timeout)
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive content chunks
    retry_after_s: float | None = None  # a 429's Retry-After
    retries: int = 0  # 429s retried after their Retry-After (honour_retry_after)
    measured: bool = True  # started inside the window (not warm-up or cool-down)
    intent: str = "complete"  # what its class meant it to end in (RequestClass.intent)
    error_code: str | None = None  # the error envelope's `code`, when the server sent one
    cancelled: bool = False  # the client hung up on purpose (cancel_after)
    max_tokens: int = 0  # what it asked for: the most a hung-up request may have cost the server

    @property
    def ok(self) -> bool:
        """A complete reply: what latency percentiles and token counts are made of."""
        return self.status == 200 and self.error is None and not self.cancelled

    @property
    def outcome(self) -> str:
        """ok | cancelled | timeout (504, or the deadline passed mid-stream) | rejected (4xx) | failed."""
        if self.cancelled and self.error is None:
            return "cancelled"
        if self.ok:
            return "ok"
        if self.status == 504 or self.error_code == "timeout":
            return "timeout"
        if 400 <= self.status < 500 and self.status != 429:
            return "rejected"
        return "failed"

    @property
    def expected(self) -> bool:
        """Ended as its class asked: a complete reply, or the cancel, deadline or 400 it was sent to get.
        A deadline may also be met (the reply was fast enough)."""
        wanted = {
            "complete": ("ok",),
            "cancel": ("cancelled",),
            "deadline": ("timeout", "ok"),
            "invalid": ("rejected",),
        }[self.intent]
        return self.outcome in wanted and (self.intent != "invalid" or self.status == 400)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.scheduled

    @property
    def e2e_s(self) -> float:
        return self.end - self.scheduled

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (what a reader of the stream waits per token)."""
        if self.first_token is None or self.completion_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.completion_tokens - 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["gaps"] = [round(g, 5) for g in self.gaps]
        return out


@dataclass(frozen=True)
class Timed:
    """One request of a prepared schedule (``aieng loadtest --replay``): when it is due, its class,
    route and body, instead of a workload's draw."""

    due: float  # seconds after the run began
    cls: RequestClass
    route: str
    body: dict


@dataclass
class RunConfig:
    url: str
    server_kind: str = "aieng"  # how `exact_tokens` is asked for: aieng | transformers | llama.cpp | openai
    honour_retry_after: bool = False  # retry a 429 after its Retry-After (up to 3 times) instead of counting it
    max_in_flight: int = 2048  # a bound on the client itself; reaching it shows as client lag
    progress: bool = True


class Requests:
    """The bodies a workload sends, drawn class by class with the workload's shares (seeded)."""

    def __init__(self, workload: Workload, server_kind: str, pool: int = 256):
        self.workload = workload
        self.rng = random.Random(f"classes:{workload.seed}")
        self.prompts = {c.name: c.prompts(pool, workload.seed) for c in workload.classes}
        self.count = 0
        # "openai": a server with no way to ignore EOS; replies may then end before max_tokens
        self.extra = {
            c.name: (
                peer_body_extra(server_kind, c.max_tokens, None) if c.exact_tokens and server_kind != "openai" else {}
            )
            for c in workload.classes
        }

    def next(self) -> tuple[RequestClass, dict]:
        w = self.workload
        cls = self.rng.choices(w.classes, weights=[c.share for c in w.classes])[0]
        prompt = self.prompts[cls.name][self.count % len(self.prompts[cls.name])]
        self.count += 1
        body = {
            "model": w.model,
            "max_tokens": cls.max_tokens,
            "stream": cls.stream,
            **w.extra_body,
            **self.extra[cls.name],
        }
        if cls.stream:
            body["stream_options"] = {"include_usage": True}
        if cls.deadline_s:
            body["timeout"] = cls.deadline_s  # aieng's per-request deadline
        if cls.invalid:
            body["temperature"] = -1.0
        if w.route == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return cls, body


def _error_code(text: str) -> str | None:
    try:
        return json.loads(text)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    record: RequestRecord,
    t0: float,
    honour_retry_after: bool,
    timeout_s: float,
    cancel_after: int = 0,
) -> None:
    now = lambda: time.perf_counter() - t0  # noqa: E731
    record.sent = now()
    try:
        while True:
            async with session.post(url, json=body) as resp:
                if resp.status == 429:
                    header = resp.headers.get("Retry-After")
                    record.retry_after_s = float(header) if header and header.replace(".", "", 1).isdigit() else None
                    if honour_retry_after and record.retries < 3:
                        record.retries += 1
                        await asyncio.sleep(record.retry_after_s or 1.0)
                        continue
                if resp.status != 200:
                    text = await resp.text()
                    record.status, record.error, record.end = resp.status, text[:300], now()
                    record.error_code = _error_code(text)
                    return
                record.status = 200
                if not body.get("stream"):
                    reply = await resp.json()
                    record.end = record.first_token = now()
                    usage = reply.get("usage") or {}
                    record.prompt_tokens = usage.get("prompt_tokens")
                    record.completion_tokens = usage.get("completion_tokens", 0)
                    return
                last = None
                async for raw in resp.content:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if cancel_after and record.completion_tokens >= cancel_after:
                        record.cancelled = True  # hang up mid-stream: the server must drop the row
                        resp.close()
                        break
                    if last is not None and plain_content_chunk(line):
                        t = now()
                        record.gaps.append(t - last)
                        record.completion_tokens += 1
                        last = t
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        record.error = str(chunk["error"].get("message", chunk["error"]))[:300]
                        record.error_code = chunk["error"].get("code")
                        break
                    if usage := chunk.get("usage"):
                        record.prompt_tokens = usage.get("prompt_tokens")
                        record.completion_tokens = usage.get("completion_tokens", record.completion_tokens)
                    for choice in chunk.get("choices") or []:
                        if choice.get("text") or (choice.get("delta") or {}).get("content"):
                            t = now()
                            if last is None:
                                record.first_token = t
                            else:
                                record.gaps.append(t - last)
                            record.completion_tokens += 1
                            last = t
                record.end = now()
                return
    except TimeoutError:  # the status stays: 0 when no reply began, 200 when a stream was cut short
        record.end = now()
        record.error = f"no complete reply within the workload's timeout_s ({timeout_s:g} s)"
    except (aiohttp.ClientError, aiohttp.http_exceptions.HttpProcessingError, ValueError) as exc:
        record.error, record.end = repr(exc)[:300], now()


async def run_async(
    workload: Workload,
    config: RunConfig,
    on_warm: Callable[[], None] | None = None,
    schedule: list[Timed] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Run the workload once; returns every request's record and the run's wall time.
    ``on_warm`` is called (on a thread) when the warm-up ends: the post-run checks' first look.
    ``schedule``: send exactly these requests at their due times (a replay) instead of the
    workload's draws; the workload then gives the timeout and the measurement window."""
    w, arrival = workload, workload.arrival
    requests = Requests(w, config.server_kind)
    records: list[RequestRecord] = []
    window = (w.warmup_s, w.duration_s - w.cooldown_s)
    connector = aiohttp.TCPConnector(limit=config.max_in_flight)
    timeout = aiohttp.ClientTimeout(total=w.timeout_s, sock_connect=30)
    due_times = (
        [item.due for item in schedule]
        if schedule is not None
        else None
        if arrival.process == "closed"
        else arrival_times(
            arrival.process,
            arrival.rate,
            w.duration_s,
            burstiness=arrival.burstiness,
            seed=w.seed,
            limit=w.max_requests,
        )
    )
    bar = tqdm(
        total=None if due_times is None else len(due_times),
        unit="req",
        disable=not config.progress,
        desc=f"loadtest {w.name} "
        + (
            f"{arrival.users} users"
            if due_times is None
            else "captured timing"
            if schedule is not None
            else f"{arrival.process} {arrival.rate:.4g}/s"
        ),
        leave=False,
        mininterval=1.0,
    )
    counts = {"ok": 0, "failed": 0}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        warm = asyncio.create_task(_call_at(w.warmup_s, on_warm))

        async def one(scheduled: float, item: Timed | None = None) -> None:
            cls, body = requests.next() if item is None else (item.cls, item.body)
            record = RequestRecord(
                cls.name,
                scheduled,
                measured=window[0] <= scheduled < window[1],
                intent=cls.intent,
                max_tokens=cls.max_tokens,
            )
            records.append(record)
            url = config.url.rstrip("/") + (w.route if item is None else item.route)
            await _send(session, url, body, record, t0, config.honour_retry_after, w.timeout_s, cls.cancel_after)
            counts["ok" if record.expected else "failed"] += 1
            bar.update(1)
            bar.set_postfix(counts, refresh=False)

        if due_times is None:
            rng = random.Random(f"think:{w.seed}")

            async def user() -> None:
                while len(records) < w.max_requests and time.perf_counter() - t0 < w.duration_s:
                    await one(time.perf_counter() - t0)
                    await asyncio.sleep(rng.expovariate(1 / arrival.think_s) if arrival.think_s > 0 else 0)

            await asyncio.gather(*(user() for _ in range(arrival.users)))
        else:
            tasks = []
            for i, due in enumerate(due_times):
                delay = due - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(due, None if schedule is None else schedule[i])))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        await warm
    bar.close()
    return records, wall


async def _call_at(seconds: float, fn: Callable[[], None] | None) -> None:
    if fn is not None:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(fn)


def run(
    workload: Workload,
    config: RunConfig,
    on_warm: Callable[[], None] | None = None,
    schedule: list[Timed] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Synchronous wrapper; works inside a notebook's running event loop too."""
    return run_sync(run_async(workload, config, on_warm, schedule))
