"""The simulator CLI contract: JSON keys, determinism, errors with line numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placement.sim.cli import JSON_KEYS
from placement.sim.simulation import SimConfig, simulate
from placement.sim.state import config_overrides
from placement.sim.trace import read_trace, write_trace
from placement.sim.tracegen import generate

ROOT = Path(__file__).resolve().parents[2]
HEADER = "job_id,submit_time,duration,num_gpus,locality,extra\n"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "placement.sim.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    # Rows out of order, an ignored column, a job too big to ever fit.
    path.write_text(
        HEADER + "b,50,600,8,preferred,x\n"
        "a,0,3600,64,required,y\n"
        "c,10,100,1,none,z\n"
        "huge,20,100,100000,none,z\n"
    )
    return path


def test_json_has_exactly_the_contract_keys(tmp_path: Path) -> None:
    res = _run(str(_tiny(tmp_path)), "--racks", "4", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert list(data) == list(JSON_KEYS)
    assert data["jobs"] == 4 and data["completed"] == 3 and data["rejected"] == 1


def test_policy_all_gives_one_object_per_policy_and_a_table(tmp_path: Path) -> None:
    trace = _tiny(tmp_path)
    res = _run(str(trace), "--racks", "4", "--policy", "all", "--json")
    data = json.loads(res.stdout)
    assert [d["policy"] for d in data] == [
        "rackwise",
        "first-fit",
        "random",
        "slurm-block",
        "slurm-block-greedy",
        "kueue-tas",
    ]
    table = _run(str(trace), "--racks", "4", "--policy", "all")
    assert table.returncode == 0 and "kueue-tas" in table.stdout


def test_same_inputs_and_seed_give_the_same_output(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, generate(150, 0.9, racks=4, seed=9))
    args = (str(path), "--racks", "4", "--policy", "all", "--json", "--seed", "3", "--node-mtbf-hours", "300")
    first, second = json.loads(_run(*args).stdout), json.loads(_run(*args).stdout)
    for a, b in zip(first, second, strict=True):
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b
    assert any(d["failures"] for d in first)


def test_a_bad_row_stops_the_run_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "a,0,3600,8,preferred,\nb,5,soon,8,preferred,\n")
    res = _run(str(path))
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "line 3" in lines[0] and "duration" in lines[0]


def test_a_missing_required_column_is_reported_on_line_1(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("job_id,submit_time,num_gpus\na,0,8\n")
    res = _run(str(path))
    assert res.returncode != 0 and "line 1" in res.stderr and "duration" in res.stderr


def test_the_plot_is_written(tmp_path: Path) -> None:
    out = tmp_path / "p.png"
    res = _run(str(_tiny(tmp_path)), "--racks", "4", "--policy", "all", "--plot", str(out))
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 1000


def test_failures_are_recovered_in_place_by_rackwise_and_requeued_by_slurm(tmp_path: Path) -> None:
    rows = generate(300, 0.8, racks=6, seed=4)
    path = tmp_path / "fail.csv"
    write_trace(path, rows)
    trace = read_trace(path)
    cfg = SimConfig(racks=6, node_mtbf_hours=200, seed=1)
    rw = simulate(trace, "rackwise", cfg).metrics
    sb = simulate(trace, "slurm-block", cfg).metrics
    assert rw["failures"] > 0 and sb["failures"] > 0
    assert rw["in_place_recoveries"] > 0
    assert sb["in_place_recoveries"] == 0 and sb["requeues"] > 0
    assert rw["completed"] + rw["rejected"] == rw["jobs"]


def test_defragmentation_migrates_jobs_and_still_completes_them(tmp_path: Path) -> None:
    path = tmp_path / "dense.csv"
    write_trace(path, generate(400, 0.95, racks=4, seed=1))
    trace = read_trace(path)
    off = simulate(trace, "rackwise", SimConfig(racks=4, node_mtbf_hours=0, defrag_after_s=None)).metrics
    on = simulate(trace, "rackwise", SimConfig(racks=4, node_mtbf_hours=0)).metrics
    assert off["migrations"] == 0
    assert on["migrations"] > 0 and on["migration_gpu_hours"] > 0
    assert on["completed"] == on["jobs"] == 400


def test_every_policy_keeps_the_invariants_through_a_replay_with_failures(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, generate(250, 0.9, racks=4, seed=6))
    trace = read_trace(path)
    for policy in ("rackwise", "first-fit", "random", "slurm-block", "slurm-block-greedy", "kueue-tas"):
        cfg = SimConfig(
            racks=4,
            node_mtbf_hours=100,
            repair_hours=2,
            seed=2,
            check_invariants=True,
            defrag_after_s=1800 if policy == "rackwise" else None,
        )
        m = simulate(trace, policy, cfg).metrics  # raises on a broken invariant
        assert m["failures"] > 0
        assert m["completed"] + m["rejected"] == m["jobs"]


def test_a_config_override_reads_literals_and_plain_strings() -> None:
    assert config_overrides(
        ["defrag_after_s=None", "racks=3", "rackwise_queue=greedy", "lookahead=False"]
    ) == {"defrag_after_s": None, "racks": 3, "rackwise_queue": "greedy", "lookahead": False}
    assert SimConfig(**config_overrides(["racks=3"])).racks == 3


def test_a_config_override_names_the_item_that_is_not_a_field() -> None:
    for bad in ("nope=1", "racks", "racks=", "=3"):
        with pytest.raises(ValueError, match=f"--set '{bad}': expected FIELD=VALUE"):
            config_overrides([bad])
