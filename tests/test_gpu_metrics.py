"""Per-GPU health series in /metrics (issue #31): each GPU's latest reading
(temperature, power, ECC, remapped rows, PCIe replays, NVLink errors, clock
events, verdicts) and each rack's fabric state, read back with the official
client's parser; as many series as GPUs that report, whatever their history,
read in a bounded number of queries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from fleet.models import Node, Rack
from fleet.services.intake.health import record_heartbeat
from tests.signals_support import signals_beat
from tests.support import flush_broker
from tests.test_metrics import one, scrape

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_broker():
    flush_broker()
    yield
    flush_broker()


def beat(hostname: str, **changes) -> None:
    record_heartbeat(Node.objects.get(hostname=hostname).pk, signals_beat(**changes))


def test_each_reporting_gpu_has_its_latest_values_labelled_by_rack_node_and_gpu(fleet, default_health_rules):
    beat(
        "r1-n03",
        power_w=412.5,
        ecc__volatile_corrected=7,
        ecc__volatile_uncorrected=1,
        remapped_rows__correctable=2,
        pcie_replay_count=5,
        nvlink={"source": "fields", "link_count": 18, "crc_flit": 30, "replay": 4, "recovery": 1},
        clock_event_reasons=["sw_power_cap", "hw_slowdown"],
    )
    samples = scrape()
    gpu2 = {"rack": "r1", "node": "r1-n03", "gpu": "2"}

    assert one(samples, "rackwise_gpu_temperature_celsius", **gpu2) == 42.0
    assert one(samples, "rackwise_gpu_power_watts", **gpu2) == 412.5
    assert one(samples, "rackwise_gpu_ecc_errors_total", **gpu2, kind="corrected") == 7
    assert one(samples, "rackwise_gpu_ecc_errors_total", **gpu2, kind="uncorrected") == 1
    assert one(samples, "rackwise_gpu_remapped_rows", **gpu2, kind="correctable") == 2
    assert one(samples, "rackwise_gpu_remapped_rows", **gpu2, kind="uncorrectable") == 0
    assert one(samples, "rackwise_gpu_pcie_replays_total", **gpu2) == 5
    nvlink = "rackwise_gpu_nvlink_errors_total"
    assert {k: one(samples, nvlink, **gpu2, kind=k) for k in ("crc_flit", "replay", "recovery")} == {
        "crc_flit": 30,
        "replay": 4,
        "recovery": 1,
    }
    # Active reasons only (1); the others are left out.
    clock = {dict(k)["reason"] for k in samples["rackwise_gpu_clock_event"] if dict(k)["gpu"] == "2"}
    assert clock == {"sw_power_cap", "hw_slowdown"}
    assert set(samples["rackwise_gpu_clock_event"].values()) == {1.0}
    # Uncorrectable ECC drains (a default rule), which outranks the slowdown's suspect.
    assert one(samples, "rackwise_gpu_verdict", **gpu2, verdict="drain") == 1
    # Four GPUs report: four series of temperature, none for the 140 silent ones.
    assert len(samples["rackwise_gpu_temperature_celsius"]) == 4
    assert {dict(k)["node"] for k in samples["rackwise_gpu_power_watts"]} == {"r1-n03"}


def test_the_families_are_typed_as_prometheus_names_them(fleet):
    beat("r1-n00")
    text = Client().get("/metrics").content.decode()
    families = text_string_to_metric_families(text)
    types = {f.name: f.type for f in families if f.name.startswith("rackwise_gpu_")}
    assert types == {
        "rackwise_gpu_temperature_celsius": "gauge",
        "rackwise_gpu_power_watts": "gauge",
        "rackwise_gpu_ecc_errors": "counter",
        "rackwise_gpu_remapped_rows": "gauge",
        "rackwise_gpu_pcie_replays": "counter",
        "rackwise_gpu_nvlink_errors": "counter",
        "rackwise_gpu_clock_event": "gauge",
        "rackwise_gpu_verdict": "gauge",
    }
    assert "the latest reading of each GPU that reports" in text


def test_a_degraded_fabric_is_1_for_its_rack_and_0_for_the_others(fleet):
    Rack.objects.filter(name="r2").update(fabric_degraded="NVLink fabric degraded on 2 of 18 nodes (...)")
    samples = scrape()
    assert one(samples, "rackwise_rack_fabric_degraded", rack="r1") == 0
    assert one(samples, "rackwise_rack_fabric_degraded", rack="r2") == 1


def test_the_gpu_series_cost_two_queries_however_many_gpus_report(fleet):
    from fleet.prometheus import FleetCollector

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            list(FleetCollector()._gpu_health())
        return len(captured)

    beat("r1-n00")
    few = queries()
    for n in range(1, 18):
        beat(f"r2-n{n:02d}")
    assert few == queries() == 2


def test_a_large_fleet_may_leave_the_per_gpu_series_out_and_keep_the_verdicts(
    fleet, settings, default_health_rules
):
    settings.RACKWISE_METRICS_GPU_SERIES = False
    beat("r1-n03", ecc__volatile_uncorrected=1)
    samples = scrape()
    assert not any(name.startswith("rackwise_gpu_") and name != "rackwise_gpu_verdict" for name in samples)
    assert one(samples, "rackwise_gpu_verdict", rack="r1", node="r1-n03", gpu="0", verdict="drain") == 1
    assert one(samples, "rackwise_rack_fabric_degraded", rack="r1") == 0
