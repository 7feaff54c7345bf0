"""What a load test leaves behind: ``results.json`` (schema ``aieng.loadtest/1``, documented in
``docs/loadtest.md``), ``requests.jsonl`` (every request), the plots as PNG files and
``report.html``, a self-contained page (the PNGs embedded) to attach to a ticket or a review.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

SCHEMA = "aieng.loadtest/1"


def results(
    workload,
    url: str,
    server_kind: str,
    levels: list[dict],
    *,
    sweep: bool,
    saturation: dict | None,
    capacity: dict | None,
    checks: list[dict],
    slos: dict,
) -> dict:
    return {
        "schema": SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "url": url,
        "server_kind": server_kind,
        "workload": asdict(workload),
        "slos": slos,
        "mode": "sweep" if sweep else "single",
        "levels": [{k: v for k, v in level.items() if k != "records"} for level in levels],
        "saturation": saturation,
        "capacity": capacity,
        "checks": checks,
        "passed": all(c["passed"] is not False for c in checks),
    }


def write(out: Path, data: dict, levels: list[dict]) -> dict[str, Path]:
    """results.json, requests.jsonl, the plots and report.html under ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "requests": out / "requests.jsonl", "report": out / "report.html"}
    paths["results"].write_text(json.dumps(data, indent=1) + "\n")
    with paths["requests"].open("w") as f:
        for i, level in enumerate(levels):
            for record in level["records"]:
                f.write(json.dumps({"level": i, **record.to_dict()}) + "\n")
    figures = plot(data, levels, out)
    paths.update(figures)
    paths["report"].write_text(render_html(data, figures))
    return paths


