"""When open-loop requests are due: constant, Poisson or bursty arrivals at a mean rate.

Open loop means requests arrive on this schedule whether or not the server has answered the
earlier ones, as real users do; a closed loop (a fixed number of users who each wait for their
reply) slows down with the server and so hides how long requests would have waited (coordinated
omission). Bursty arrivals draw gaps from a gamma distribution with shape ``burstiness`` and the
same mean as Poisson's (shape 1 is Poisson; below 1, requests come in clumps), as vLLM's
``bench serve`` does.
"""

from __future__ import annotations

import random


def arrival_times(
    process: str, rate: float, duration_s: float, *, burstiness: float = 1.0, seed: int = 0, limit: int = 1_000_000
) -> list[float]:
    """Seconds from the start at which each request is due, up to ``duration_s`` (at most ``limit``)."""
    if rate <= 0:
        raise ValueError(f"an open-loop arrival needs a rate > 0, got {rate}")
    rng = random.Random(f"arrivals:{seed}:{process}:{rate}")
    times, t = [], 0.0
    while len(times) < limit:
        if process == "constant":
            gap = 1.0 / rate
        elif process == "poisson":
            gap = rng.expovariate(rate)
        elif process == "bursty":
            gap = rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        else:
            raise ValueError(f"unknown open-loop arrival process {process!r}")
        t += gap
        if t >= duration_s:
            break
        times.append(t)
    return times
