"""The automatic rollback decision: after a swap, should the new version stay?

The source article's decision tree ("performance_baseline p99 > 2x baseline -> fall back; the
model's perplexity jumps -> back to the last verified version"; its monitoring table: early-EOS
rate > 15%, tokens/s < 80% of baseline) as one pure function over a window of live metrics and
the version's recorded baseline. Pure so every branch is a table row in the tests, and so the
watchdog (``aieng release watch``), the notebook and a person reading a dashboard apply the same
rules to the same numbers.

Order matters and is the tree's: quality first (a wrong answer is worse than a slow one), then
errors, then the latency and throughput signals, which need enough traffic to mean anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

ROLLBACK, HOLD, PROMOTE = "rollback", "hold", "promote"


@dataclass(frozen=True)
class Window:
    """What the server did since the swap (deltas of its ``/metrics`` counters and histograms)."""

    seconds: float  # how long the window has been open
    requests: int  # finished requests (any outcome)
    errors: int  # of those, failed by the server (5xx, engine errors), not by the client
    early_eos: int  # finished by an end-of-sequence sooner than the early-EOS threshold
    latency_p99_s: float | None = None
    ttft_p99_s: float | None = None
    tokens_per_s: float | None = None  # generated tokens per second over the window
    mean_running: float = 0.0  # streams decoding on average: the load the throughput was measured at
    eval_regressed: bool = False  # a quality probe or eval of the serving version regressed

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def early_eos_rate(self) -> float:
        return self.early_eos / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class RollbackThresholds:
    window_s: float = 60.0  # watch this long before confirming the new version
    min_requests: int = 20  # fewer finished requests: latency and rates are not judged (hold)
    min_errors: int = 3  # errors alone roll back only from this many (one unlucky request is not a trend)
    max_error_rate: float = 0.05
    max_early_eos_rate: float = 0.15  # the article's monitoring threshold
    max_latency_ratio: float = 2.0  # p99 against the baseline's p99 (the article's "2x baseline")
    max_ttft_ratio: float = 2.0
    max_throughput_drop: float = 0.2  # tokens/s below 80% of the baseline (the article's threshold)
    min_probe_agreement: float = 0.8  # a suite without assertions: answers equal to the replaced version's


@dataclass(frozen=True)
class Decision:
    action: str  # rollback | hold | promote
    rule: str  # the rule that decided
    reason: str  # a sentence with the numbers

    def to_dict(self) -> dict:
        return asdict(self)


def decide(window: Window, baseline: dict | None, thresholds: RollbackThresholds = RollbackThresholds()) -> Decision:
    """Rollback, hold or promote the version now serving, with the rule that fired.

    ``baseline`` is the version's ``performance_baseline`` (``aieng bench serve --save-baseline``:
    ``latency_p99_s``, ``ttft_p99_s``, ``tokens_per_s`` at ``concurrency`` streams, optionally
    ``early_eos_rate``) or, when it
    has none, the previous version's; without one only quality and errors are judged.
    """
    t = thresholds
    if window.eval_regressed:
        return Decision(ROLLBACK, "eval_regression", "the quality probe of the serving version regressed")
    if window.errors >= t.min_errors and window.error_rate > t.max_error_rate:
        return Decision(
            ROLLBACK,
            "error_rate",
            f"{window.errors} of {window.requests} requests failed ({window.error_rate:.1%} > {t.max_error_rate:.1%})",
        )
    if window.requests < t.min_requests:
        if window.seconds >= t.window_s:
            return Decision(
                HOLD,
                "insufficient_traffic",
                f"only {window.requests} requests in {window.seconds:.0f} s "
                f"(need {t.min_requests} to judge); keep watching",
            )
        return Decision(HOLD, "window_open", f"{window.requests} requests so far; judging from {t.min_requests}")
    baseline = baseline or {}
    # A model whose normal replies are short (the demo's) ends many of them "early": a baseline
    # that recorded its own rate raises the limit to twice that rate.
    eos_limit = max(t.max_early_eos_rate, 2 * baseline.get("early_eos_rate", 0.0))
    if window.early_eos_rate > eos_limit:
        return Decision(
            ROLLBACK, "early_eos", f"{window.early_eos_rate:.1%} of replies ended early (> {eos_limit:.0%})"
        )
    for rule, live, key, limit in (
        ("latency", window.latency_p99_s, "latency_p99_s", t.max_latency_ratio),
        ("ttft", window.ttft_p99_s, "ttft_p99_s", t.max_ttft_ratio),
    ):
        reference = baseline.get(key)
        if live is not None and reference and live > limit * reference:
            return Decision(ROLLBACK, rule, f"p99 {rule} {live:.3f} s > {limit:g} x baseline {reference:.3f} s")
    reference = baseline.get("tokens_per_s")
    saturated = window.mean_running >= 0.8 * baseline.get("concurrency", float("inf"))
    if (
        window.tokens_per_s is not None
        and reference
        and saturated
        and window.tokens_per_s < (1 - t.max_throughput_drop) * reference
    ):
        return Decision(
            ROLLBACK,
            "throughput",
            f"{window.tokens_per_s:.1f} tokens/s at {window.mean_running:.0f} "
            f"streams < {1 - t.max_throughput_drop:.0%} of baseline {reference:.1f}",
        )
    if window.seconds < t.window_s:
        return Decision(
            HOLD,
            "window_open",
            f"healthy so far ({window.requests} requests, {window.seconds:.0f} of {t.window_s:.0f} s)",
        )
    return Decision(
        PROMOTE, "healthy", f"{window.requests} requests over {window.seconds:.0f} s within every threshold"
    )
