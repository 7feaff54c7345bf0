"""A live quality probe: the held-out suite's prompts asked of the running server over HTTP.

Latency and error counters cannot see a model that answers fast and wrong. The probe asks a few
held-out prompts per family through ``/v1/chat/completions`` (greedy, the way the suite decodes)
and scores exact match, so the rollback decision's ``eval_regression`` rule judges what the
server actually answers, against what the stable version's evaluation recorded.
"""

from __future__ import annotations

import httpx

from aieng.demo.corpus import FAMILIES, held_out_examples

PROBE_SEED = 4321  # not the suite's seed: the probe's prompts are not the ones the gate saw


def quality_probe(
    url: str, model: str, *, n_per_family: int = 8, max_tokens: int = 48, timeout_s: float = 60.0
) -> dict[str, float]:
    """Exact-match rate per family of the server's greedy replies to held-out prompts."""
    examples = held_out_examples(PROBE_SEED, n_per_family)
    right = dict.fromkeys(FAMILIES, 0)
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s) as client:
        for example in examples:
            messages = ([{"role": "system", "content": example.system}] if example.system else []) + [
                {"role": "user", "content": example.prompt}
            ]
            reply = client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens},
            )
            reply.raise_for_status()
            text = reply.json()["choices"][0]["message"]["content"] or ""
            right[example.family] += text.strip() == example.answer
    return {family: count / n_per_family for family, count in right.items()}


def regressed(
    probe: dict[str, float], reference: dict[str, float] | None, margin: float = 0.25, against: str = "recorded"
) -> list[str]:
    """Families whose probe rate is more than ``margin`` below the reference (a wide margin: a probe
    of a few prompts per family is coarse). ``against`` names the reference in the message: the
    stable version's recorded eval for the watchdog, its live probe score for a canary."""
    if not reference:
        return []
    return [
        f"{family}: {probe.get(family, 0.0):.0%} live vs {rate:.0%} {against}"
        for family, rate in reference.items()
        if probe.get(family, 0.0) < rate - margin - 1e-9
    ]
