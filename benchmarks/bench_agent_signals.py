"""What the node agent's NVML read costs per GPU (#31), against the fake pynvml of
tests/fake_nvml.py: the first read (every call asked, the unsupported ones found)
and the reads after it (the unsupported ones skipped until the re-probe).

    .venv/bin/python benchmarks/bench_agent_signals.py [--gpus 4] [--reads 2000]

The fake answers from Python in a microsecond or two, so these figures are the
agent's own overhead. On real hardware add NVML's time per call: the H200 probe
(/work/shared/gpu/h200-nvml-probe.json) measured 5-30 us for most calls after
the first of a kind and 1-2 ms for the first; the agent makes 10-11 calls a GPU
a read on an H200 (temperature, power, clock events, 4 ECC, remapped rows,
PCIe replay, fabric; field values only at a re-probe).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.agent import NvmlGpus  # noqa: E402
from tests.fake_nvml import FakeNvml  # noqa: E402


def measure(profile: str, gpus: int, reads: int) -> tuple[float, float, float, int]:
    """(first read, median and p99 of the later reads) in microseconds per GPU,
    and NVML calls per GPU per later read."""
    fake = FakeNvml(profile, gpus)
    sys.modules["pynvml"] = fake
    source = NvmlGpus()
    started = time.perf_counter()
    source.read()
    first = (time.perf_counter() - started) / gpus * 1e6
    calls_before = sum(fake.calls.values())
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        source.read()
        times.append((time.perf_counter() - started) / gpus * 1e6)
    calls = (sum(fake.calls.values()) - calls_before) // (reads * gpus)
    times.sort()
    return first, statistics.median(times), times[int(len(times) * 0.99)], calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()
    print(f"us per GPU, {args.gpus} GPUs, {args.reads} reads")
    print(f"{'profile':<10} {'first read':>11} {'median':>8} {'p99':>8} {'calls':>6}")
    for profile in ("h200", "blackwell", "older"):
        first, median, p99, calls = measure(profile, args.gpus, args.reads)
        print(f"{profile:<10} {first:>11.1f} {median:>8.1f} {p99:>8.1f} {calls:>6}")


if __name__ == "__main__":
    main()
