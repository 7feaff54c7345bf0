"""Captured requests to suite cases a person labels: production's hard cases, kept as tests.

The server's opt-in capture (``AIENG_CAPTURE_*``, ``aieng.server.http.capture``) writes requests
as JSONL: a sampled share, and every one the output guard flagged or that failed. This turns
them into a suite file whose cases carry the question, its sampling settings and where it came
from (``source``: the answer given, the reason it was kept), with no assertions yet: a person
adds ``expect`` to the ones worth grading. Unlabelled, the file already serves the comparison
gate (``aieng eval --compare``): the prompts real users asked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aieng.errors import SuiteError
from aieng.evaluation.suite_file import FORMAT, SAMPLING_KEYS, load_suite, suite_yaml
from aieng.loadtest.replay import read_capture


def cases_from_capture(paths: list[str | Path], *, family: str | None = None) -> list[dict]:
    """One case per distinct question in the capture files, in capture order."""
    cases, seen = [], set()
    for record in read_capture(paths):  # the replay's reader: files, rotations, each line checked
        messages = record.get("messages") if record["endpoint"] == "/v1/chat/completions" else None
        prompts = [None] if messages else [record["prompt"]] if isinstance(record["prompt"], str) else record["prompt"]
        for prompt in prompts:  # a completions request may carry several prompts: a case each
            key = json.dumps(messages or prompt, sort_keys=True, ensure_ascii=False)
            if key not in seen:
                seen.add(key)
                cases.append(_case(record, messages, prompt, len(cases) + 1, family))
    return cases


def _case(record: dict, messages: list | None, prompt: str | None, number: int, family: str | None) -> dict:
    sampling = {k: record["sampling"][k] for k in SAMPLING_KEYS if (record.get("sampling") or {}).get(k) is not None}
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    return {
        "id": f"captured-{number:04d}",
        "family": family or record.get("reason") or "captured",
        **({"messages": [{"role": m["role"], "content": m["content"]} for m in messages]} if messages else {}),
        **({} if messages else {"prompt": prompt}),
        **({"sampling": sampling} if sampling else {}),
        "source": {
            k: record.get(k)
            for k in ("captured_at", "request_id", "reason", "status", "served_version", "output", "guard", "error")
            if record.get(k) is not None
        },
    }


def write_suite_from_capture(
    paths: list[str | Path], out: str | Path, *, name: str = "captured", family: str | None = None
) -> Path:
    """Write a suite of the captured cases to ``out`` (which must not exist), checked by reading
    it back; returns the path."""
    out = Path(out)
    if out.exists():
        raise SuiteError(f"{out} exists; choose a new file (a suite someone labelled is not overwritten)")
    document = {
        "format": FORMAT,
        "name": name,
        "version": 1,
        "description": "Captured requests. Label the cases worth grading: add `expect:` assertions "
        "(docs/evaluation.md), and thresholds.floors for their families.",
        "cases": cases_from_capture(paths, family=family),
    }
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(suite_yaml(document))
        load_suite(tmp)  # what we write must read back as a valid suite
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
