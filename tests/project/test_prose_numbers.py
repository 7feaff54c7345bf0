"""No measured number in the prose: the docs, the docstrings and the comments say what is measured
and by which command, never the figure.

Figures go stale and belong to a machine: they live in the benchmarks' output, in the notebooks
that measure them, and in commit messages and issue notes (docs/performance.md, "Where the numbers
are"). This test scans README.md, docs/*.md and every docstring (module, class, function) and
comment in aieng/ for numbers that look measured: a time (ms, µs, s, minutes), a rate (tok/s, req/s,
MB/s), a ratio (1.5×, 3x) or a percentage, alone or as a range ("6-8 s"). What it finds must be a
definition, listed in ``ALLOWED`` with its reason (a setting's default, a threshold the code
enforces, a benchmark's target, a unit conversion); anything else becomes a pointer to the command
that measures it, or goes.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_NUMBER = r"~?\d+(?:[.,]\d+)*"
_UNIT = (
    r"(?:\s?(?:ms|µs|us|ns)"  # milliseconds, microseconds, nanoseconds
    r"|\s(?:s|sec|seconds|min|minutes?)"  # seconds need a space: "400s" are HTTP statuses
    r"|\s?(?:tok/s|tokens/s|req/s|[GMK]i?B/s|[MG]bit/s)"  # rates
    r"|\s?×|x"  # ratios: "1.5×", "3x"
    r"|\s?%)"
)  # shares
FIGURE = re.compile(rf"(?<![\w.,/-]){_NUMBER}(?:\s*(?:-|–|to)\s*{_NUMBER})?{_UNIT}(?![\w/])")
_CODE_SPAN = re.compile(r"``[^`]*``|`[^`\n]*`")


@dataclass(frozen=True)
class Figure:
    path: str
    line: int
    text: str  # the figure as found ("0.2 s")
    context: str  # its line, code spans blanked

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text!r} in {self.context.strip()!r}"


@dataclass(frozen=True)
class Allowed:
    path: str
    snippet: str  # a piece of the line that contains the figure (code spans read as ``)
    reason: str

    def allows(self, figure: Figure) -> bool:
        return figure.path == self.path and self.snippet in figure.context and figure.text in self.snippet


# Definitions, not measurements: each entry names the file, a piece of the line around the figure
# and why it is allowed. A stale entry fails the test too.
ALLOWED = [
    # Settings' defaults and the thresholds the code enforces, as the settings table states them.
    Allowed(
        "docs/reference.md",
        "must save 5% and 0.5 ms a step",
        "AIENG_WEIGHT_FORMATS' threshold, enforced by formats.packed_wins / bf16_wins",
    ),
    Allowed("docs/reference.md", "(jitter 10%)", "AIENG_MAX_REQUESTS' jitter, set in gunicorn_conf.py"),
    Allowed("docs/operations.md", "jitter 10%", "AIENG_MAX_REQUESTS' jitter, set in gunicorn_conf.py"),
    Allowed("aieng/engine/native/formats.py", "by 5% and", "the threshold packed_wins / bf16_wins enforce"),
    # The canary's default steps and its checks' thresholds.
    Allowed("docs/reference.md", "# 1% -> 10% -> 50% -> 100%", "aieng release canary's default traffic steps"),
    Allowed(
        "docs/reference.md",
        "success rate ≥ 99%, p99 latency and TTFT ≤ 1.5× stable and ≥ 50 ms slower",
        "the canary's default check thresholds (release/canary_rollout.py)",
    ),
    # The rollback decision's thresholds (the source article's), and the release gate's.
    Allowed("aieng/release/decision.py", "p99 > 2x baseline", "the rollback rule's threshold, quoted"),
    Allowed("aieng/release/decision.py", "rate > 15%, tokens/s < 80% of baseline", "the rollback rule's thresholds"),
    Allowed("aieng/release/decision.py", '(the article\'s "2x baseline")', "the rollback rule's threshold"),
    Allowed("aieng/release/decision.py", "below 80% of the baseline", "the rollback rule's threshold"),
    Allowed("aieng/evaluation/gate.py", "(0.25: at most 1.25x)", "max_perplexity_rise as a ratio: a unit conversion"),
    # The load test's post-run checks and saturation rule, as loadtest/ enforces them.
    Allowed("docs/loadtest.md", "falls below 90% of the", "the saturation rule (loadtest/sweep.py)"),
    Allowed("docs/loadtest.md", "rises by under 5% while median E2E latency rises by over 50%", "the saturation rule"),
    Allowed("docs/loadtest.md", "every SLO for ≥ 95% of", "the capacity plan's rule (loadtest/sweep.py)"),
    Allowed("docs/loadtest.md", "grew ≤ 2% per 1,000 requests, and any run may grow 5%", "rss_growth's threshold"),
    Allowed("docs/loadtest.md", "(±1%, plus", "metrics_agree's tolerance"),
    Allowed("docs/loadtest.md", "within 15 s of the end", "idle_after's deadline"),
    Allowed("docs/loadtest.md", "(1%) of the measured", "--max-error-rate's default"),
    Allowed("aieng/loadtest/checks.py", "at most 2% per 1,000", "rss_growth's threshold"),
    Allowed("aieng/loadtest/checks.py", "requests and 5% in any run", "rss_growth's threshold"),
    Allowed("aieng/loadtest/sweep.py", "throughput below 90% of the offered rate", "the saturation rule"),
    Allowed(
        "aieng/loadtest/sweep.py",
        "under 5% on the level before while median end-to-end latency rose by over 50%",
        "the saturation rule",
    ),
    Allowed("aieng/loadtest/sweep.py", "throughput 10% short", "the saturation rule's margin, restated"),
    # The built-in soak workload's definition.
    Allowed("docs/loadtest.md", "streamed replies (45%), whole JSON replies (20%)", "the soak workload's mix"),
    Allowed("docs/loadtest.md", "tokens (15%), deadlines of 20 ms that cannot be met (10%)", "the soak workload's mix"),
    Allowed("docs/loadtest.md", "(10%), Poisson at 20 req/s", "the soak workload's mix and rate"),
    Allowed("docs/loadtest.md", "sampled every 2 s", "the load client's sampling interval"),
    Allowed("docs/loadtest.md", "same mix for 16 s", "the soak test's duration in make test"),
    # Alerting thresholds.
    Allowed("docs/operations.md", "alerts above 95% reserved", "deploy/prometheus/alerts.yml's threshold"),
    # Downloads of the locked files at a stated line speed: a unit conversion of their sizes.
    Allowed(
        "docs/operations.md",
        "at 100 Mbit/s those downloads take about 25 s for the CPU build and 4 minutes",
        "the locked files' sizes at a stated line speed",
    ),
    # Benchmarks' targets.
    Allowed("docs/performance.md", "at most 15% of decode throughput", "aieng bench grammar's target"),
    Allowed("aieng/bench/context_bench.py", "≤ 2 × the median step", "aieng bench context's target"),
    Allowed("aieng/bench/serve_bench.py", "larger than the 2% being", "the metrics-overhead target it looks for"),
    Allowed(
        "aieng/engine/prefill_budget.py",
        "stays near 2x the median step",
        "the budget's design target, which follows from its rule",
    ),
    # Constants of the code or of the tools it sits on.
    Allowed("aieng/demo/corpus.py", "10 % of the prompt space", "the held-out share the corpus is built with"),
    Allowed("aieng/engine/native/slots.py", "(0 × NaN is NaN)", "arithmetic, not a measurement"),
    Allowed("aieng/observability/metrics.py", "5 ms … 60 s", "histogram bucket bounds"),
    Allowed("aieng/observability/metrics.py", "between 50 ms and 2.5 s", "histogram bucket bounds"),
    Allowed("aieng/observability/metrics.py", "1 ms … 2.5 s", "histogram bucket bounds"),
    Allowed("aieng/observability/metrics.py", "0.1 s … 10 min", "histogram bucket bounds"),
    Allowed("aieng/scheduler/scheduler.py", "to go on: 1 s.", "retry_after's floor"),
    Allowed("aieng/server/http/app.py", "(the GIL switches every 5 ms)", "CPython's default switch interval"),
    Allowed("aieng/server/process/http_protocol.py", "(60 s)", "nginx's client_header_timeout default"),
    Allowed("aieng/server/process/startup.py", "prefill batch 8 × 32 tokens", "a shape in an example log line"),
    Allowed(
        "aieng/server/process/startup.py",
        '15 s") whenever nothing was logged for `` (5 s)',
        "an example log line, and the heartbeat interval HEARTBEAT_S",
    ),
    Allowed("aieng/server/process/startup.py", "more than 10 s", "the bound the heartbeat interval gives"),
    Allowed(
        "docs/architecture.md", 'after 35 s") whenever 5 s passed', "an example log line, and the heartbeat interval"
    ),
    Allowed("docs/architecture.md", "than 10 s, however long", "the bound the heartbeat interval gives"),
]


def figures_in(text: str, path: str = "<text>", first_line: int = 1) -> list[Figure]:
    """Every measured-looking figure in ``text``, code spans left out."""
    found = []
    for offset, line in enumerate(text.splitlines()):
        context = _CODE_SPAN.sub("``", line)
        found += [Figure(path, first_line + offset, m.group(0), context) for m in FIGURE.finditer(context)]
    return found


def figures_in_python(source: str, path: str = "<source>") -> list[Figure]:
    """The figures in a module's docstrings (module, class, function) and comments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found += figures_in(first.value.value, path, first.lineno)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found += figures_in(token.string, path, token.start[0])
    return found


