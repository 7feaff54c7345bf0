"""``aieng bench serve``'s verdicts and table: each target judged from a run's results, and the
text a person reads (ratios side by side, what was not measured and why). ``bench`` is a
``serve_bench.ServeBenchResult``; this module imports nothing from there, so the two stay apart."""

from __future__ import annotations


def evaluate_targets(bench) -> dict:
    r = bench.results
    targets = {}
    on, off = r.get("aieng", {}), r.get("aieng_batching_off", {})
    if 32 in on and 32 in off and off[32]["ok"] and on[32]["ok"]:
        ratio = on[32]["req_per_s"] / off[32]["req_per_s"]
        targets["batching_on_over_off_c32"] = {"value": round(ratio, 2), "target": ">= 6", "met": ratio >= 6}
    if 32 in on:
        ttft = on[32]["ttft_p99_s"]
        targets["ttft_p99_c32_s"] = {"value": round(ttft, 3), "target": "<= 1.0", "met": ttft <= 1.0}
    peer = r.get("transformers_cb", {})
    for c in (32, 64):
        if c in on and c in peer and peer[c]["ok"] == 0:
            targets[f"vs_transformers_c{c}"] = {
                "value": None,
                "target": ">= 1.5 and p99 no worse",
                "met": False,
                "error": f"transformers serve answered no request: {peer[c]['status_counts']}",
            }
        elif c in on and c in peer:
            ratio = on[c]["req_per_s"] / peer[c]["req_per_s"]
            p99_ok = on[c]["latency_p99_s"] <= peer[c]["latency_p99_s"]
            targets[f"vs_transformers_c{c}"] = {
                "value": round(ratio, 2),
                "target": ">= 1.5 and p99 no worse",
                "p99_aieng_s": on[c]["latency_p99_s"],
                "p99_transformers_s": peer[c]["latency_p99_s"],
                "met": ratio >= 1.5 and p99_ok,
            }
    # The GGUF peers: reported side by side with every aieng format measured (``--weight-formats``;
    # the first is ``aieng``, the others ``aieng_FMT``), no target set for them yet.
    ours = {name: levels for name, levels in r.items() if name == "aieng" or _other_format(name)}
    for label, levels in r.items():
        if not label.startswith("llama"):
            continue
        for name, mine in ours.items():
            prefix = "" if name == "aieng" else f"{name}_"
            for c in (1, 32, 64):
                if c not in mine or c not in levels or not levels[c]["ok"] or not mine[c]["ok"]:
                    continue
                targets[f"{prefix}vs_{label}_c{c}"] = {
                    "value": round(mine[c]["output_tok_per_s"] / levels[c]["output_tok_per_s"], 2),
                    "target": "aieng/peer tok/s (reported)",
                    "met": None,
                    "p99_ratio": round(mine[c]["latency_p99_s"] / levels[c]["latency_p99_s"], 2),
                    "p99_aieng_s": mine[c]["latency_p99_s"],
                    "p99_peer_s": levels[c]["latency_p99_s"],
                }
    if bench.plain_forward and 32 in on and on[32]["ok"]:
        share = on[32]["output_tok_per_s"] / bench.plain_forward["tok_s"]
        targets["share_of_plain_forward_c32"] = {
            "value": round(share, 2),
            "target": ">= 0.8 (aieng C=32 tok/s over the plain batched forward at batch 32)",
            "met": share >= 0.8,
        }
    if bench.metrics_overhead:
        m = bench.metrics_overhead
        targets["metrics_overhead_c32_pct"] = {
            "value": round(m["latency_overhead_paired_pct"], 2),
            "target": "< 2 (p50 latency, median of the rounds' paired on/off ratios)",
            "ratio_of_medians_pct": round(m["latency_overhead_pct"], 2),
            "cpu_overhead_pct": round(m["cpu_overhead_pct"], 2),
            "met": m["latency_overhead_paired_pct"] < 2,
        }
    if bench.pss:
        targets["pss_two_over_one"] = {
            "value": round(bench.pss["ratio"], 2),
            "target": "<= 1.3 (master + workers)",
            "workers_only": round(bench.pss["workers_ratio"], 2),
            "met": bench.pss["ratio"] <= 1.3,
        }
    return targets


def format_table(bench) -> str:
    lines = [
        f"{'config':20} {'C':>4} {'req/s':>8} {'tok/s':>9} {'p50 s':>7} {'p99 s':>7} {'ttft50':>7} {'ttft99':>7} "
        f"{'tok/req':>7} {'err':>4}"
    ]
    for label, levels in bench.results.items():
        for c, m in levels.items():
            lines.append(
                f"{label:20} {c:>4} {m['req_per_s']:8.2f} {m['output_tok_per_s']:9.1f} {m['latency_p50_s']:7.3f} "
                f"{m['latency_p99_s']:7.3f} {m['ttft_p50_s']:7.3f} {m['ttft_p99_s']:7.3f} "
                f"{m['mean_completion_tokens']:7.1f} {m['errors']:>4}"
            )
    if bench.pss:
        p = bench.pss
        lines.append(
            f"PSS ({p.get('weight_format', 'auto')}), master + workers: "
            f"1 worker {p['service_one_worker_bytes'] / 2**20:.0f} MiB, 2 preloaded workers "
            f"{p['service_two_workers_bytes'] / 2**20:.0f} MiB (ratio {p['ratio']:.2f}); workers only "
            f"{p['one_worker_bytes'] / 2**20:.0f} vs {p['two_workers_bytes'] / 2**20:.0f} MiB "
            f"(ratio {p['workers_ratio']:.2f}, for reference: the service's ratio is the one that counts)"
        )
    if bench.plain_forward:
        p = bench.plain_forward
        lines.append(
            f"plain batched forward, batch {p['batch']}, {p['threads']} threads: {p['tok_s']:.1f} tok/s "
            "(the hardware's reference rate)"
        )
    if bench.metrics_overhead:
        m = bench.metrics_overhead
        lines.append(
            f"metrics on vs off at C={m['concurrency']} (median of {len(m['rounds']['on'])} alternating rounds): "
            f"p50 {m['latency_p50_s_on']:.3f} s vs {m['latency_p50_s_off']:.3f} s "
            f"({m['latency_overhead_pct']:+.1f}%; paired per round {m['latency_overhead_paired_pct']:+.1f}%), "
            f"server CPU {m['cpu_ms_per_request_on']:.2f} vs "
            f"{m['cpu_ms_per_request_off']:.2f} ms/request ({m['cpu_overhead_pct']:+.1f}%)"
        )
    for key, t in bench.targets.items():
        verdict = "reported" if t["met"] is None else "met" if t["met"] else "MISSED"
        extra = f", p99 aieng/peer {t['p99_ratio']}" if "p99_ratio" in t else ""
        lines.append(f"target {key}: {t['value']} ({t['target']}{extra}) -> {verdict}")
    for label, info in bench.peer_info.items():
        lines.append(f"peer {label}: {info['command']}")
    for label, why in bench.peer_errors.items():
        lines.append(f"peer {label} not measured: {why}")
    return "\n".join(lines)


def _other_format(label: str) -> bool:
    """An aieng server in another weight format (``aieng_int8``), not a variant of the first one."""
    return label.startswith("aieng_") and label != "aieng_batching_off"
