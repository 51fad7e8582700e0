"""Synthetic traces: format, determinism, load level and size mix."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from placement.trace import COLUMNS, read_trace
from placement.tracegen import SIZE_MIX, generate

ROOT = Path(__file__).resolve().parents[2]


def test_the_same_seed_gives_the_same_trace() -> None:
    assert generate(200, 0.6, seed=3) == generate(200, 0.6, seed=3)
    assert generate(200, 0.6, seed=3) != generate(200, 0.6, seed=4)


def test_offered_load_matches_the_level_asked_for() -> None:
    rows = generate(3000, 0.7, racks=10, seed=1)
    work = sum(float(r["num_gpus"]) * float(r["duration"]) for r in rows)  # type: ignore[arg-type]
    span = float(rows[-1]["submit_time"])  # type: ignore[arg-type]
    load = work / (span * 10 * 18 * 4)
    assert 0.6 < load < 0.8


def test_sizes_run_from_single_gpus_to_multi_rack_gangs() -> None:
    rows = generate(2000, 0.6, seed=2)
    sizes = {int(r["num_gpus"]) for r in rows}  # type: ignore[call-overload]
    assert min(sizes) == 1 and max(sizes) == max(SIZE_MIX)
    durations = sorted(float(r["duration"]) for r in rows)  # type: ignore[arg-type]
    # Heavy tail: the longest jobs are far longer than the median.
    assert durations[-20] > 10 * durations[len(durations) // 2]


def test_the_cli_writes_a_trace_the_simulator_can_read(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    subprocess.run([sys.executable, "-m", "placement.tracegen", "--jobs", "50", "--load",
                    "high", "--seed", "5", "-o", str(out)], check=True, cwd=ROOT)
    with open(out, newline="") as fh:
        assert next(csv.reader(fh)) == list(COLUMNS)
    jobs = read_trace(out)
    assert len(jobs) == 50
    assert all(j.job.locality == "none" for j in jobs if j.job.num_gpus <= 4)