def prose_figures() -> list[Figure]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += figures_in(doc.read_text(), doc.relative_to(ROOT).as_posix())
    for module in sorted((ROOT / "aieng").rglob("*.py")):
        found += figures_in_python(module.read_text(), module.relative_to(ROOT).as_posix())
    return found


def not_allowed(figures: list[Figure], allowed: list[Allowed] = ALLOWED) -> list[Figure]:
    return [f for f in figures if not any(entry.allows(f) for entry in allowed)]


def test_the_prose_states_no_measured_number():
    found = not_allowed(prose_figures())
    assert not found, (
        "a measured figure in prose: point at the command that measures it instead (or, for a "
        "definition, add it to ALLOWED with its reason):\n" + "\n".join(map(str, found))
    )


def test_every_allowed_entry_is_still_needed():
    figures = prose_figures()
    stale = [entry for entry in ALLOWED if not any(entry.allows(f) for f in figures)]
    assert not stale, f"ALLOWED entries that match nothing any more: {stale}"


@pytest.mark.parametrize(
    "text",
    [
        "A swap takes 0.2 s per worker.",
        "decoded at 42 ms a step",
        "a ~4 µs check",
        "(6-8 s of start-up)",
        "packed weights were 1.5× faster",
        "fp32 1.8x faster",
        "183.6 against 169.9 tok/s",
        "7.5% slower",
        "json_task 3.6–15.5%",
        "about 15 s, logged",
        "the registry at about 190 MB/s",
        "42 req/s at C=32",
    ],
)
def test_a_planted_figure_is_found(text):
    assert [f.text for f in figures_in(text)], text


