"""A node's health signals as its agent last read them, with counter rates and
the samples sparklines draw (``GET /api/nodes/<id>/signals/``, the rack page)."""

from __future__ import annotations

from django.utils import timezone

from fleet import gpu_signals as signals
from fleet.models import GPU, GpuReading, Node, NodeReading
from fleet.services.read.fabric import node_mismatch

# Windows the rates are given over (seconds), by name.
RATE_WINDOWS = {"10m": 600.0, "1h": 3600.0, "24h": 86400.0}


def gpu_signals(reading: GpuReading | None, now: float) -> dict | None:
    if reading is None:
        return None
    state = reading.state or {}
    counters = state.get("counters", {})
    return {
        "read_at": reading.read_at,
        "temperature_c": reading.temperature_c,
        "signals": reading.signals,
        "unsupported": reading.unsupported,
        "counters": {
            name: {
                "value": c["last"],
                "resets": c["resets"],
                "per_hour": {
                    w: _round(signals.rate_per_hour(state, name, s, now)) for w, s in RATE_WINDOWS.items()
                },
            }
            for name, c in sorted(counters.items())
        },
        # The last hour, a sample a minute: [epoch s, temperature C, power W].
        "samples": [[s[0], s[2], s[3]] for s in state.get("minutes", [])],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def node_signals(node_id: int) -> dict:
    """The node's readings, and ``fabric_mismatch``: how the fabric its GPUs
    report disagrees with its rack's (fleet.fabric_identity), or None."""
    now = timezone.now().timestamp()
    mismatch = node_mismatch(Node.objects.select_related("rack").get(pk=node_id))
    readings = {r.gpu_id: r for r in GpuReading.objects.filter(gpu__node_id=node_id)}
    node = NodeReading.objects.filter(node_id=node_id).first()
    return {
        "node_id": node_id,
        "imex": None if node is None else {"status": node.imex_status, "detail": node.imex_detail},
        "fabric": None
        if node is None
        else {"cluster_uuid": node.fabric_cluster_uuid, "clique_id": node.fabric_clique_id},
        "fabric_mismatch": None if mismatch is None else mismatch.as_dict(),
        "gpus": [
            {"index": gpu.index, "health": gpu.health, "reading": gpu_signals(readings.get(gpu.pk), now)}
            for gpu in GPU.objects.filter(node_id=node_id).order_by("index")
        ],
    }