def plot(data: dict, levels: list[dict], out: Path) -> dict[str, Path]:
    """The report's figures as PNGs (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: dict[str, Path] = {}
    summaries = [level["summary"]["all"] for level in levels]
    if data["mode"] == "sweep":
        offered = [s["offered_rps"] for s in summaries]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for key, style in (("ttft_s", "o-"), ("e2e_s", "s-")):
            for q, alpha in (("p50", 1.0), ("p99", 0.5)):
                ax.plot(offered, [s[key][q] for s in summaries], style, alpha=alpha, label=f"{key[:-2]} {q}")
        ax.set_xlabel("offered rate, req/s")
        ax.set_ylabel("seconds")
        ax.set_yscale("log")
        ax.set_title("latency percentiles vs rate")
        ax.legend(fontsize=8)
        figures["latency_vs_rate"] = _save(fig, out / "latency_vs_rate.png")

        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(offered, offered, ":", color="grey", label="offered")
        ax.plot(offered, [s["throughput_rps"] for s in summaries], "o-", label="throughput")
        ax.plot(offered, [s["goodput_rps"] for s in summaries], "s-", label="goodput (met the SLOs)")
        if data["saturation"]:
            ax.axvline(data["saturation"]["offered_rps"], color="red", ls="--", label="saturation")
        ax.set_xlabel("offered rate, req/s")
        ax.set_ylabel("req/s")
        ax.set_title("throughput vs rate")
        ax.legend(fontsize=8)
        figures["throughput_vs_rate"] = _save(fig, out / "throughput_vs_rate.png")

    shown = _shown_level(data, levels)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for cls in sorted({r.cls for r in shown["records"]}):
        ttfts = sorted(r.ttft_s for r in shown["records"] if r.measured and r.ok and r.cls == cls and r.ttft_s)
        if ttfts:
            ax.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=f"{cls} ({len(ttfts)})")
    ax.set_xlabel("time to first token, s")
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=8)
    ax.set_title(f"TTFT CDF per class ({level_name(shown)})")
    figures["ttft_cdf"] = _save(fig, out / "ttft_cdf.png")

    fig, ax = plt.subplots(figsize=(8, 3.2))
    start = 0.0
    for level in levels:
        t = level["timeline"]
        ax.plot([start + x for x in t["t_s"]], t["tokens_per_s"], color="C0")
        if data["mode"] == "sweep":
            ax.axvline(start, color="grey", lw=0.5)
            ax.text(start, 0, f" {level['rate']:.3g}/s", fontsize=7, va="bottom")
        start += (t["t_s"][-1] + 1) if t["t_s"] else 0
    ax.set_xlabel("seconds")
    ax.set_ylabel("tokens/s")
    ax.set_title("output tokens per second over the run")
    figures["tokens_over_time"] = _save(fig, out / "tokens_over_time.png")
    return figures


def _shown_level(data: dict, levels: list[dict]) -> dict:
    """The level whose per-class detail the report shows: the last one below saturation."""
    if data["mode"] == "sweep" and data["saturation"] and data["saturation"]["level"] > 0:
        return levels[data["saturation"]["level"] - 1]
    return levels[-1] if data["mode"] == "sweep" and not data["saturation"] else levels[0]


def level_name(level: dict) -> str:
    return (
        f"{level['users']} users" if level["process"] == "closed" else f"{level['process']} {level['rate']:.4g} req/s"
    )


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def render_html(data: dict, figures: dict[str, Path]) -> str:
    e = html.escape
    rows = []
    for level in data["levels"]:
        a = level["summary"]["all"]
        rows.append(
            f"<tr><td>{e(level_name(level))}</td><td>{a['requests']}</td><td>{a['throughput_rps']}</td>"
            f"<td>{a['goodput_rps']}</td><td>{a['output_tokens_per_s']}</td><td>{a['ttft_s']['p50']}</td>"
            f"<td>{a['ttft_s']['p99']}</td><td>{a['itl_s']['p99']}</td><td>{a['e2e_s']['p99']}</td>"
            f"<td>{a['failed']} {e(json.dumps(a['errors_by_status']))}</td></tr>"
        )
    shown = data["levels"][0] if data["mode"] == "single" else None
    class_rows = []
    for name, c in (shown or {}).get("summary", {}).get("classes", {}).items():
        class_rows.append(
            f"<tr><td>{e(name)}</td><td>{c['requests']}</td><td>{c['ttft_s']['p50']}</td>"
            f"<td>{c['ttft_s']['p90']}</td><td>{c['ttft_s']['p99']}</td><td>{c['tpot_s']['p50']}</td>"
            f"<td>{c['e2e_s']['p50']}</td><td>{c['e2e_s']['p99']}</td><td>{c['tokens_in']}</td>"
            f"<td>{c['tokens_out']}</td><td>{c['failed']}</td></tr>"
        )
    checks = "".join(
        f"<tr class='{ {True: 'ok', False: 'bad', None: 'skip'}[c['passed']] }'><td>{e(c['name'])}</td>"
        f"<td>{ {True: 'passed', False: 'FAILED', None: 'skipped'}[c['passed']] }</td>"
        f"<td>{e(c['detail'])}</td></tr>"
        for c in data["checks"]
    )
    images = "".join(
        f"<figure><img alt='{e(name)}' src='data:image/png;base64,"
        f"{base64.b64encode(path.read_bytes()).decode()}'></figure>"
        for name, path in figures.items()
    )
    verdict = (
        [
            f"<p><b>Saturation:</b> {e(_saturation_text(data))}</p>",
            f"<p><b>Capacity:</b> {e(capacity_text(data.get('capacity')))}</p>",
        ]
        if data["mode"] == "sweep"
        else []
    )
    head = (
        "<th>level</th><th>requests</th><th>req/s</th><th>goodput</th><th>tok/s</th><th>TTFT p50</th>"
        "<th>TTFT p99</th><th>ITL p99</th><th>E2E p99</th><th>failed</th>"
    )
    class_table = (
        (
            "<h2>Per class</h2><table><tr><th>class</th><th>requests</th><th>TTFT p50</th><th>p90</th>"
            "<th>p99</th><th>TPOT p50</th><th>E2E p50</th><th>E2E p99</th><th>tokens in</th><th>out</th>"
            "<th>failed</th></tr>" + "".join(class_rows) + "</table>"
        )
        if class_rows
        else ""
    )
    title = f"aieng loadtest {e(data['workload']['name'])}"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}}.ok{{background:#e6f4e6}}.bad{{background:#fbe3e3}}
.skip{{color:#777}}img{{max-width:100%}}</style></head><body>
<h1>Load test: {e(data["workload"]["name"])} against {e(data["url"])}</h1>
<p>{e(data["created"])} · server kind {e(data["server_kind"])} · SLOs {e(json.dumps(data["slos"]))} ·
<b>{"all checks passed" if data["passed"] else "CHECKS FAILED"}</b></p>
{"".join(verdict)}
<h2>Levels (measured window only; seconds)</h2><table><tr>{head}</tr>{"".join(rows)}</table>
{class_table}
<h2>Post-run checks</h2><table><tr><th>check</th><th>result</th><th>detail</th></tr>{checks}</table>
<h2>Plots</h2>{images}
</body></html>
"""


def _saturation_text(data: dict) -> str:
    s = data.get("saturation")
    if not s:
        return "not reached at the rates tried (raise sweep.max_levels or sweep.start)"
    sustainable = (
        f"; the highest sustained throughput before it: {s['sustainable_rps']} req/s"
        if s["sustainable_rps"] is not None
        else ""
    )
    return f"at {s['offered_rps']} req/s offered ({s['reason']}: {s['throughput_rps']} req/s served){sustainable}"


def capacity_text(plan: dict | None) -> str:
    if not plan or not plan.get("per_replica_rps"):
        return "no level met the SLOs for enough requests: no rate can be planned on this server"
    text = (
        f"one server meets the SLOs for ≥{plan['min_attainment']:.0%} of requests up to {plan['per_replica_rps']} req/s"
    )
    if plan.get("replicas"):
        text += (
            f"; {plan['target_rps']:g} req/s with {plan['headroom']:.0%} headroom needs {plan['replicas']} replica(s)"
        )
    return text
