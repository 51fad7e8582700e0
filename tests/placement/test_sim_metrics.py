"""The simulator's fairness metrics on small hand-made traces, values worked by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from placement.model import JobRequest
from placement.sim.cli import JSON_KEYS, table
from placement.sim.simulation import SIZE_CLASSES, SimConfig, Simulation, simulate, size_class
from placement.sim.trace import TraceJob

ROOT = Path(__file__).resolve().parents[2]


def _trace(*rows: tuple[str, float, float, int, dict[str, Any]]) -> list[TraceJob]:
    return [
        TraceJob(JobRequest(jid, num_gpus=g, submit_time=sub, expected_duration=dur, **kw), sub, dur, i + 2)
        for i, (jid, sub, dur, g, kw) in enumerate(rows)
    ]


def _cfg(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "racks": 1,
        "nodes_per_rack": 2,
        "gpus_per_node": 4,
        "node_mtbf_hours": 0.0,
        "spare_nodes": 0,
        "check_invariants": True,
    }
    return SimConfig(**{**base, **kw})


def test_size_classes_follow_nodes_of_the_fleet_shape() -> None:
    def cls(g: int) -> str:
        return size_class(JobRequest("j", num_gpus=g), 4, 18)

    assert [cls(g) for g in (1, 2, 4, 5, 32, 33, 72, 73, 256)] == [
        "1gpu",
        "1node",
        "1node",
        "2-8nodes",
        "2-8nodes",
        "9-18nodes",
        "9-18nodes",
        "multirack",
        "multirack",
    ]
    # num_nodes x gpus_per_node: a 1-node gang is a whole node, not a shared one.
    assert size_class(JobRequest("j", num_nodes=1, gpus_per_node=4), 4, 18) == "1node"
    assert size_class(JobRequest("j", num_nodes=20, gpus_per_node=4), 4, 18) == "multirack"


def test_weighted_wait_bounded_slowdown_useful_utilization_and_sizes() -> None:
    # 8 GPUs. a (8 GPUs, 1000 s) starts at 0; b (1 GPU, 100 s) waits until 1000.
    trace = _trace(("a", 0, 1000, 8, {}), ("b", 0, 100, 1, {}))
    m = simulate(trace, "first-fit", _cfg()).metrics
    assert m["mean_wait_s"] == 500
    # (0 x 8000 + 1000 x 100) / 8100 GPU-seconds asked.
    assert m["gpu_hour_weighted_wait_s"] == pytest.approx(100000 / 8100, abs=1e-5)
    # a: 1000/1000 = 1; b: (1000 + 100) / max(100, 600) = 1.8333.
    assert m["bounded_slowdown_mean"] == pytest.approx((1 + 1100 / 600) / 2, abs=1e-5)
    # 8100 useful GPU-seconds over 8 GPUs x 1100 s.
    assert m["useful_utilization"] == pytest.approx(8100 / 8800, abs=1e-5)
    assert list(m["p95_wait_s_by_size"]) == list(SIZE_CLASSES)
    assert m["p95_wait_s_by_size"] == {
        "1gpu": 1000,
        "1node": 0,
        "2-8nodes": 0,
        "9-18nodes": 0,
        "multirack": 0,
    }
    assert m["max_wait_s_by_size"]["1gpu"] == 1000
    assert m["gpu_hours_lost"] == {"span_slowdown": 0, "failures": 0, "migrations": 0}
    assert set(JSON_KEYS) <= set(m)


def test_bounded_slowdown_never_goes_below_one() -> None:
    m = simulate(_trace(("a", 0, 60, 1, {})), "first-fit", _cfg()).metrics
    assert m["bounded_slowdown_mean"] == 1.0  # 60 / 600 would be 0.1


def test_p95_and_max_by_size_over_twenty_waits() -> None:
    # One 4-GPU node, busy 100 s per job: job i waits 100 * i; 20 jobs.
    trace = _trace(*[(f"j{i:02d}", 0, 100, 4, {}) for i in range(20)])
    m = simulate(trace, "first-fit", _cfg(nodes_per_rack=1)).metrics
    # p95 of 0..1900 step 100 (nearest rank, ceil(0.95 x 20) = 19th): 1800; max 1900.
    assert m["p95_wait_s_by_size"]["1node"] == 1800
    assert m["max_wait_s_by_size"]["1node"] == 1900
    assert m["p99_wait_s_by_size"]["1node"] == 1900  # ceil(0.99 x 20) = 20th
    # The last job waited 1900 s for a 100 s run: (1900 + 100) / max(100, 600).
    assert m["max_slowdown_by_size"]["1node"] == pytest.approx(2000 / 600, abs=1e-5)
    assert m["max_slowdown_by_size"]["1gpu"] == 1.0  # an empty class


def test_span_slowdown_is_lost_gpu_hours() -> None:
    # 2 racks x 2 nodes. x holds rack 0 node 0; first-fit puts the 2-node y on rack 0
    # node 1 + rack 1 node 0: two racks for a one-rack job, speed 0.57.
    trace = _trace(("x", 0, 10000, 1, {}), ("y", 0, 570, 8, {"locality": "none"}))
    m = simulate(trace, "first-fit", _cfg(racks=2)).metrics
    assert m["rack_local_fraction"] == 0.0
    # y runs 570 / 0.57 = 1000 s on 8 GPUs, 43% of it lost.
    assert m["gpu_hours_lost"]["span_slowdown"] == pytest.approx(8 * 1000 * 0.43 / 3600, abs=1e-5)


def test_a_segmented_gang_needs_racks_by_its_segments() -> None:
    # 36 nodes in segments of 16 need 3 racks of 18 (16 + 16 + 4), not ceil(36/18) = 2:
    # running on 3 is not spanning, no slowdown, no excess rack.
    trace = _trace(("g", 0, 1000, 144, {"segment_nodes": 16, "locality": "required"}))
    m = simulate(trace, "rackwise", _cfg(racks=3, nodes_per_rack=18)).metrics
    assert m["completed"] == 1
    assert m["mean_jct_s"] == 1000
    assert m["excess_racks_mean"] == 0
    assert m["gpu_hours_lost"]["span_slowdown"] == 0


class _Faults:
    """A failure sequence by hand: one failure at ``at`` on a node the job holds."""

    def __init__(self, sim: Simulation, at: float) -> None:
        self.sim, self.at = sim, at

    def expovariate(self, _rate: float) -> float:
        at, self.at = self.at, 1e15
        return at

    def randrange(self, n: int) -> int:
        return next(i for i, nid in enumerate(self.sim.node_ids) if self.sim.fleet.nodes[nid].jobs)


def _fail_once(policy: str, **kw: Any) -> dict[str, Any]:
    # 1 rack x 3 nodes; a 2-node job (8 GPUs, 7200 s) fails at 4000 s: a checkpoint at
    # 3600 s is kept, 400 s lost, and the restart costs 600 s.
    trace = _trace(("a", 0, 7200, 8, {"locality": "none"}))
    sim = Simulation(trace, policy, _cfg(nodes_per_rack=3, node_mtbf_hours=1.0, **kw))
    sim.fail_rng = _Faults(sim, 4000.0)  # type: ignore[assignment]
    return sim.run().metrics


def test_a_requeue_waits_the_relaunch_delay_an_in_place_swap_does_not() -> None:
    requeued = _fail_once("slurm-block")
    assert requeued["requeues"] == 1 and requeued["failures"] == 1
    # Back at 4000 + 120, then 600 s restart + the 3600 s left.
    assert requeued["mean_jct_s"] == 4120 + 600 + 3600
    assert requeued["mean_wait_s"] == 0  # wait is to the first start
    swapped = _fail_once("kueue-tas")
    assert swapped["requeues"] == 0 and swapped["in_place_recoveries"] == 1
    assert swapped["mean_jct_s"] == 4000 + 600 + 3600
    # Lost either way: 8 GPUs x (400 s since the checkpoint + 600 s restart).
    for m in (requeued, swapped):
        assert m["gpu_hours_lost"]["failures"] == pytest.approx(8 * 1000 / 3600, abs=1e-5)
        assert m["gpu_hours_lost"]["span_slowdown"] == 0


def test_the_relaunch_delay_is_a_setting() -> None:
    assert SimConfig().requeue_delay_s == 120
    assert _fail_once("slurm-block", requeue_delay_s=0)["mean_jct_s"] == 4000 + 600 + 3600
    assert _fail_once("slurm-block", requeue_delay_s=1000)["mean_jct_s"] == 5000 + 600 + 3600


def test_the_table_shows_the_headline_set() -> None:
    trace = _trace(("a", 0, 1000, 8, {}), ("b", 0, 100, 1, {}))
    m = simulate(trace, "first-fit", _cfg()).metrics
    out = table([m])
    for head in ("JCT s", "GPU-h wait s", "bsld", "worst p95 s", "rack-local", "useful util"):
        assert head in out
    assert "1000 (1gpu)" in out


def _bench_on_small_traces(tmp_path: Path) -> Any:
    """benchmarks/bench_real_traces.py, loaded, and two small traces in ``tmp_path``."""
    spec = importlib.util.spec_from_file_location(
        "bench_real_traces", ROOT / "benchmarks" / "bench_real_traces.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name, rows in (
        ("a", [(0, 3600, 8), (10, 600, 1), (2592000, 7200, 64)]),
        ("b", [(0, 100, 1), (5, 100, 2), (86400, 100, 4)]),
    ):
        (tmp_path / f"{name}.csv").write_text(
            "job_id,submit_time,duration,num_gpus\n"
            + "".join(f"{name}{i},{s},{d},{g}\n" for i, (s, d, g) in enumerate(rows))
        )
    return bench


def test_the_real_trace_benchmark_runs_on_small_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench_on_small_traces(tmp_path)
    assert bench.main(["--traces", str(tmp_path), "--workers", "1", "--seeds", "1", "--mtbfs", "2000"]) == 0
    out = capsys.readouterr().out
    # 2 traces x 2 scales x 2 loads, but at this tiny demand both loads give the
    # 2-rack floor (a x4: the 4 racks its 256-GPU job needs): one cell each.
    assert "## Geometric means over 4 cells" in out
    assert out.count("\n| a | x") == 2 and out.count("\n| b | x") == 2
    assert "| a | x4 | moderate | 4 |" in out and "a x4 high = moderate (4 racks)" in out
    # The pairwise size-class table: one row per policy, counts out of the 4 cells.
    table = out.split("whose p95 wait is above 1.05x the column's:", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:4]
    assert [r.split(" | ")[0] for r in rows] == ["| rackwise", "| slurm-block", "| kueue-tas"]
    for i, row in enumerate(rows):
        cells = row.strip("| ").split(" | ")[1:]
        assert cells[i] == "-" and all(0 <= int(c) <= 4 for j, c in enumerate(cells) if j != i)


def test_the_shared_fleet_report_reads_three_tails_per_size_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench_on_small_traces(tmp_path)
    args = ["--traces", str(tmp_path), "--workers", "1", "--seeds", "1", "--mtbfs", "2000", "--tenants"]
    assert bench.main([*args, "--min-class-jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "## Geometric means over 4 cells" in out
    for name in ("max wait", "p99 wait", "max slowdown"):
        assert f"| per-size-class {name} (worst class of each cell; " in out
    # Each policy against the better of the other two, for each tail.
    table = out.split("each policy against the better of the other two", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 9 and all(r.endswith(" of 4 |") for r in rows)


@pytest.mark.parametrize("policy", ["rackwise", "slurm-block", "kueue-tas", "first-fit"])
def test_held_gpu_time_is_useful_work_plus_the_losses(policy: str) -> None:
    # Every job completes and holds exactly its GPUs (powers of two), so GPU-seconds
    # held = useful + span slowdown + failures + migrations, to rounding.
    from placement.sim.tracegen import generate

    rows = generate(400, 0.95, racks=4, seed=1)
    trace = _trace(
        *[
            (
                str(r["job_id"]),
                float(r["submit_time"]),
                float(r["duration"]),  # type: ignore[arg-type]
                int(r["num_gpus"]),
                {"locality": r["locality"]},
            )  # type: ignore[call-overload]
            for r in rows
        ]
    )
    cfg = SimConfig(
        racks=4, node_mtbf_hours=300, seed=3, defrag_after_s=1800 if policy == "rackwise" else None
    )
    m = simulate(trace, policy, cfg).metrics
    assert m["completed"] == 400 and m["failures"] > 0
    gpus_x_span = 4 * 18 * 4 * m["makespan_s"]
    lost = m["gpu_hours_lost"]
    assert (m["gpu_utilization"] - m["useful_utilization"]) * gpus_x_span == pytest.approx(
        sum(lost.values()) * 3600, rel=1e-3, abs=50
    )
    if policy == "rackwise":
        assert m["migrations"] > 0 and lost["migrations"] > 0
    else:
        assert lost["migrations"] == 0
    if policy == "first-fit":
        assert lost["span_slowdown"] > 0
