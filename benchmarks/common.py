"""Shared helpers for the benchmark scripts (figures are printed, not asserted)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placement.model import Fleet, JobRequest
from placement.place import place
from placement.sim.tracegen import SIZE_MIX


def random_job(rng: random.Random, jid: str, max_gpus: int | None = None) -> JobRequest:
    sizes = [g for g in SIZE_MIX if max_gpus is None or g <= max_gpus]
    g = rng.choices(sizes, [SIZE_MIX[s] for s in sizes])[0]
    loc = "none" if g <= 4 else rng.choice(["preferred", "preferred", "required", "none"])
    return JobRequest(
        jid,
        num_gpus=g,
        locality=loc,
        preemptible=rng.random() < 0.8,
        priority=int(rng.random() < 0.1),
        expected_duration=rng.uniform(600, 36000),
        submit_time=0.0,
    )


def fill(fleet: Fleet, occupancy: float, seed: int = 0, policy: str = "rackwise") -> int:
    """Place random jobs until ``occupancy`` of the GPUs are held; returns jobs placed."""
    rng = random.Random(seed)
    total = fleet.total_gpus
    held = total - fleet.free_gpus()
    i = misses = 0
    while held < occupancy * total and misses < 200:
        job = random_job(rng, f"fill{i}")
        i += 1
        plan = place(fleet, job, policy, rng=rng)
        if not plan.placed:
            misses += 1
            continue
        alloc = plan.allocation(job)
        alloc.expected_end = rng.uniform(0, 36000)
        fleet.allocate(alloc)
        held += alloc.gpus
    return len(fleet.allocations)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


__all__ = ["fill", "ms", "pct", "random_job"]
