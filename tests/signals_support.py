"""Heartbeats that carry health signals (tests of #31)."""

from __future__ import annotations

import copy

from fleet.models import Node
from fleet.services.intake import health

# What the agent sends for an H200 (../shared/gpu/h200-nvml-probe.json): per-link
# NVLink and retired pages are not supported there.
H200 = {
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
    "nvlink": {"source": "fields", "link_count": 18, "crc_flit": 0, "replay": 0, "recovery": 0},
    "fabric": {
        "cluster_uuid": "6f1e2a9c-0000-4000-8000-000000000001",
        "clique_id": 7,
        "state": "completed",
        "status": "success",
        "health_mask": 0,
    },
}
UNSUPPORTED = ["nvlink_links", "retired_pages"]


def signals_beat(**changes) -> dict:
    gpus = []
    for i in range(4):
        sig = copy.deepcopy(H200)
        for path, value in changes.items():
            group, _, key = path.partition("__")
            if key:
                sig[group][key] = value
            else:
                sig[group] = value
        gpus.append(
            {
                "index": i,
                "state": "ok",
                "xids": [],
                "temperature_c": 40.0 + i,
                "signals": sig,
                "unsupported": UNSUPPORTED,
            }
        )
    return {"agent_version": "test", "gpus": gpus, "imex": {"status": "ready", "detail": "READY"}}


def send_beat(hostname: str, imex: str = "ready", **changes) -> None:
    """That node's agent reports through the API: IMEX status ``imex`` and the
    H200's signals with ``changes`` (``signals_beat``'s)."""
    from tests.test_heartbeats import agent_client, post_beat

    node = Node.objects.get(hostname=hostname)
    payload = signals_beat(**changes)
    payload["imex"] = {"status": imex, "detail": "" if imex == "ready" else "no quorum"}
    client = agent_client(health.issue_agent_token(None, node.pk))
    response = post_beat(client, node, payload)
    assert response.status_code == 200, response.content
