"""When each request of an open-loop run is sent.

Closed loop (no rate): every request is due at once, and the concurrency limit alone paces them.
Open loop (``rate`` requests per second): the gaps between arrivals are drawn from a gamma
distribution with shape ``burstiness`` and mean 1/rate, as `vllm bench serve` draws them:
burstiness 1 is a Poisson process, below 1 burstier, above 1 more even. A seed fixes the schedule,
so two systems compared in one run see the same arrivals.
"""

from __future__ import annotations

import random


def check_pacing(rate: float | None, burstiness: float) -> None:
    """Raises ValueError naming a rate or burstiness no schedule can have."""
    if rate is not None and rate <= 0:
        raise ValueError("the request rate must be positive (omit it for a closed loop)")
    if burstiness <= 0:
        raise ValueError("burstiness must be positive")


def arrival_offsets(num_requests: int, rate: float | None, *, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the run's start at which each request is due (the first at 0)."""
    check_pacing(rate, burstiness)
    if rate is None:
        return [0.0] * num_requests
    draw = random.Random(seed).gammavariate
    theta = 1.0 / (rate * burstiness)  # mean of a gamma(k, theta) is k * theta = 1 / rate
    offsets, now = [], 0.0
    for i in range(num_requests):
        offsets.append(now)
        if i + 1 < num_requests:
            now += draw(burstiness, theta)
    return offsets
