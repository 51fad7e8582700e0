"""The node agent's health signals (#31): NvmlGpus against a fake pynvml built from
what a real H200 answered (tests/fake_nvml.py), the IMEX status, and the other
sources' ``unsupported`` lists. No database, no server: ``Agent.payload()`` is
the heartbeat body as it would be sent."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import agent as agent_module
from fleet.agent import Agent, Client, NvidiaSmiGpus, NvmlGpus, SimulatedGpus
from fleet.agent_signals import SIGNALS, decode_clock_event_reasons, read_imex_status
from tests.fake_nvml import CLUSTER_UUID, PROBE, FakeNvml

ROOT = Path(__file__).resolve().parent.parent
H200_UNSUPPORTED = ["retired_pages", "nvlink_links", "nvlink_fields"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def nvml(monkeypatch, profile: str = "h200", gpus: int = 1) -> FakeNvml:
    fake = FakeNvml(profile, gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def heartbeat(source) -> dict:
    agent = Agent(client=Client("http://rackwise.invalid", "1.s", 1), source=source, interval=1.0)
    agent.imex = lambda: {"status": "unsupported", "detail": "test"}
    return json.loads(json.dumps(agent.payload()))  # what goes on the wire


def test_the_fake_h200_is_what_the_probe_recorded():
    calls = json.loads(PROBE.read_text())["calls"]
    assert not any(calls[f"nvlink{n}_state"]["ok"] for n in range(18))
    assert not calls["retired_pages_pending"]["ok"]
    assert calls["remapped_rows"]["ok"] and calls["pcie_replay"]["ok"] and calls["fabric_info"]["ok"]


def test_the_h200_heartbeat_carries_every_signal_it_supports_and_names_the_rest(monkeypatch):
    nvml(monkeypatch, "h200")

    body = heartbeat(NvmlGpus())

    [gpu] = body["gpus"]
    assert gpu["index"] == 0 and gpu["state"] == "ok" and gpu["xids"] == [] and "error" not in gpu
    assert gpu["temperature_c"] == 39.0
    assert gpu["signals"] == {
        "power_w": 80.7,
        "clock_event_reasons": ["gpu_idle"],
        "ecc": {
            "volatile_corrected": 0,
            "volatile_uncorrected": 0,
            "aggregate_corrected": 0,
            "aggregate_uncorrected": 0,
        },
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "pcie_replay_count": 0,
        "fabric": {
            "cluster_uuid": None,
            "clique_id": 0,
            "state": "not_supported",
            "status": "not_supported",
            "health_mask": 0,
        },
    }
    assert gpu["unsupported"] == H200_UNSUPPORTED
    assert body["imex"] == {"status": "unsupported", "detail": "test"}


def test_a_blackwell_gpu_reports_nvlink_totals_from_field_values_and_its_clique(monkeypatch):
    nvml(monkeypatch, "blackwell", gpus=4)

    body = heartbeat(NvmlGpus())

    assert [g["index"] for g in body["gpus"]] == [0, 1, 2, 3]
    gpu = body["gpus"][2]
    assert gpu["signals"]["nvlink"] == {
        "source": "fields",
        "link_count": 18,
        "crc_flit": 0,
        "replay": 0,
        "recovery": 0,
    }
    assert gpu["signals"]["fabric"] == {
        "cluster_uuid": "6f2c1d7e-9a8b-4c3d-8e7f-605142332415",
        "clique_id": 3,
        "state": "completed",
        "status": "success",
        "health_mask": 0,
    }
    assert gpu["signals"]["fabric"]["cluster_uuid"].replace("-", "") == CLUSTER_UUID.hex()
    assert gpu["signals"]["clock_event_reasons"] == [] and gpu["signals"]["power_w"] == 612.3
    assert gpu["unsupported"] == ["retired_pages", "nvlink_links"]


def test_an_older_gpu_reports_retired_pages_and_per_link_nvlink_counters(monkeypatch):
    fake = nvml(monkeypatch, "older")

    [gpu] = heartbeat(NvmlGpus())["gpus"]

    signals = gpu["signals"]
    assert signals["retired_pages"] == {"single_bit": 1, "double_bit": 0, "pending": False}
    assert signals["clock_event_reasons"] == ["sw_power_cap"]  # through ...ThrottleReasons
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert signals["nvlink"]["source"] == "links"
    assert signals["nvlink"]["links"][5] == {
        "link": 5,
        "active": True,
        "replay": 0,
        "recovery": 0,
        "crc_flit": 5,
        "crc_data": 0,
    }
    assert len(signals["nvlink"]["links"]) == 6
    assert gpu["unsupported"] == ["remapped_rows", "fabric"]
    assert "remapped_rows" not in signals and "fabric" not in signals


def test_rising_counters_and_a_reset_are_sent_as_nvml_gives_them(monkeypatch):
    fake = nvml(monkeypatch, "h200", gpus=2)
    gpus = NvmlGpus()
    sent = []
    # GPU 1: corrected ECC errors climb, then the driver reloads (volatile back to 0).
    for corrected, replays in [(0, 0), (40, 1), (95, 1), (3, 0)]:
        fake.gpus[1].ecc["volatile_corrected"] = corrected
        fake.gpus[1].pcie_replay = replays
        fake.gpus[1].remapped_rows = (0, 1, 1, 0) if corrected == 95 else (0, 1, 0, 0)
        gpu = heartbeat(gpus)["gpus"][1]
        sent.append((gpu["signals"]["ecc"]["volatile_corrected"], gpu["signals"]["pcie_replay_count"]))
        assert gpu["state"] == "ok"  # the server judges counters, not the agent

    assert sent == [(0, 0), (40, 1), (95, 1), (3, 0)]
    assert heartbeat(gpus)["gpus"][0]["signals"]["ecc"]["volatile_corrected"] == 0
    fake.gpus[1].remapped_rows = (0, 1, 1, 0)
    assert heartbeat(gpus)["gpus"][1]["signals"]["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 1,
        "pending": True,
        "failure": False,
    }


def test_a_gpu_lost_in_the_middle_of_a_read_is_failed_and_keeps_what_was_read(monkeypatch):
    fake = nvml(monkeypatch, "h200", gpus=2)
    gpus = NvmlGpus()
    fake.gpus[0].lose_on = "nvmlDeviceGetTotalEccErrors"

    first = heartbeat(gpus)["gpus"]
    calls_after_loss = fake.calls["nvmlDeviceGetPcieReplayCounter"]
    second = heartbeat(gpus)["gpus"]

    lost = first[0]
    assert lost["state"] == "failed" and lost["temperature_c"] is None
    assert "GPU is lost" in lost["error"]
    assert set(lost["signals"]) == {"power_w", "clock_event_reasons"}  # read before the loss
    assert first[1]["state"] == "ok" and len(first[1]["signals"]) == 6  # its neighbour is untouched
    assert second[0]["state"] == "failed" and second[0]["signals"] == {}
    # Nothing more was asked of the lost GPU: only GPU 1 read its PCIe counter again.
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == calls_after_loss + 1


def test_an_unsupported_call_is_not_retried_until_the_reprobe_interval(monkeypatch, clock):
    fake = nvml(monkeypatch, "h200")
    gpus = NvmlGpus(reprobe_s=600, clock=clock)
    heartbeat(gpus)
    first = dict(fake.calls)
    assert first["nvmlDeviceGetNvLinkState"] == 36  # every link, once

    clock.now += 599
    second = heartbeat(gpus)
    again = {name: fake.calls[name] - first.get(name, 0) for name in fake.calls}
    clock.now += 1
    heartbeat(gpus)
    third = {name: fake.calls[name] - first.get(name, 0) - again.get(name, 0) for name in fake.calls}

    assert second["gpus"][0]["unsupported"] == H200_UNSUPPORTED
    for unsupported in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetFieldValues", "nvmlDeviceGetRetiredPages"):
        assert again.get(unsupported, 0) == 0, unsupported
    assert again["nvmlDeviceGetPowerUsage"] == 1 and again["nvmlDeviceGetTotalEccErrors"] == 4
    # Ten minutes on, NVML is asked again (a driver update may have brought support).
    assert third["nvmlDeviceGetNvLinkState"] == 36 and third["nvmlDeviceGetFieldValues"] == 1


def test_a_call_that_starts_answering_after_a_reprobe_is_reported(monkeypatch, clock):
    fake = nvml(monkeypatch, "h200")
    gpus = NvmlGpus(reprobe_s=60, clock=clock)
    assert "pcie_replay_count" in heartbeat(gpus)["gpus"][0]["signals"]
    fake.gpus[0].pcie_replay = None
    assert heartbeat(gpus)["gpus"][0]["unsupported"] == [
        "retired_pages",
        "pcie_replay_count",
        *H200_UNSUPPORTED[1:],
    ]
    fake.gpus[0].pcie_replay = 7

    assert "pcie_replay_count" not in heartbeat(gpus)["gpus"][0]["signals"]  # still believed
    clock.now += 60
    gpu = heartbeat(gpus)["gpus"][0]
    assert gpu["signals"]["pcie_replay_count"] == 7 and gpu["unsupported"] == H200_UNSUPPORTED


def test_a_signal_that_fails_otherwise_is_named_in_the_error_and_hides_nothing_else(monkeypatch):
    fake = nvml(monkeypatch, "h200")
    fake.gpus[0].failing["nvmlDeviceGetPowerUsage"] = fake.NVMLError_Unknown()
    gpus = NvmlGpus()

    [gpu] = heartbeat(gpus)["gpus"]

    assert gpu["state"] == "ok" and gpu["error"] == "NVML: power_w: Unknown Error"
    assert "power_w" not in gpu["signals"] and "power_w" not in gpu["unsupported"]
    assert {"clock_event_reasons", "ecc", "remapped_rows", "pcie_replay_count", "fabric"} <= set(
        gpu["signals"]
    )
    # Not "not supported": asked again on the next read.
    del fake.gpus[0].failing["nvmlDeviceGetPowerUsage"]
    assert heartbeat(gpus)["gpus"][0]["signals"]["power_w"] == 80.7


def test_fabric_info_falls_back_to_the_older_struct_and_call(monkeypatch):
    fake = nvml(monkeypatch, "blackwell", gpus=2)
    fake.gpus[0].fabric_versions = (fake.nvmlGpuFabricInfo_v2,)  # a driver that predates v3
    fake.nvmlDeviceGetGpuFabricInfoV = None  # type: ignore[assignment,method-assign]  # an older pynvml
    gpus = NvmlGpus()

    first = heartbeat(gpus)["gpus"][0]["signals"]["fabric"]

    assert first["clique_id"] == 3 and first["state"] == "completed"
    assert first["health_mask"] is None  # the unversioned struct has none
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 2


def test_fabric_info_uses_the_newest_struct_the_driver_accepts(monkeypatch):
    fake = nvml(monkeypatch, "blackwell")
    fake.gpus[0].fabric_versions = (fake.nvmlGpuFabricInfo_v2,)
    gpus = NvmlGpus()

    heartbeat(gpus)
    heartbeat(gpus)

    assert heartbeat(gpus)["gpus"][0]["signals"]["fabric"]["health_mask"] == 0
    # v3 refused once (version mismatch), then v2 every time.
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 4


def test_xids_still_come_with_the_signals(monkeypatch):
    fake = nvml(monkeypatch, "blackwell", gpus=2)
    gpus = NvmlGpus()
    fake.events = [(1, 94)]

    body = heartbeat(gpus)

    assert body["gpus"][1]["xids"] == [94] and body["gpus"][1]["state"] == "degraded"
    assert len(body["gpus"][1]["signals"]) == 7


def test_clock_event_reasons_are_decoded_by_name():
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x1 | 0x40 | 0x100) == [
        "gpu_idle",
        "hw_thermal_slowdown",
        "display_clock_setting",
    ]
    assert decode_clock_event_reasons(0x1FF) == [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    ]


# --- IMEX ------------------------------------------------------------------------------


def fake_imex_ctl(directory: Path, script: str) -> None:
    path = directory / "nvidia-imex-ctl"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ('[ "$1" = -q ] && echo READY', {"status": "ready", "detail": "READY"}),
        ("echo WAITING_FOR_PEERS", {"status": "not_ready", "detail": "WAITING_FOR_PEERS"}),
        ("echo UNAVAILABLE", {"status": "unavailable", "detail": "UNAVAILABLE"}),
        (
            "echo 'cannot connect to the IMEX daemon' >&2; exit 1",
            {"status": "unavailable", "detail": "nvidia-imex-ctl -q: cannot connect to the IMEX daemon"},
        ),
    ],
)
def test_the_imex_status_comes_from_nvidia_imex_ctl(tmp_path, monkeypatch, script, expected):
    fake_imex_ctl(tmp_path, script)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    assert read_imex_status() == expected


def test_a_hung_nvidia_imex_ctl_costs_the_timeout_and_no_more(tmp_path, monkeypatch):
    fake_imex_ctl(tmp_path, "exec sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    started = time.monotonic()
    status = read_imex_status(timeout=0.3)

    assert time.monotonic() - started < 5
    assert status == {"status": "unavailable", "detail": "nvidia-imex-ctl -q did not answer within 0.3s"}


def test_without_nvidia_imex_ctl_the_imex_status_is_unsupported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    assert read_imex_status()["status"] == "unsupported"
    agent = Agent(client=Client("http://rackwise.invalid", "1.s", 1), source=SimulatedGpus(1), interval=1.0)
    assert agent.payload()["imex"]["status"] == "unsupported"


# --- the other sources -----------------------------------------------------------------


def test_the_nvidia_smi_source_says_it_sees_none_of_the_signals(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 38, 00000000:18:00.0'\n")
    smi.chmod(0o755)

    [gpu] = heartbeat(NvidiaSmiGpus(str(smi)))["gpus"]

    assert gpu["temperature_c"] == 38.0 and gpu["signals"] == {} and gpu["unsupported"] == list(SIGNALS)


def test_simulated_gpus_send_healthy_signals_and_trouble_on_demand():
    source = SimulatedGpus(4, seed=7, trouble={1: "ecc", 2: "remap"})
    bodies = [heartbeat(source) for _ in range(5)]

    corrected = [b["gpus"][1]["signals"]["ecc"]["volatile_corrected"] for b in bodies]
    assert corrected == sorted(corrected) and corrected[-1] - corrected[0] >= 80
    healthy = [b["gpus"][0]["signals"]["ecc"]["volatile_corrected"] for b in bodies]
    assert healthy == sorted(healthy) and healthy[-1] <= 2
    assert bodies[-1]["gpus"][2]["signals"]["remapped_rows"]["pending"] is True
    assert bodies[-1]["gpus"][3]["signals"]["fabric"]["state"] == "completed"
    assert all(g["unsupported"] == ["retired_pages", "nvlink_links"] for g in bodies[-1]["gpus"])
    source.trouble[2] = "thermal"
    assert "hw_thermal_slowdown" in heartbeat(source)["gpus"][2]["signals"]["clock_event_reasons"]


def test_trouble_needs_simulate_and_a_known_kind():
    args, _ = agent_module.parse_args(
        ["--server", "http://x", "--token", "1.s", "--simulate", "--trouble", "1:ecc"]
    )
    assert args.trouble == {1: "ecc"}
    with pytest.raises(SystemExit) as exc:
        agent_module.parse_args(["--server", "http://x", "--token", "1.s", "--trouble", "1:ecc"])
    assert exc.value.code == agent_module.EXIT_USAGE
    with pytest.raises(SystemExit):
        agent_module.parse_args(
            ["--server", "http://x", "--token", "1.s", "--simulate", "--trouble", "1:fire"]
        )


def test_the_agent_and_its_signals_import_no_django():
    code = "import sys, fleet.agent; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
