"""Synthetic traces: format, determinism, load level and size mix."""

from __future__ import annotations

import csv
import itertools
import subprocess
import sys
from pathlib import Path

from placement.sim.trace import COLUMNS, read_trace
from placement.sim.tracegen import ITP, SIZE_MIX, generate

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
    subprocess.run(
        [
            sys.executable,
            "-m",
            "placement.sim.tracegen",
            "--jobs",
            "50",
            "--load",
            "high",
            "--seed",
            "5",
            "-o",
            str(out),
        ],
        check=True,
        cwd=ROOT,
    )
    with open(out, newline="") as fh:
        assert next(csv.reader(fh)) == list(COLUMNS)
    jobs = read_trace(out)
    assert len(jobs) == 50
    assert all(j.job.locality == "none" for j in jobs if j.job.num_gpus <= 4)


def test_the_itp_preset_follows_the_itp_size_mix_durations_and_bursts() -> None:
    rows = generate(6000, 0.7, racks=4, seed=1, preset="itp")
    assert generate(300, 0.7, racks=4, seed=1, preset="itp") == generate(
        300, 0.7, racks=4, seed=1, preset="itp"
    )
    sizes = [int(r["num_gpus"]) for r in rows]  # type: ignore[call-overload]
    assert set(sizes) <= set(ITP.mix)
    assert 0.87 < sizes.count(1) / len(sizes) < 0.91  # 89.3% single GPUs in ITP
    durations = sorted(float(r["duration"]) for r in rows)  # type: ignore[arg-type]
    assert 0.85 * 9744 < durations[len(durations) // 2] < 1.15 * 9744
    t = [float(r["submit_time"]) for r in rows]  # type: ignore[arg-type]
    gaps = [b - a for a, b in itertools.pairwise(t)]
    assert 0.12 < sum(g == 0 for g in gaps) / len(gaps) < 0.18  # batches: 14.8% zero gaps
    nz = [g for g in gaps if g > 0]
    mean = sum(nz) / len(nz)
    cv = (sum((g - mean) ** 2 for g in nz) / len(nz)) ** 0.5 / mean
    assert cv > 2.5  # far burstier than Poisson (1.0); ITP's is 4.8
    work = sum(
        s * d
        for s, d in zip(
            sizes,
            [float(r["duration"]) for r in rows],  # type: ignore[arg-type]
            strict=True,
        )
    )
    assert 0.5 < work / (t[-1] * 4 * 18 * 4) < 0.95  # the load asked for, within the bursts
    # Bare rows like the real traces: no locality, priority, preemptible or tenant.
    assert set(rows[0]) == {"job_id", "submit_time", "duration", "num_gpus"}


def test_the_cli_mix_itp_writes_a_readable_bare_trace(tmp_path: Path) -> None:
    out = tmp_path / "itp.csv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "placement.sim.tracegen",
            "--jobs",
            "200",
            "--mix",
            "itp",
            "--racks",
            "4",
            "--seed",
            "2",
            "-o",
            str(out),
        ],
        check=True,
        cwd=ROOT,
    )
    jobs = read_trace(out)
    assert len(jobs) == 200 and max(j.job.num_gpus for j in jobs) <= 64


def test_the_default_mix_is_unchanged_by_the_presets() -> None:
    assert generate(100, 0.6, seed=4) == generate(100, 0.6, seed=4, preset="default")