@pytest.mark.parametrize(
    "text",
    [
        "HTTP 400s and 429s",
        "p99 latency",
        "at batch 32",
        "python 3.11",
        "1,256 tokens",
        "`--interval 60s`",
        "``AIENG_DRAIN_DELAY_S`` 1.0",
        "0x1F",
        "a 2x2 grid",
        "SmolLM2-135M's 30 layers",
        "bf16 halves it",
    ],
)
def test_what_is_not_a_figure_is_left_alone(text):
    assert figures_in(text) == [], text


def test_docstrings_and_comments_are_scanned_and_code_is_not():
    source = '''"""Module: loads in 3 s."""
LIMIT_S = 5.0  # was 12 ms on the demo


class Engine:
    """Steps at 40 ms."""

    def step(self):
        """1.5x faster than eager."""
        return "a string of 20 ms that is code, not prose"
'''
    assert [f.text for f in figures_in_python(source, "planted.py")] == ["3 s", "40 ms", "1.5x", "12 ms"]


def test_an_allowed_figure_passes_and_only_where_it_is_listed():
    definition = figures_in("AIENG_DRAIN_DELAY_S default 1 s", "docs/planted.md")
    allow = [Allowed("docs/planted.md", "default 1 s", "a setting's default")]
    assert definition and not_allowed(definition, allow) == []
    elsewhere = figures_in("AIENG_DRAIN_DELAY_S default 1 s", "docs/other.md")
    assert not_allowed(elsewhere, allow) == elsewhere
