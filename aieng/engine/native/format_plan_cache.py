"""The measured weight-format plan, kept across restarts beside torch.compile's cache.

Timing the layers' matrices in four formats at seven token counts is a large share of a real
model's warm restart (the ``startup_phase_end`` log lines say how large on this host), and the
answer depends only on what the timing saw: the CPU, PyTorch, the torch thread count, the
matrices' shapes and whether packed copies fit. Those make the key; the weights' values do not matter. A restart with
the same key takes the plan from ``<TORCHINDUCTOR_CACHE_DIR>/aieng-format-plans/<key>.json``
(``AIENG_COMPILE_CACHE_DIR`` under ``aieng serve``) and logs where it came from; deleting the
file measures again. A file that cannot be read is measured over; one that cannot be written is
logged and start-up goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from aieng.host.hardware import cpu_model

log = logging.getLogger("aieng.engine")

VERSION = 1  # bump when the plan's meaning or the way it is measured changes


def plan_path(shapes: list[tuple[int, ...]], layers: int, *, packed: bool, rules: dict) -> Path:
    """The file for a plan measured on this CPU and thread count over ``layers`` layers of
    matrices of ``shapes``; ``rules``: the measurement's own constants (token counts, margins)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    facts = {
        "version": VERSION,
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "layers": layers,
        "shapes": [list(s) for s in shapes],
        "packed": packed,
        "rules": rules,
    }
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir()) / "aieng-format-plans" / f"{key}.json"


def load(path: Path) -> dict | None:
    """The stored plan's fields, or None when there is none or it cannot be read."""
    try:
        data = json.loads(path.read_text())
        one_token = data.get("timings_us", {}).get("1")  # stores before the margin was read lack it
        return {
            "bf16_from": tuple((int(n), bool(b)) for n, b in data["bf16_from"]),
            "packed_from": int(data["packed_from"]),
            "measured_at": str(data["measured_at"]),
            "timings": {1: tuple(t / 1e6 for t in one_token)} if one_token else {},
        }
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning(
            "weight formats: %s cannot be read (%s); measuring again",
            path,
            exc,
            extra={"event": "engine_weight_formats"},
        )
        return None


def store(path: Path, bf16_from, packed_from: int, timings: dict) -> None:
    """Write the plan whole or not at all (a temporary file renamed), so a crash or a second
    worker writing at the same time never leaves half a file."""
    data = {
        "bf16_from": [list(x) for x in bf16_from],
        "packed_from": packed_from,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timings_us": {str(n): [round(t * 1e6) for t in times] for n, times in timings.items()},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning(
            "weight formats: could not keep the plan in %s (%s); the next start measures again",
            path,
            exc,
            extra={"event": "engine_weight_formats"},
        )
