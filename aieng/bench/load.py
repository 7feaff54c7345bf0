"""A bounded HTTP load generator: C concurrent streaming clients, N requests in all.

It runs on the same cores as the server it measures, so it must cost little per streamed chunk:
aiohttp (C HTTP parser, as vLLM's serving benchmark uses) rather than httpx (pure-Python h11),
and JSON is parsed only for the chunks that carry the first token, usage, errors or the finish.

Used by ``aieng bench serve``, notebook 05 and the runbooks. It only ever targets the base URL it
is given (loopback in tests), stops after ``requests`` requests, and measures per request: total
latency, time to first token (first non-empty streamed chunk) and completion tokens (from the
final usage chunk when the server sends one, else the number of content chunks).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import aiohttp
import aiohttp.http_exceptions


@dataclass
class RequestSample:
    latency_s: float
    ttft_s: float | None
    completion_tokens: int
    status: int
    error: str | None = None


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    ok: int
    errors: int
    wall_s: float
    req_per_s: float
    output_tok_per_s: float
    mean_completion_tokens: float
    latency_p50_s: float
    latency_p99_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    status_counts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[rank]


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> RequestSample:
    start = time.perf_counter()
    ttft = None
    tokens = 0
    usage_tokens = None
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                text = await resp.text()
                return RequestSample(time.perf_counter() - start, None, 0, resp.status, text[:200])
            async for raw in resp.content:  # one line per iteration, split by aiohttp's C parser
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if ttft is not None and plain_content_chunk(line):
                    tokens += 1  # the client shares the cores with the server: skip parsing what it need not
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return RequestSample(time.perf_counter() - start, ttft, tokens, 500, chunk["error"]["message"])
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if text:
                        tokens += 1
                        if ttft is None:
                            ttft = time.perf_counter() - start
        return RequestSample(
            time.perf_counter() - start, ttft, usage_tokens if usage_tokens is not None else tokens, 200
        )
    except (TimeoutError, aiohttp.ClientError, aiohttp.http_exceptions.HttpProcessingError, ValueError) as exc:
        # ValueError: a chunk that is not JSON or not UTF-8 fails this request, not the whole run
        return RequestSample(time.perf_counter() - start, None, 0, 0, repr(exc))


def plain_content_chunk(line: str) -> bool:
    """A mid-stream chunk: not finished, no usage or error, non-empty text. Counting it needs no parse.

    Works for both servers the bench drives: aieng writes ``"finish_reason":null`` mid-stream,
    transformers serve leaves the key out; a finished chunk has a quoted reason either way.
    """
    return not any(
        marker in line
        for marker in (
            '"finish_reason":"',
            '"finish_reason": "',
            '"usage"',
            '"error"',
            '"text":""',
            '"text": ""',
            '"content":""',
            '"content": ""',
        )
    )


async def run_load_async(
    base_url: str,
    bodies: list[dict],
    *,
    concurrency: int,
    route: str = "/v1/completions",
    timeout: float = 300.0,
    progress=None,
) -> LoadResult:
    url = base_url.rstrip("/") + route
    pending = list(bodies)
    samples: list[RequestSample] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    # ``timeout`` bounds each read, not the whole stream: a long generation under load is not an error
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:

        async def worker():
            while pending:
                body = pending.pop()
                samples.append(await _one(session, url, body))
                if progress is not None:
                    progress.update(1)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start

    ok = [s for s in samples if s.status == 200 and s.error is None]
    statuses: dict[str, int] = {}
    for s in samples:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    latencies = [s.latency_s for s in ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tokens = sum(s.completion_tokens for s in ok)
    return LoadResult(
        concurrency=concurrency,
        requests=len(samples),
        ok=len(ok),
        errors=len(samples) - len(ok),
        wall_s=wall,
        req_per_s=len(ok) / wall,
        output_tok_per_s=tokens / wall,
        mean_completion_tokens=statistics.mean([s.completion_tokens for s in ok]) if ok else 0.0,
        latency_p50_s=percentile(latencies, 50),
        latency_p99_s=percentile(latencies, 99),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        status_counts=statuses,
    )


def run_load(base_url: str, bodies: list[dict], *, concurrency: int, **kwargs) -> LoadResult:
    """Synchronous wrapper (the CLI, and notebooks, whose kernel already runs an event loop)."""
    return run_sync(run_load_async(base_url, bodies, concurrency=concurrency, **kwargs))


def run_sync(coroutine):
    """Run ``coroutine`` to its end from synchronous code, on a thread of its own when this
    thread already runs an event loop (a notebook kernel)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
